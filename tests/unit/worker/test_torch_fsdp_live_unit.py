"""What a pure FSDP2 job's live path says and does when shards are lost (taskd.worker.torch_fsdp_live)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from taskd.worker.torch_fsdp_live import node_loss  # noqa: E402


@pytest.mark.parametrize(("world", "per_node", "said"), [
    (4, 2, "a lost node's ranks are replaced live too (a standby's or a replacement's), restoring their shards from "
           "the copy of its snapshots on its buddy node"),
    (4, 2, "except node 0's: its agent hosts the store, so its loss restarts every rank"),
    (4, 4, "the whole job (one node)"), (4, 3, "not known (LOCAL_WORLD_SIZE 3)"), (4, 0, "not known")])
def test_what_a_lost_node_does_to_an_fsdp2_job_is_said_by_its_layout(world: int, per_node: int, said: str) -> None:
    assert said in node_loss(world, per_node)
