"""LiveGroup's half of a planned migration (taskd.worker.migration has the protocol): the step boundary the
ranks agree on, and the leaving rank's hand-off to its successor."""

from __future__ import annotations

import logging
from typing import Any

from taskd.worker import migration
from taskd.worker.env import rank
from taskd.worker.live import Control, Phase
from taskd.worker.torch_group import collect

log = logging.getLogger(__name__)


class Migrating:
    """Mixed into `LiveGroup` (taskd.worker.torch): it uses the group's store, protocol, step and leave."""

    _store: Any
    protocol: Any
    step_no: int
    rank: int
    world_size: int
    _counted: int | None = None  # the migration's generation this rank counted itself in for (migration.boundary)

    def _due(self, control: Control) -> bool:
        """Whether to act on ``control`` at this boundary: at once, but a migration at the boundary the ranks agree
        once every rank has seen it."""
        if control.action != migration.MIGRATE:
            return True
        at = migration.boundary(self._store, control, self.step_no, self.world_size,
                                counted=self._counted == control.generation)
        self._counted = control.generation
        return at is not None and self.step_no >= at

    def _act_on(self, control: Control) -> None:
        """A request at a step boundary: this rank hands off if the migration names it, else re-forms the group."""
        if rank() in migration.leaving(control):  # the rank it was started as (RANK)
            self._hand_off(control)
        else:
            self._recover(None, control)  # type: ignore[attr-defined]

    def _hand_off(self, control: Control) -> None:
        """This rank moves to its successor: leave the group, then exit 0 once the agent says the successor has
        joined (``release``); if the agent calls the migration off (a newer generation), rejoin as itself."""
        self.protocol.set_phase(Phase.PAUSED)
        self._leave(None)  # type: ignore[attr-defined]
        collect()
        if migration.is_node_move(control):  # no agent adopts the successor here: the store says g formed
            answer = migration.await_group(self._store, self.protocol.watch, control.generation, self.world_size,
                                           control.timeout * 2)
        else:
            answer = migration.await_release(self.protocol.watch, control.generation, control.timeout * 2)
        if answer is not None and answer.action == migration.RELEASE:
            log.info("rank %d: handed its place to its successor at step %d; this process exits", self.rank,
                     self.step_no)
            self.close()  # type: ignore[attr-defined]
            self.protocol.set_phase(Phase.COMPLETE)  # its exit 0 is no departure from the group: it was replaced
            raise SystemExit(0)
        if answer is None:  # the agent always answers first; without a word the rank gives up as a paused one does
            self.protocol.set_phase(Phase.GAVE_UP)
            raise migration.MigrationFailed(f"rank {self.rank}: no word from the agent after leaving for generation "
                                            f"{control.generation}")
        log.info("rank %d: the migration was called off (%s %d): rejoining", self.rank, answer.action,
                 answer.generation)
        self._recover(None, answer)  # type: ignore[attr-defined]
