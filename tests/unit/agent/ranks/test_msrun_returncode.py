"""The exit code of a rank that msrun's MONITOR reaped before the agent's peek (issue 37, D2)."""

from __future__ import annotations

from dataclasses import dataclass, field

from taskd.agent.ranks.control import popen_returncode


@dataclass
class Reaped:
    """What subprocess.Popen keeps after poll() reaped the child: its pid and its code."""

    pid: int
    returncode: int | None


@dataclass
class ProcessManager:
    """The shape of msrun 2.10's _ProcessManager that matters: proc_rank_map and the bound MONITOR method."""

    proc_rank_map: dict[int, Reaped] = field(default_factory=dict)

    def monitor_rank_status(self, local_ranks: list[int]) -> dict:
        return {r: {"pid": p.pid, "status": 300} for r, p in self.proc_rank_map.items()}


def test_the_code_msruns_popen_keeps_is_read_for_the_ranks_own_pid() -> None:
    manager = ProcessManager({0: Reaped(100, 0), 1: Reaped(101, -9), 2: Reaped(102, 3)})
    monitor = manager.monitor_rank_status
    assert popen_returncode(monitor, 1, 101) == -9  # SIGKILL, not "exit status unknown"
    assert popen_returncode(monitor, 2, 102) == 3
    assert popen_returncode(monitor, 1, 999) is None  # a newer incarnation's Popen: not this rank's code
    assert popen_returncode(monitor, 5, 105) is None  # no such rank
    manager.proc_rank_map[3] = Reaped(103, None)  # still running
    assert popen_returncode(monitor, 3, 103) is None


def test_a_monitor_that_is_no_bound_method_of_msruns_manager_answers_nothing() -> None:
    assert popen_returncode(lambda ranks: {}, 0, 100) is None  # taskd's own launcher, a test's callbacks
    assert popen_returncode(ProcessManager().monitor_rank_status, 0, 100) is None
