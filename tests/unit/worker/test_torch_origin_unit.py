"""Where a live step's error was raised, marked at the raising collective (issue 32, F1): torch.distributed's
collectives through torch's own error logger, LiveGroup's and DDP's through `collective`; nothing else."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from taskd.worker.torch_origin import collective, mark, raised_by, watch_torch_collectives  # noqa: E402


def test_an_error_a_torch_collective_raises_is_marked_with_its_name() -> None:
    assert watch_torch_collectives() and watch_torch_collectives()  # once per process, idempotent
    with pytest.raises(ValueError) as caught:  # no group formed: raised inside torch's collective all the same
        dist.all_reduce(torch.ones(1))
    assert raised_by(caught.value) == "torch.distributed.all_reduce"


def test_what_the_script_raises_is_unmarked_whatever_its_type_and_text() -> None:
    watch_torch_collectives()
    model = torch.nn.Linear(2, 1)

    def forward_hook(*_: object) -> None:
        raise TimeoutError("[gloo] Timed out waiting 30000ms: connection closed by peer")

    model.register_forward_hook(forward_hook)
    with pytest.raises(TimeoutError) as caught:
        model(torch.ones(1, 2))
    assert raised_by(caught.value) is None


def test_collective_marks_what_escapes_its_block_and_the_mark_follows_explicit_chaining() -> None:
    with pytest.raises(RuntimeError) as caught, collective("the step's vote"):
        raise RuntimeError("Connection closed by peer")
    assert raised_by(caught.value) == "the step's vote"
    wrapped = ConnectionError("the script wrapped it")
    wrapped.__cause__ = caught.value
    assert raised_by(wrapped) == "the step's vote"
    context_only = ConnectionError("raised while handling one")
    context_only.__context__ = caught.value  # an implicit context is no origin
    assert raised_by(context_only) is None
    mark(caught.value, "another")
    assert raised_by(caught.value) == "the step's vote"  # the first mark is kept
