"""The launcher's private run directory (`$TMPDIR/taskd-<job>-*`: heartbeat and error files), and the
removal of those that SIGKILLed agents left behind. The code lives in `taskd.process.run_dir`: the
agent under msrun makes its heartbeat directory the same way (and the agent may not import the launcher).
"""

from taskd.process.run_dir import OWNER_FILE, PREFIX, make_run_dir, owner_alive, owner_record, sweep_stale_run_dirs

__all__ = ["OWNER_FILE", "PREFIX", "make_run_dir", "owner_alive", "owner_record", "sweep_stale_run_dirs"]
