"""Moved to :mod:`taskd.process` (groups, msrun); kept so existing imports work. Import from taskd.process."""

from taskd.process.groups import (  # noqa: F401
    live_group_members,
    process_group,
    reap_processes,
    signal_groups,
    stop_groups,
    wait_groups_gone,
)
from taskd.process.msrun import msrun_schedulers, restart_msrun_scheduler  # noqa: F401
from taskd.process.spawn import SETPRIV, kill_group  # noqa: F401
