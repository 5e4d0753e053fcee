"""Process utilities shared by the launcher and the agent: spawning, process groups, the subreaper, pidfds.

The one home for them (layers: worker < process < launcher; the agent uses it too). This
package imports nothing of taskd but itself, so any layer above may use it.

- :mod:`taskd.process.spawn`: a rank's own session, its death with the agent, kill_group, wait_exit;
- :mod:`taskd.process.exitcodes`: describe_returncode, exit_code_of;
- :mod:`taskd.process.subreaper`: the child-subreaper flag and the orphans it brings;
- :mod:`taskd.process.groups`: stopping process groups and confirming them gone;
- :mod:`taskd.process.pidfd`: the one pidfd selector loop (ExitSelector, RankWatch);
- :mod:`taskd.process.msrun`: msrun's scheduler process;
- :mod:`taskd.process.tree`: rank_pids, which process under a launcher is which rank.
"""

from taskd.process.exitcodes import describe_returncode, exit_code_of
from taskd.process.groups import (
    live_group_members,
    process_group,
    reap_processes,
    signal_groups,
    stop_groups,
    wait_groups_gone,
)
from taskd.process.msrun import msrun_schedulers, restart_msrun_scheduler
from taskd.process.pidfd import EXIT as EXIT_KIND
from taskd.process.pidfd import READ as READ_KIND
from taskd.process.pidfd import Exit, ExitSelector, RankWatch, Ready, open_pidfd, peek_returncode
from taskd.process.spawn import SETPRIV, has_exited, kill_group, spawn, wait_exit
from taskd.process.subreaper import (
    Orphan,
    acquire_subreaper,
    direct_children,
    escaped_descendants,
    find_orphans,
    is_child_subreaper,
    reap_exact,
    reap_orphan,
    release_subreaper,
    send_signal,
    set_child_subreaper,
    signal_tree,
)
from taskd.process.tree import rank_pids

__all__ = [
    "EXIT_KIND",
    "READ_KIND",
    "SETPRIV",
    "Exit",
    "ExitSelector",
    "Orphan",
    "RankWatch",
    "Ready",
    "acquire_subreaper",
    "describe_returncode",
    "direct_children",
    "escaped_descendants",
    "exit_code_of",
    "find_orphans",
    "has_exited",
    "is_child_subreaper",
    "kill_group",
    "live_group_members",
    "msrun_schedulers",
    "open_pidfd",
    "peek_returncode",
    "process_group",
    "rank_pids",
    "reap_exact",
    "reap_orphan",
    "reap_processes",
    "release_subreaper",
    "restart_msrun_scheduler",
    "send_signal",
    "set_child_subreaper",
    "signal_groups",
    "signal_tree",
    "spawn",
    "stop_groups",
    "wait_exit",
    "wait_groups_gone",
]
