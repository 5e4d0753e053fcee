"""Client-side toolkit: the agent's link to the recovery controller (TaskD's `toolkit` layout)."""
