"""msrun's launcher contract: the four callbacks a launcher registers with the agent, and MONITOR's statuses.

MindSpore's msrun serves them to `MSRunPlugin`; taskd's own launcher (`taskd.launcher`) serves the
same four, and the agent (`taskd.agent`) calls them. Both sides import the names from here so they
cannot drift apart, and neither has to import the other.
"""

from __future__ import annotations

KILL_WORKER = "KILL_WORKER"  # KILL_WORKER([pid, ...]) or ([-1]) for every rank
START_ALL_WORKER = "START_ALL_WORKER"  # START_ALL_WORKER() -> 0 on success
START_WORKER_LIST = "START_WORKER_LIST"  # START_WORKER_LIST([local_rank, ...]) -> 0 on success
MONITOR = "MONITOR"  # MONITOR([local_rank, ...] or [-1]) -> {local_rank: {"pid", "status", "global_rank", ...}}

CALLBACKS = (KILL_WORKER, START_ALL_WORKER, START_WORKER_LIST, MONITOR)

# MONITOR statuses, as msrun reports them.
STATUS_RUNNING = None
STATUS_OK = 0
STATUS_FAILED = 300  # any non-zero exit or a signal
STATUS_NOT_STARTED = 200
