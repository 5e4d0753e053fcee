"""DDP's gradient allreduce as a comm hook that marks the rank "inside a collective" (taskd.worker.torch).

The mark tells the agent a rank that waits on its peers from one that hangs (docs/worker.md).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def marked_allreduce(group, bucket):  # noqa: ANN001, ANN201 - DDP rejects string annotations here
    """DDP's allreduce, marking the rank "inside a collective" while a bucket is in flight (waiting, not hung)."""
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    group._launched += 1  # buckets launched in this step: a drain makes only the rest
    group._collective(+1)
    return _unmark_when_done(group, dist.all_reduce(tensor, async_op=True).get_future())


def _unmark_when_done(group, fut):  # noqa: ANN001, ANN202 - a LiveGroup and a torch Future, as above
    """Unmark the collective when it completes, not when it fails: a failed one leaves the rank marked
    "inside" until report_error clears the mark with the error. Cleared at once, the agent would see a
    rank that is neither in a collective nor reporting, which is what a hang looks like (CI, session 13)."""

    def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        value = f.value()[0]
        group._collective(-1)
        return value

    return fut.then(done)

