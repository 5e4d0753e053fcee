"""Which live path a sharded model takes, and who hands whom which shards (taskd.worker.torch_hsdp).

Over torch's "fake" process-group backend (no sockets, no processes): real DeviceMeshes, real ``fully_shard``."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from taskd.worker.torch_hsdp import Hsdp, from_local, hsdp_layout, to_local  # noqa: E402
from taskd.worker.torch_retry import ShardsLost  # noqa: E402


@pytest.fixture
def fake_world():  # noqa: ANN201
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    yield
    dist.destroy_process_group()


def mesh_of(shape: tuple[int, ...]):  # noqa: ANN201
    return init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard")[-len(shape):])


def hsdp_model(mesh) -> nn.Module:  # noqa: ANN001
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    fully_shard(model, mesh=mesh)
    return model


def test_an_hsdp_model_on_a_live_mesh_gets_the_peer_replica_path(fake_world) -> None:
    mesh = mesh_of((2, 2))
    found = hsdp_layout(hsdp_model(mesh), (mesh,))
    assert isinstance(found, Hsdp) and found.describe() == "HSDP over a 2 x 2 mesh (replicate x shard)"
    assert found.peers() == [[0, 2], [1, 3]]  # each shard coordinate's ranks, one per replica group


@pytest.mark.parametrize("shape", [(4,), (1, 4)])
def test_sharded_models_with_no_copy_on_a_peer_are_refused_with_the_reason(fake_world, shape) -> None:
    mesh = mesh_of(shape)
    why = hsdp_layout(hsdp_model(mesh), (mesh,))
    assert isinstance(why, str) and why.startswith("FSDPSequential is sharded by FSDP"), why
    assert ("1 replica group" in why) == (shape == (1, 4))


def test_a_mesh_live_did_not_make_is_refused_and_a_plain_model_is_ddps(fake_world) -> None:
    mesh = mesh_of((2, 2))
    why = hsdp_layout(hsdp_model(mesh), ())
    assert isinstance(why, str) and "live.init_device_mesh() did not make" in why
    assert hsdp_layout(nn.Linear(2, 2), ()) is None


def test_each_lacking_rank_takes_its_shards_from_the_peer_replica_at_the_newest_step(fake_world) -> None:
    hsdp = Hsdp(mesh_of((2, 2)))
    assert hsdp.sources([(1, 5), (0, 0), (1, 5), (1, 5)]) == (5, [(3, [1])])
    assert hsdp.sources([(0, 0), (1, 5), (1, 5), (1, 5)]) == (5, [(2, [0])])
    assert hsdp.sources([(1, 5), (1, 5), (1, 5), (1, 5)]) == (5, [])
    with pytest.raises(ShardsLost, match=r"no rank of \[1, 3\] holds its shards at step 5"):
        hsdp.sources([(1, 5), (0, 0), (1, 5), (0, 0)])  # both replicas of shard 1 lost
    with pytest.raises(ShardsLost, match=r"no rank of \[1, 3\] holds its shards at step 6"):
        hsdp.sources([(1, 6), (1, 5), (1, 6), (1, 5)])  # shard 1's copies are a step behind shard 0's


@pytest.mark.parametrize(("per_node", "said"), [(2, "a lost node's ranks are replaced live too"),
                                               (1, "except node 0's"), (4, "the whole job (one node)"),
                                               (3, "not known (LOCAL_WORLD_SIZE 3)"),
                                               (0, "not known")])
def test_what_a_lost_node_does_to_the_mesh_is_said_by_its_layout(fake_world, per_node: int, said: str) -> None:
    assert said in Hsdp(mesh_of((2, 2))).node_loss(per_node)


def test_dtensor_optimizer_state_travels_as_its_local_shard_and_comes_back_a_dtensor(fake_world) -> None:
    mesh = mesh_of((2, 2))
    model = hsdp_model(mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    state = optimizer.state_dict()
    flat = to_local(state)
    assert not any(isinstance(v, DTensor) for s in flat["state"].values() for v in s.values())
    back = from_local(flat, mesh)
    for key, entry in state["state"].items():
        for name, value in entry.items():
            other = back["state"][key][name]
            assert type(other) is type(value)
            if isinstance(value, DTensor):
                assert other.placements == value.placements and other.shape == value.shape
                assert torch.equal(other.to_local(), value.to_local())
