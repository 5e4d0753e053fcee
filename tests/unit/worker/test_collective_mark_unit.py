"""LiveGroup's "inside a collective" mark around DDP's bucket allreduce: lifted on completion, kept on failure.

A peer whose collective failed must not look hung to the agent in the moment before it reports the error
(it is then neither in a collective nor reporting): CI saw rank 2 taken for a hang beside the real one.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from taskd.worker.torch_mark import CollectiveMark, unmark_when_done  # noqa: E402


class _Edges:
    """What the heartbeat file is told: LiveRank.collective(inside) at each 0 <-> >0 edge."""

    def __init__(self) -> None:
        self.written: list[bool] = []

    def collective(self, inside: bool) -> None:
        self.written.append(inside)


def _marked() -> tuple[CollectiveMark, _Edges]:
    edges = _Edges()
    mark = CollectiveMark(edges)  # type: ignore[arg-type]
    mark.enter()  # marked_allreduce marks it before launching
    return mark, edges


def test_a_completed_bucket_lifts_the_mark_and_passes_its_tensor_on() -> None:
    mark, edges = _marked()
    fut: torch.futures.Future = torch.futures.Future()
    out = unmark_when_done(mark, fut)
    assert edges.written == [True]
    fut.set_result([torch.ones(2)])
    assert torch.equal(out.wait(), torch.ones(2))
    assert edges.written == [True, False]


def test_a_failed_bucket_keeps_the_mark_until_the_error_is_reported() -> None:
    mark, edges = _marked()
    fut: torch.futures.Future = torch.futures.Future()
    out = unmark_when_done(mark, fut)
    fut.set_exception(RuntimeError("Timed out waiting 5000ms for send operation to complete"))
    with pytest.raises(RuntimeError, match="send operation"):
        out.wait()
    assert edges.written == [True]  # still inside: report_error clears it with the error
    mark.forget()  # the group is gone; the next collective is an edge again
    mark.enter()
    assert edges.written == [True, True]


def test_only_the_edges_are_written_while_buckets_overlap() -> None:
    mark, edges = _marked()
    mark.enter()
    mark.leave()
    assert edges.written == [True]
    mark.reset()
    mark.reset()
    assert edges.written == [True, False]
