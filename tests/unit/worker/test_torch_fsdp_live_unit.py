"""What a pure FSDP2 job's live path says and does when shards are lost (taskd.worker.torch_fsdp_live)."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("torch")

from taskd.worker.live import Phase  # noqa: E402
from taskd.worker.torch_fsdp_live import lost_words, node_loss  # noqa: E402
from taskd.worker.torch_retry import SHARDS_LOST_EXIT, LiveRecoveryFailed, ShardsLost, exit_shards_lost  # noqa: E402


@pytest.mark.parametrize(("world", "per_node", "said"), [
    (4, 2, "a lost node's ranks are replaced live too (a standby's or a replacement's), restoring their shards from "
           "the copy of its snapshots on its buddy node"),
    (4, 2, "except node 0's: its agent hosts the store, so its loss restarts every rank"),
    (4, 4, "the whole job (one node)"), (4, 3, "not known (LOCAL_WORLD_SIZE 3)"), (4, 0, "not known")])
def test_what_a_lost_node_does_to_an_fsdp2_job_is_said_by_its_layout(world: int, per_node: int, said: str) -> None:
    assert said in node_loss(world, per_node)


def test_lost_shards_are_said_by_the_ranks_that_hold_no_snapshot_or_by_the_steps_that_do_not_meet() -> None:
    assert lost_words([3, 3, -1, -1]).startswith("rank(s) 2, 3 hold no snapshot in memory (neither their node's "
                                                 "segments nor a copy fetched from the buddy node)")
    assert "share no step (newest from step 2 to 7" in lost_words([7, 7, 2, 7])


class _Protocol:
    def __init__(self) -> None:
        self.phases: list[Phase] = []

    def set_phase(self, phase: Phase) -> None:
        self.phases.append(phase)


@pytest.mark.parametrize(("rank", "level"), [(0, logging.ERROR), (2, logging.INFO)])
def test_lost_shards_end_the_rank_cleanly_with_one_line_from_rank_0(
        rank: int, level: int, caplog: pytest.LogCaptureFixture) -> None:
    protocol = _Protocol()
    with caplog.at_level(logging.INFO, logger="taskd.worker.torch_retry"), pytest.raises(SystemExit) as ended:
        exit_shards_lost(rank, ShardsLost("rank(s) 2, 3 hold no snapshot in memory"), protocol)
    assert ended.value.code == SHARDS_LOST_EXIT and protocol.phases == [Phase.GAVE_UP]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (level, f"live recovery refused: rank(s) 2, 3 hold no snapshot in memory; every rank exits (code "
                f"{SHARDS_LOST_EXIT}) and the job restarts from its checkpoints (job-rescheduling)")]
    assert issubclass(ShardsLost, LiveRecoveryFailed)  # what a script that catches the old error still catches


def test_the_newest_step_held_is_read_from_the_ranks_segments_not_its_account(tmp_path) -> None:  # noqa: ANN001
    from types import SimpleNamespace

    from taskd.worker.snapshot_account import Fetched, mark_fetched
    from taskd.worker.torch_live_snapshot import LiveSnapshots

    memory = LiveSnapshots(every=1)
    assert memory.newest_held() == -1  # not started: no store
    memory.store = SimpleNamespace(snapshots=SimpleNamespace(directory=str(tmp_path), rank=2))  # type: ignore[assignment]
    assert memory.newest_held() == -1  # no folder yet
    mark_fetched(str(tmp_path), 2, Fetched(1, -1, (), "no buddy copy survives", 9))  # how far the lost rank got
    (tmp_path / "rank2").mkdir()
    assert memory.newest_held() == -1
    for step in (3, 4):
        (tmp_path / "rank2" / f"s{step:012d}.snap").write_bytes(b"")
    (tmp_path / "rank2" / ".free-0-abc").write_bytes(b"")
    assert memory.newest_held() == 4
