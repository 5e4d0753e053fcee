"""Scale-in and scale-out on the agent (issue 17, item 4; ClusterD's `downgrade` and `upgrade`): the policy.

- `offers`: a node offers `downgrade` and `upgrade` only if its job opted in (`taskd run --nnodes MIN:MAX`,
  MIN < MAX: `AgentConfig.scales`), it runs live, and every local rank declared a resize hook
  (`LiveGroup(on_resize=...)`, heartbeat flag FLAG_RESIZE).
- `Resize`: the group a downgrade or upgrade forms next, as the controller's changeStrategy names it in its
  extraParams (`"world_size": W, "rank_map": {"<global rank>": <new rank>}`), parsed once, in `Order.of`.
  The mechanics (`LiveRanks.begin`) write the node's share of it into the control file.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from taskd.vocabulary import Strategy

log = logging.getLogger("taskd.agent")


@dataclass(frozen=True)
class Resize:
    """A resized group: its world size, and the new rank of each global rank in it (ranks by the global rank each
    process was started as, which never changes; a rank not in it is not in the group)."""

    world_size: int
    ranks: Mapping[int, int]

    def of_node(self, global_ranks: Iterable[int]) -> dict[int, int]:
        """The part of the rank map for one node's ranks (what its control file carries)."""
        return {r: self.ranks[r] for r in global_ranks if r in self.ranks}

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> Resize | None:
        """From a changeStrategy's extraParams; None without one, or for a malformed one (logged): an agent never
        forms a group at a size it cannot check."""
        world, ranks = params.get("world_size"), params.get("rank_map")
        if world is None and ranks is None:
            return None
        try:
            return cls._checked(world, ranks)
        except (TypeError, ValueError) as exc:
            log.warning("changeStrategy extraParams world_size=%r rank_map=%.200r ignored: %s", world, ranks, exc)
            return None

    @classmethod
    def _checked(cls, world: object, ranks: object) -> Resize:
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError("world_size is not an integer >= 1")
        if not isinstance(ranks, dict):
            raise ValueError("rank_map is not a JSON object")
        out = {int(k): v for k, v in ranks.items()}
        if any(k < 0 or isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < world for k, v in out.items()):
            raise ValueError(f"rank_map maps a rank outside [0, {world})")
        if sorted(out.values()) != list(range(world)):
            raise ValueError(f"rank_map does not name each of the {world} new ranks once")
        return cls(world, out)


def present_nodes(node_count: int, absent: Iterable[int]) -> int:
    """The nodes a job runs on now, for its ranks' WORLD_SIZE: K when the absent nodes are K..node_count-1 (a
    `--nnodes MIN:MAX` job started with the nodes present, controller/nodes/resize.py `start_smaller`); else all of
    them (a scale-in's gaps are the live ranks' rank map, not their start environment)."""
    gone = set(absent)
    k = node_count - len(gone)
    return k if k >= 1 and gone == set(range(k, node_count)) else node_count


def offers(configured: list[str], scales: bool, live: bool, every_rank_resizes: bool) -> list[str]:
    """`configured` plus downgrade and upgrade when this node may take part in a resize."""
    if not (scales and live and every_rank_resizes):
        return configured
    return [*configured, *(s for s in Strategy.RESIZE if s not in configured)]


__all__ = ["Resize", "offers", "present_nodes"]
