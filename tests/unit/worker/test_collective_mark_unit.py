"""LiveGroup's "inside a collective" mark around DDP's bucket allreduce: lifted on completion, kept on failure.

A peer whose collective failed must not look hung to the agent in the moment before it reports the error
(it is then neither in a collective nor reporting): CI saw rank 2 taken for a hang beside the real one.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from taskd.worker.torch_comm import _unmark_when_done  # noqa: E402


class _Marks:
    def __init__(self) -> None:
        self.inside = 1  # _marked_allreduce marked it before launching

    def _collective(self, delta: int) -> None:
        self.inside += delta


def test_a_completed_bucket_lifts_the_mark_and_passes_its_tensor_on() -> None:
    marks, fut = _Marks(), torch.futures.Future()
    out = _unmark_when_done(marks, fut)
    assert marks.inside == 1
    fut.set_result([torch.ones(2)])
    assert marks.inside == 0
    assert torch.equal(out.wait(), torch.ones(2))


def test_a_failed_bucket_keeps_the_mark_until_the_error_is_reported() -> None:
    marks, fut = _Marks(), torch.futures.Future()
    out = _unmark_when_done(marks, fut)
    fut.set_exception(RuntimeError("Timed out waiting 5000ms for send operation to complete"))
    with pytest.raises(RuntimeError, match="send operation"):
        out.wait()
    assert marks.inside == 1
