"""torchrun's value forms, parsed without torch: `--nnodes 1:4`, `--nproc-per-node auto`, `-r 0:1,1:2`."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping

DEFAULT_MASTER_PORT = 29500  # torchrun's, for multi-node jobs (node 0's port must be known to the others)
LAUNCH_MODES = ("script", "module", "no-python", "run-path")
START_METHODS = ("spawn", "fork", "forkserver")
NUMA_MODES = ("node", "socket", "exclusive", "core-complex")


class RunConfigError(ValueError):
    """Every problem found, one line each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def count_gpus(environ: Mapping[str, str]) -> int:
    """GPUs this process would see, without importing torch (CUDA_VISIBLE_DEVICES, else /dev/nvidiaN)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for item in visible.split(","):
            item = item.strip()
            if not item or item.startswith("-"):  # CUDA stops at the first invalid entry
                break
            count += 1
        return count
    return len([p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)])


def count_cpus() -> int:
    """The CPUs this process may run on (affinity, as torch's cpu_count; cgroups under Slurm)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def parse_nproc(text: str, environ: Mapping[str, str]) -> tuple[int, str]:
    """`N|auto|cpu|gpu` -> (count, how it was found)."""
    value = text.strip().lower()
    if value.lstrip("-").isdigit():
        return int(value), ""
    if value == "cpu":
        return count_cpus(), "CPUs"
    if value in ("gpu", "cuda"):
        gpus = count_gpus(environ)
        if not gpus:
            raise ValueError(f"{text!r}: no GPU found (CUDA_VISIBLE_DEVICES is empty or unset and there is no "
                             "/dev/nvidiaN); give a number")
        return gpus, "GPUs"
    if value == "auto":
        gpus = count_gpus(environ)
        return (gpus, "GPUs") if gpus else (count_cpus(), "CPUs (no GPU found)")
    if value == "xpu":
        raise ValueError(f"{text!r}: taskd cannot count XPUs without torch; give a number")
    raise ValueError(f"{text!r} is not a number, auto, cpu or gpu")


def parse_nnodes(text: str) -> tuple[int, int]:
    """`N` or `MIN:MAX` -> (min, max)."""
    low, sep, high = text.strip().partition(":")
    try:
        lo, hi = int(low), int(high if sep else low)
    except ValueError:
        raise ValueError(f"{text!r} is not N or MIN:MAX") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"{text!r}: need 1 <= MIN <= MAX")
    return lo, hi


_STD = re.compile(r"[0-3]")
_STD_MAP = re.compile(r"\d+:[0-3](,\d+:[0-3])*")


def parse_std(text: str, nproc: int) -> dict[int, int]:
    """torchrun's `0-3` (all local ranks) or `LR:0-3,...` -> {local_rank: 0 none, 1 stdout, 2 stderr, 3 both}."""
    value = text.strip()
    if _STD.fullmatch(value):
        return {lr: int(value) for lr in range(nproc)}
    if not _STD_MAP.fullmatch(value):
        raise ValueError(f"{text!r} is not 0-3 or LOCAL_RANK:0-3,... (0 none, 1 stdout, 2 stderr, 3 both)")
    out = dict.fromkeys(range(nproc), 0)
    for item in value.split(","):
        lr, std = (int(x) for x in item.split(":"))
        if lr >= nproc:
            raise ValueError(f"{text!r}: local rank {lr} does not exist with {nproc} rank(s) per node")
        out[lr] = std
    return out


def parse_rank_set(text: str) -> frozenset[int]:
    try:
        ranks = frozenset(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of local ranks, e.g. 0,1") from None
    if not ranks or min(ranks) < 0:
        raise ValueError(f"{text!r}: local ranks are >= 0")
    return ranks


def parse_rdzv_conf(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out
