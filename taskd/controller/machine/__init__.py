"""The per-job state machine, pure: its words, events, transition table, handlers, strategy, a job and its agents."""
