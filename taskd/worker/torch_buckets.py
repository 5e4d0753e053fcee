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

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from taskd.worker.torch_facts import HAS_INIT_SYNC, stable_ddp_kwargs
from taskd.worker.torch_group import freeze_older_objects
from taskd.worker.torch_origin import collective

# the private calls the fixed layout rests on, looked up once: without them, one bucket per parameter
_CAN_FIX = hasattr(DistributedDataParallel, "_build_params_for_reducer") and all(
    hasattr(dist.Reducer, name) for name in ("_push_all_rebuilt_params", "_rebuild_buckets"))


class MarkedDDP(DistributedDataParallel):
    """DDP whose own forward-time collectives (bucket rebuild, buffer broadcast) mark their errors as a collective's
    (taskd.worker.torch_origin); what the wrapped module's ``forward`` raises stays the script's."""

    def _pre_forward(self, *inputs: Any, **kwargs: Any) -> Any:
        with collective("DDP's forward-time collectives"):
            return super()._pre_forward(*inputs, **kwargs)

    def _post_forward(self, output: Any) -> Any:
        with collective("DDP's post-forward buffer sync"):
            return super()._post_forward(output)


class StableDDP(MarkedDDP):
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
    return MarkedDDP(module, **kwargs)


class DDPHandle:
    """Stands for a LiveGroup's current DDP wrapper (it is rebuilt with every new group); made by ``live.ddp()``."""

    def __init__(self, group: Any, module: torch.nn.Module, kwargs: dict[str, Any]) -> None:
        self._group = group  # the LiveGroup: whether it is live, its step's forward count and backward mark
        self.module = module
        self.kwargs = kwargs
        self.current: DistributedDataParallel | None = None

    def build(self) -> DistributedDataParallel:
        kwargs = dict(self.kwargs)
        if self._group.live:
            if HAS_INIT_SYNC:
                kwargs.setdefault("init_sync", False)  # the state was just synced exactly
            freeze_older_objects()  # a rebuild's collection then scans only this wrapper and what is newer
        with collective("DDP's construction (parameter check and broadcast)"):
            self.current = stable_ddp(self.module, **kwargs)  # the same buckets in every wrapper; DDP's C++ allreduce
        return self.current

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.current is None:
            self.build()
        self._group.forwards += 1  # a drain must know whether this step's forward-time collectives ran
        output = self.current(*args, **kwargs)  # type: ignore[misc]
        if self._group.live and self.current.require_backward_grad_sync and torch.is_grad_enabled():  # not no_sync()
            self._group.backward.attach(output)  # the mark while its gradients are reduced (torch_mark)
        return output

    def __getattr__(self, name: str) -> Any:
        if self.current is None:
            self.build()
        return getattr(self.current, name)
