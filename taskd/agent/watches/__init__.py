"""What the agent watches in its ranks: hangs and their culprit, departures, bugs, stragglers, metrics."""
