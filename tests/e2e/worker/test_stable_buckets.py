"""The DDP wrapper LiveGroup builds has its bucket layout fixed at construction: DDP's usual buckets, filled in the
order backward makes gradients ready, the same in the first wrapper and in every one rebuilt after a recovery, and
never re-bucketed (issue 20 item 4: one bucket per parameter cost 13-18 % of a step at 8 ranks). A real gloo group
of one rank; the bit-identity this buys across real recoveries is tests/e2e/worker/test_live_recovery.py's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from taskd.worker.torch_buckets import StableDDP, stable_ddp  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 2048), nn.Tanh(), nn.Linear(2048, 2048), nn.Tanh(), nn.Linear(2048, 2048),
                         nn.Tanh(), nn.Linear(2048, 10))


def _layout(ddp) -> list[list[str]]:  # noqa: ANN001
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    return [[names[id(p)] for p in bucket.parameters()] for bucket in ddp.reducer._get_zeros_like_grad_buckets()]


def _train(ddp, steps: int) -> None:  # noqa: ANN001
    for _ in range(steps):
        ddp(torch.randn(4, 256)).sum().backward()


def test_the_layout_is_ddps_rebuilt_one_from_the_start_and_never_changes(group) -> None:
    plain = torch.nn.parallel.DistributedDataParallel(_model())
    _train(plain, 2)  # plain DDP re-buckets after its first iteration, in gradient-ready order
    ddp = stable_ddp(_model())
    assert isinstance(ddp, StableDDP)
    first = _layout(ddp)
    assert first == _layout(plain) == [["6.bias", "6.weight", "4.bias", "4.weight"],
                                       ["2.bias", "2.weight", "0.bias", "0.weight"]]
    _train(ddp, 3)
    assert _layout(ddp) == first
    rebuilt = stable_ddp(ddp.module)  # what a recovery builds
    assert _layout(rebuilt) == first
    _train(rebuilt, 1)
    assert _layout(rebuilt) == first


def test_where_ddp_never_re_buckets_the_buckets_are_one_per_parameter(group) -> None:
    ddp = stable_ddp(_model(), find_unused_parameters=True)
    assert not isinstance(ddp, StableDDP)
    assert all(len(bucket) == 1 for bucket in _layout(ddp)) and len(_layout(ddp)) == 8
    caps = stable_ddp(_model(), bucket_cap_mb_list=[25])  # the caller's own layout is the caller's
    assert not isinstance(caps, StableDDP) and len(_layout(caps)) == 2
