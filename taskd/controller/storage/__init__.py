"""Persistence: the SQLite store, its rows and snapshots, group commit, undo, quotas, a job's stored history."""
