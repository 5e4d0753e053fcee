"""LiveGroup's "inside a collective" mark around DDP's gradient reduction: on from the moment backward reaches the
wrapper's output until backward (DDP's finalize, which waits for every bucket, included) has ended; kept on when
that finalize fails.

A peer whose collective failed must not look hung to the agent in the moment before it reports the error
(it is then neither in a collective nor reporting): CI saw rank 2 taken for a hang beside the real one.
Real autograd: the "finalize" below is queued exactly as DDP's reducer queues its own, from a hook that fires
when the last gradient is ready.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.autograd import Variable  # noqa: E402

from taskd.worker.torch_mark import Backward, BackwardMark, CollectiveMark  # noqa: E402


class _Edges:
    """What the heartbeat file is told: LiveRank.collective(inside) at each 0 <-> >0 edge."""

    def __init__(self) -> None:
        self.written: list[bool] = []

    def collective(self, inside: bool) -> None:
        self.written.append(inside)


def _model_with_finalize(seen: list[str], edges: _Edges, fail: bool = False) -> torch.nn.Module:
    """A model whose first layer's gradient (the last one backward computes) queues a DDP-like finalize."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))

    def finalize() -> None:
        seen.append(f"finalize, marked={edges.written[-1:] == [True]}")
        if fail:
            raise RuntimeError("Connection closed by peer")

    def last_grad_ready(_grad: torch.Tensor) -> None:
        Variable._execution_engine.queue_callback(finalize)

    model[0].weight.register_hook(last_grad_ready)
    return model


def test_the_mark_covers_backward_and_the_reducers_finalize_and_lifts_after() -> None:
    edges, seen = _Edges(), []
    model = _model_with_finalize(seen, edges)
    backward = BackwardMark(CollectiveMark(edges))  # type: ignore[arg-type]
    out = model(torch.randn(2, 4))
    backward.attach((out, {"aux": out * 2}, 3))  # nested outputs: one backward marks once
    assert backward.state is Backward.NOT_STARTED and edges.written == []
    out.sum().backward()
    assert seen == ["finalize, marked=True"]
    assert edges.written == [True, False]
    assert backward.state is Backward.DONE
    backward.new_step()
    assert backward.state is Backward.NOT_STARTED


def test_a_failed_finalize_keeps_the_mark_until_the_error_is_reported() -> None:
    edges, seen = _Edges(), []
    model = _model_with_finalize(seen, edges, fail=True)
    mark = CollectiveMark(edges)  # type: ignore[arg-type]
    backward = BackwardMark(mark)
    out = model(torch.randn(2, 4))
    backward.attach(out)
    with pytest.raises(RuntimeError, match="closed by peer"):
        out.sum().backward()
    assert edges.written == [True]  # still inside: report_error clears it with the error
    assert backward.state is Backward.FINALIZING  # the graph ran: the error is the finalize's (torch_origin)
    mark.forget()  # the group is gone; the next collective is an edge again
    mark.enter()
    assert edges.written == [True, True]


@pytest.mark.parametrize("exc", [TimeoutError("feature store read timed out"), ConnectionResetError("reset")])
def test_an_error_of_a_backward_hook_leaves_backward_before_the_finalize_stage(exc: Exception) -> None:
    """Issue 32 F1: what a backward hook (or an autograd Function) raises is the script's: the graph errs, no final
    callback runs, and the state stays RUNNING, which LiveGroup does not take for the reducer's collective."""
    edges, seen = _Edges(), []
    model = _model_with_finalize(seen, edges)
    backward = BackwardMark(CollectiveMark(edges))  # type: ignore[arg-type]

    def hook(_grad: torch.Tensor) -> None:
        raise exc

    model[0].bias.register_hook(hook)
    out = model(torch.randn(2, 4))
    backward.attach(out)
    with pytest.raises(type(exc)):
        out.sum().backward()
    assert seen == [] and backward.state is Backward.RUNNING


def test_an_output_without_gradient_is_not_marked() -> None:
    edges = _Edges()
    backward = BackwardMark(CollectiveMark(edges))  # type: ignore[arg-type]
    with torch.no_grad():
        out = torch.nn.Linear(4, 1)(torch.randn(2, 4))
    backward.attach([out, "label"])
    assert backward.state is Backward.NOT_STARTED and edges.written == []


def test_only_the_edges_are_written_while_collectives_overlap() -> None:
    edges = _Edges()
    mark = CollectiveMark(edges)  # type: ignore[arg-type]
    mark.enter()
    mark.enter()
    mark.leave()
    assert edges.written == [True]
    mark.reset()
    mark.reset()
    assert edges.written == [True, False]
