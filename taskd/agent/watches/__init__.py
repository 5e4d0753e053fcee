"""What the agent watches in its ranks: hangs and their culprit, how a rank ended, stragglers, metrics."""
