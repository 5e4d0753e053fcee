"""What the agent may ask of a launcher beyond msrun's four callbacks: the declared interface.

The agent starts, watches and stops ranks through the four callbacks (KILL_WORKER, START_ALL_WORKER,
START_WORKER_LIST, MONITOR) whoever launched them. Everything else it reads or sets on a launcher is
listed here, in `Launcher`, and nowhere else: a launcher author reads this one class to know what to
provide, and the agent never probes (`hasattr`) for a member. Two launchers satisfy it:

- taskd's `LocalLauncher` (taskd run), which names each rank's files and takes the job's restart
  count, group generation and (for a standby) its node rank;
- msrun, which hands the agent only its callbacks: the agent then uses `MsrunLauncher`, a null
  object whose answers say "msrun does not tell" (None, [], False) and whose setters do nothing
  msrun could use (msrun sets its ranks' environment itself).

The protocol lives with the agent, its consumer, not with the launcher: taskd.launcher is a lower
layer that never imports the agent, and satisfies this structurally (tests/unit/agent/ranks/test_launcher_api.py
checks both launchers against it, member by member).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Launcher(Protocol):
    """A launcher's extras, as the agent uses them; every member is required (see MsrunLauncher for "none")."""

    @property
    def rank_files(self) -> bool:
        """True when the launcher names each rank's heartbeat and log file (taskd's); False under msrun, where the
        agent exports a heartbeat directory (TASKD_HEARTBEAT_DIR) and reads msrun's worker_<rank>.log."""
        ...

    @property
    def live_recovery(self) -> bool:
        """Whether ranks run with live recovery (a store that outlives them, a control file)."""
        ...

    @property
    def rank_declarations(self) -> bool:
        """Whether ranks are expected to declare what they can do in place (recover offered only to those that did)."""
        ...

    def control_path(self) -> str | None:
        """The node's live-recovery control file (TASKD_CONTROL_FILE); None when live recovery is off."""
        ...

    def returncode(self, local_rank: int) -> int | None:
        """The exit code of the rank's current incarnation (-N for signal N); None while it runs or if unknown."""
        ...

    def tail_log(self, local_rank: int, n: int = 20) -> list[str]:
        """The last `n` output lines of the rank's current incarnation (its traceback, for the summary)."""
        ...

    def error_report(self, local_rank: int) -> Any | None:
        """What the rank recorded with torch's @record (exception, traceback, timestamp), else None."""
        ...

    def heartbeat_path(self, local_rank: int) -> str | None:
        """The rank's heartbeat file (TASKD_HEARTBEAT_FILE), None when the launcher names none."""
        ...

    def log_path(self, local_rank: int) -> str | None:
        """The rank's log file (where its stacks are dumped on a hang), None when there is none."""
        ...

    def set_restart_count(self, count: int) -> None:
        """The job-wide restart count ranks started from now on get (TORCHELASTIC_RESTART_COUNT)."""
        ...

    def set_generation(self, generation: int) -> None:
        """The live group generation ranks started from now on join (TASKD_GENERATION)."""
        ...

    def prepare_replacement(self, local_rank: int, after_generation: int) -> bool:
        """Live: start the dead rank's replacement now, from a warm spare, to join the first generation named above
        `after_generation`; its START adopts it. False when the launcher cannot (no spare, no live recovery)."""
        ...

    def discard_prepared(self) -> None:
        """Kill the prepared replacements: the round starts none of them into a rejoin."""
        ...

    def prepare_successor(self, local_rank: int, after_generation: int) -> tuple[str, int] | None:
        """A planned migration: a warm spare becomes the running rank's successor, joining the first generation
        named above `after_generation`; (the heartbeat file it writes until adopted, its pid). None: cannot."""
        ...

    def adopt_successor(self, local_rank: int) -> int | None:
        """The successor becomes the rank's current process (its heartbeat file moved to the rank's); its pid."""
        ...

    def discard_successor(self, local_rank: int) -> None:
        """Kill the successor of a migration called off."""
        ...

    def set_node_rank(self, node_rank: int | None) -> None:
        """A standby's late node rank: every per-rank variable (RANK, GROUP_RANK, ...) is computed for it from now
        on; None: no node rank any more (an agent that became a standby, agent/link/registration.py). Raises
        `NodeRankFixed` on a launcher whose node rank cannot change (msrun's is its --node_rank)."""
        ...


    def set_node_count(self, count: int) -> None:
        """The nodes the job runs on now (a `--nnodes MIN:MAX` job started with nodes 0..count-1): the next ranks
        started get WORLD_SIZE and GROUP_WORLD_SIZE for `count` nodes; their global ranks do not change."""
        ...


class NodeRankFixed(RuntimeError):
    """The launcher cannot take a node rank late (msrun): a standby needs taskd run."""


class MsrunLauncher:
    """msrun's side of `Launcher`: it hands the agent only its four callbacks, so every extra is "not known".

    msrun gives its ranks their environment itself: a restart count, generation or node rank set
    here would reach no rank, so the setters record nothing (a node rank cannot change at all).
    """

    rank_files = False
    live_recovery = False
    rank_declarations = False

    def control_path(self) -> str | None:
        return None

    def returncode(self, local_rank: int) -> int | None:
        return None

    def tail_log(self, local_rank: int, n: int = 20) -> list[str]:
        return []

    def error_report(self, local_rank: int) -> Any | None:
        return None

    def heartbeat_path(self, local_rank: int) -> str | None:
        return None

    def log_path(self, local_rank: int) -> str | None:
        return None

    def set_restart_count(self, count: int) -> None:
        return None

    def set_generation(self, generation: int) -> None:
        return None

    def prepare_replacement(self, local_rank: int, after_generation: int) -> bool:
        return False

    def discard_prepared(self) -> None:
        return None

    def prepare_successor(self, local_rank: int, after_generation: int) -> tuple[str, int] | None:
        return None

    def adopt_successor(self, local_rank: int) -> int | None:
        return None

    def discard_successor(self, local_rank: int) -> None:
        return None

    def set_node_count(self, count: int) -> None:
        return None  # msrun sets its ranks' world size itself

    def set_node_rank(self, node_rank: int | None) -> None:
        raise NodeRankFixed(f"msrun's node rank is fixed by its --node_rank: to take over node {node_rank}, start "
                            f"msrun with --node_rank {node_rank} (a standby needs `taskd run --standby`)")


MSRUN = MsrunLauncher()


def launcher_of(details: Launcher | None) -> Launcher:
    """The launcher the agent talks to: the one handed in (taskd run), else msrun's null object."""
    return MSRUN if details is None else details


__all__ = ["MSRUN", "Launcher", "MsrunLauncher", "NodeRankFixed", "launcher_of"]
