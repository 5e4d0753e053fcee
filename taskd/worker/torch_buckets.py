"""DDP gradient buckets that are the same in every wrapper a live job builds, so a rebuilt one sums bit-identically.

gloo's sum over ranks depends on where an element sits in its bucket (with 3 or more ranks the order of the
additions follows the offset), and DDP's layout changes once: its first iteration reduces everything in one
bucket, then it re-buckets in the order the gradients became ready. A wrapper built after a recovery is in its
first iteration while the long-lived one was re-bucketed long ago, so the step after a recovery differed from a
fault-free run in the last bits (3.6e-7 measured).

`StableDDP` gives every wrapper, the first and every rebuilt one, the layout DDP would re-bucket into, at
construction: it hands the reducer its parameters in reverse module order (the order backward makes their
gradients ready in a feed-forward model) and has DDP's own re-bucketing run at once on that order
(``_push_all_rebuilt_params``, which the reducer then never redoes). The buckets are DDP's usual ones (25 MB,
a first one of 1 MB, or the caller's ``bucket_cap_mb``), filled in ready order, so communication overlaps
backward as under plain DDP. For a model whose backward makes gradients ready in another order the layout
is still the same in every wrapper (bit-identity holds), only less of the reduction overlaps backward.

It used one bucket per parameter before (``bucket_cap_mb_list`` of one byte): identical too, but one
collective per parameter, which cost 13-18 % of a step at 8 ranks on 2 cores (BENCHMARKS.md, "Steady-state
cost of LiveGroup"). That remains the fallback where the reducer's private calls are missing (`stable_ddp`).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from taskd.worker.torch_facts import stable_ddp_kwargs

# the private calls the fixed layout rests on, looked up once: without them, one bucket per parameter
_CAN_FIX = hasattr(DistributedDataParallel, "_build_params_for_reducer") and all(
    hasattr(dist.Reducer, name) for name in ("_push_all_rebuilt_params", "_rebuild_buckets"))


class StableDDP(DistributedDataParallel):
    """DistributedDataParallel whose bucket layout is fixed at construction (see the module doc)."""

    def __init__(self, module: Any, **kwargs: Any) -> None:
        super().__init__(module, **kwargs)
        self.reducer._push_all_rebuilt_params()  # the reverse module order, as backward will make them ready
        self.reducer._rebuild_buckets()  # collective: rank 0's layout is broadcast (every rank builds together)
        self._has_rebuilt_buckets = True

    def _build_params_for_reducer(self) -> tuple[list[Any], list[bool]]:
        parameters, sparse = super()._build_params_for_reducer()
        return parameters[::-1], sparse[::-1]


def _fixed_layout_possible(kwargs: dict[str, Any]) -> bool:
    """DDP re-buckets once (so the layout can be fixed) only without these; and torch must have the calls."""
    return _CAN_FIX and not any(kwargs.get(k) for k in ("find_unused_parameters", "static_graph", "bucket_cap_mb_list"))


def stable_ddp(module: Any, **kwargs: Any) -> DistributedDataParallel:
    """A DDP wrapper of ``module`` whose gradients sum the same way in every wrapper built for it.

    ``kwargs`` are DDP's; with ``find_unused_parameters``, ``static_graph`` or a ``bucket_cap_mb_list`` of the
    caller's the layout cannot be fixed that way, and the buckets are one per parameter
    (`taskd.worker.torch_facts.stable_ddp_kwargs`) unless the caller's own ``bucket_cap_mb_list`` says otherwise.
    """
    if _fixed_layout_possible(kwargs):
        return StableDDP(module, **kwargs)
    if "bucket_cap_mb_list" not in kwargs:
        kwargs = {**stable_ddp_kwargs(), **kwargs}
    return DistributedDataParallel(module, **kwargs)
