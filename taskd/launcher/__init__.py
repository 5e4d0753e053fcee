"""taskd's local launcher: spawns a node's ranks and serves msrun's four callbacks.

    from taskd.launcher import LocalLauncher, WorkerSpec, command_for

    launcher = LocalLauncher(WorkerSpec(command_for("train.py", ["--steps", "100"]), nproc_per_node=4))
    plugin.register_callbacks(...)  # for name, func in launcher.callbacks().items()
"""

from taskd.callbacks import STATUS_FAILED, STATUS_NOT_STARTED, STATUS_OK, STATUS_RUNNING
from taskd.launcher.local import Incarnation, LocalLauncher
from taskd.launcher.spec import WorkerSpec, WorkerSpecError, command_for, free_port
from taskd.process import describe_returncode, exit_code_of, set_child_subreaper

__all__ = [
    "STATUS_FAILED",
    "STATUS_NOT_STARTED",
    "STATUS_OK",
    "STATUS_RUNNING",
    "Incarnation",
    "LocalLauncher",
    "WorkerSpec",
    "WorkerSpecError",
    "command_for",
    "describe_returncode",
    "exit_code_of",
    "free_port",
    "set_child_subreaper",
]
