"""Which backends taskd can rebuild a group of in place (taskd.worker.torch_facts.backend_not_live)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from taskd.worker.torch_facts import backend_not_live  # noqa: E402


@pytest.mark.parametrize("backend", ["gloo", "GLOO", "cpu:gloo", "cpu:gloo,cuda:gloo"])
def test_gloo_groups_can_be_rebuilt(backend):
    assert backend_not_live(backend) is None


@pytest.mark.parametrize("backend", ["nccl", "cuda:nccl", "cpu:gloo,cuda:nccl", "mpi", "ucc", ""])
def test_other_backends_are_named_with_the_reason(backend):
    why = backend_not_live(backend)
    assert why is not None and repr(backend) in why and "gloo only" in why
