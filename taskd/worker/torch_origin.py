"""Which errors of a live step a torch collective raised, decided where they are raised (live recovery, torch).

An error a collective raised (a peer died, a collective timed out) makes every rank leave its group and
rebuild it; any other error is the script's own and propagates, whatever its type or text: a
``TimeoutError`` raised in a module's ``forward`` reading a remote feature store, a ``ConnectionResetError``
in a backward hook. Its rank then exits and is replaced live like any crashed rank. Judged from the
traceback's files (any frame under ``torch/nn/parallel`` or ``torch/autograd``), every ``forward`` called
through DDP looked like a collective's: a live job stalled 2 minutes, then restarted every rank (issue 32,
F1). So the error is marked where a collective raises it, and only a marked one counts:

* ``torch.distributed``'s collectives (``all_reduce``, ``all_gather``, ``send``, ``barrier``,
  ``init_process_group``...): each is wrapped by torch's ``_exception_logger``, which logs the error to
  torch's c10d logger from inside its ``except``; a handler there (`watch_torch_collectives`) marks it.
  That covers the script's own collectives and those inside torch modules (``SyncBatchNorm``).
* what LiveGroup runs itself (the step's vote, the hand-over, forming a group, building DDP), and DDP's
  forward-time collectives (bucket rebuild, buffer broadcast): inside `collective`.
* DDP's gradient allreduce runs in C++ and its error surfaces from ``loss.backward()`` when DDP's finalize
  waits for it. Backward's own hooks and autograd Functions run while the graph executes, and a graph that
  raised runs no final callback; DDP's finalize is one. So an error that leaves backward after the graph
  finished (`taskd.worker.torch_mark.Backward.FINALIZING`) is the reducer's (LiveGroup.step).

Not marked: ``work.wait()`` of an ``async_op=True`` collective of the script's own (a C++ call torch does not
wrap). Its error propagates as the script's: the rank exits and is replaced, the slower path, never a stall.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

_ATTR = "_taskd_raised_by"  # set on the exception object: it travels with it through autograd and re-raises


def mark(exc: BaseException, where: str) -> None:
    """Record that ``where`` (a collective) raised ``exc``; the first mark is kept."""
    if getattr(exc, _ATTR, None) is None:
        try:
            setattr(exc, _ATTR, where)
        except (AttributeError, TypeError):  # an exception type with __slots__: left unmarked (the script's)
            pass


def raised_by(exc: BaseException) -> str | None:
    """The collective that raised ``exc`` (or an exception it was raised from), None when none did."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        where = getattr(cur, _ATTR, None)
        if where is not None:
            return str(where)
        cur = cur.__cause__  # `raise X from collective_error`: the script wrapped a collective's error
    return None


@contextmanager
def collective(where: str) -> Iterator[None]:
    """Mark whatever escapes the block as raised by the collective ``where``."""
    try:
        yield
    except Exception as exc:
        mark(exc, where)
        raise


class _C10dErrors(logging.Handler):
    """Marks the error torch's ``_exception_logger`` is logging: it logs from inside its ``except``."""

    def emit(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if exc is not None:
            name = record.msg.get("func_name", "?") if isinstance(record.msg, dict) else "?"
            mark(exc, f"torch.distributed.{name}")


_installed: list[_C10dErrors] = []


def watch_torch_collectives() -> bool:
    """Mark the errors of ``torch.distributed``'s collectives from now on (once per process); False where this
    torch has no c10d error logger (each such error is then the script's, and its rank is replaced)."""
    if _installed:
        return True
    try:
        from torch.distributed import c10d_logger

        logger = c10d_logger._c10d_logger
    except (ImportError, AttributeError):
        log.debug("torch has no c10d error logger: collective errors are told only at LiveGroup's own call sites")
        return False
    if not isinstance(logger, logging.Logger):
        return False
    handler = _C10dErrors(logging.DEBUG)
    logger.addHandler(handler)
    _installed.append(handler)
    return True
