"""Slurm's hostlist grammar (`node[01-03,07],gpu5`), expanded lazily.

Slurm hands a job its nodes in this compressed form (SLURM_JOB_NODELIST); `taskd run` needs the
first host (node 0, where MASTER_ADDR lives) without calling `scontrol show hostnames`, which is
not on every compute node's PATH.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
MAX_HOSTS = 1_000_000  # a typo such as node[0-99999999] is refused, not expanded


def _split_top(text: str) -> list[str]:
    """Split at the commas that are outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise ValueError(f"bad Slurm node list {text!r}: nested '['")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"bad Slurm node list {text!r}: ']' without '['")
            depth = 0
        elif ch == "," and not depth:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"bad Slurm node list {text!r}: '[' is not closed")
    items.append(text[start:])
    return items


def _expand_group(group: str, text: str) -> list[str]:
    """`01-03,07` -> ['01', '02', '03', '07']: a range keeps its lower bound's width (zero padding)."""
    out: list[str] = []
    for part in group.split(","):
        m = _RANGE.fullmatch(part.strip())
        if not m:
            raise ValueError(f"bad Slurm node list {text!r}: {part!r} is not N or N-M")
        lo_text, hi_text = m.group(1), m.group(2)
        lo, hi = int(lo_text), int(hi_text if hi_text is not None else lo_text)
        if hi < lo:
            raise ValueError(f"bad Slurm node list {text!r}: range {part!r} runs backwards")
        if hi - lo >= MAX_HOSTS or len(out) + hi - lo >= MAX_HOSTS:
            raise ValueError(f"bad Slurm node list {text!r}: more than {MAX_HOSTS} hosts")
        out.extend(str(n).zfill(len(lo_text)) for n in range(lo, hi + 1))
    return out


def _expand_item(item: str, text: str) -> Iterator[str]:
    """`rack[1-2]-n[01-02]` -> the product, in Slurm's order (last bracket varies fastest)."""
    pieces: list[list[str]] = []
    rest = item
    while rest:
        head, sep, tail = rest.partition("[")
        if head:
            pieces.append([head])
        if not sep:
            break
        group, _, rest = tail.partition("]")
        pieces.append(_expand_group(group, text))
    for combo in itertools.product(*pieces):
        yield "".join(combo)


def iter_nodelist(text: str) -> Iterator[str]:
    """Every host of a Slurm node list, in order; ValueError names what is malformed."""
    if not text or not text.strip():
        raise ValueError("empty Slurm node list")
    items = _split_top(text.strip())
    for item in items:
        if not item.strip():
            raise ValueError(f"bad Slurm node list {text!r}: empty entry")
    for item in items:
        yield from _expand_item(item.strip(), text)


def expand_nodelist(text: str) -> list[str]:
    """The whole list (like `scontrol show hostnames`)."""
    return list(iter_nodelist(text))


def first_host(text: str) -> str:
    """Node 0's host name, without expanding the rest."""
    return next(iter_nodelist(text))
