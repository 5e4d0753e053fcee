"""Which backends taskd can rebuild a group of in place (taskd.worker.torch_facts.backend_not_live)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from taskd.worker.torch_facts import backend_not_live, group_device  # noqa: E402


@pytest.mark.parametrize("backend", ["gloo", "GLOO", "cpu:gloo", "cpu:gloo,cuda:gloo"])
def test_gloo_groups_can_be_rebuilt(backend):
    assert backend_not_live(backend) is None


@pytest.mark.parametrize("backend", ["nccl", "cuda:nccl", "cpu:gloo,cuda:nccl", "mpi", "ucc", ""])
def test_other_backends_are_named_with_the_reason(backend):
    why = backend_not_live(backend)
    assert why is not None and repr(backend) in why and "gloo only" in why


@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo,cuda:nccl", "mpi"])
def test_a_group_that_serves_host_tensors_syncs_on_the_host(backend):
    assert group_device(backend) == torch.device("cpu")


def test_an_nccl_group_syncs_on_the_scripts_cuda_device_where_there_is_one():
    want = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    assert group_device("nccl") == want and group_device("cuda:nccl") == want
