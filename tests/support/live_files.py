"""A node's live-recovery files as the agent's `LiveRanks` sees them, for unit tests of the agent side:
the launcher's paths (`FakeNode`) and what a rank writes into its heartbeat file (`write`)."""

from __future__ import annotations

from pathlib import Path

from taskd.agent.ranks.table import RankLayout, RankState, RankTable
from taskd.worker import heartbeat_file as hbf


class FakeNode:
    """The launcher as the agent sees it: heartbeat files and a control file in ``tmp``, live recovery on."""

    live_recovery = True
    rank_declarations = True

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.generation = 0

    def control_path(self) -> str:
        return str(self.tmp / "control.json")

    def heartbeat_path(self, local_rank: int) -> str:
        return str(self.tmp / f"rank{local_rank}.hb")

    def set_generation(self, generation: int) -> None:
        self.generation = generation


def write(path: str, *fields: tuple) -> None:
    """What a rank writes into its file, under the sequence counter as taskd.worker does."""
    hb = hbf.HeartbeatFile(path)
    buf = hb.buffer
    seq = hbf.SEQ.unpack_from(buf, hbf.OFF_SEQ)[0]
    hbf.SEQ.pack_into(buf, hbf.OFF_SEQ, seq + 1)
    for layout, offset, values in fields:
        layout.pack_into(buf, offset, *values)
    hbf.SEQ.pack_into(buf, hbf.OFF_SEQ, seq + 2)
    hb.close()


def running_ranks(tmp: Path, layout: RankLayout, pids: dict[int, int]) -> tuple[FakeNode, RankTable]:
    """A node laid out as ``layout`` whose local ranks run as ``pids``, each with a fresh heartbeat file."""
    node = FakeNode(tmp)
    table = RankTable()
    table.lay_out(layout)
    for local, rank in table.ranks.items():
        hbf.HeartbeatFile(node.heartbeat_path(local)).create().close()
        rank.pid, rank.state = pids[local], RankState.RUNNING
    return node, table
