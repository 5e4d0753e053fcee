"""Every check of what callers hand the client, in one place.

Two kinds of failure, on purpose: a misconfigured client (bad constructor option, unknown handler
name or frame, misspelt strategy) raises at once, naming the value and what is allowed; a report
whose arguments cannot be put on the wire raises `BadArgument`, which the report methods answer
locally with 409 (TaskD's report functions return codes, they do not raise).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from taskd.client.errors import ConfigurationError
from taskd.client.retry import check_backoff
from taskd.proto import recover_pb2
from taskd.settings import default
from taskd.vocabulary import Action, FaultRanks, SignalType, Strategy, fault_ranks, parse_strategies
from taskd.worker.env import env_int as worker_env_int

_INT32 = (-(2**31), 2**31 - 1)
FRAMES = ("pytorch", "mindspore")  # TaskD's start_subscribe(frame=...) values
ACTIONS = tuple(v for k, v in vars(Action).items() if k.isupper())
SIGNAL_TYPES = tuple(v for k, v in vars(SignalType).items() if k.isupper())
HANDLER_NAMES = ACTIONS + SIGNAL_TYPES


class BadArgument(ValueError):
    """A report argument that cannot be sent; answered locally with 409."""


@dataclass(frozen=True)
class ClientOptions:
    """The constructor's tuning knobs, checked together; rows of taskd/settings.py (scope "client"), whose table
    docs/client.md shows."""

    call_timeout: float = default("call_timeout")
    init_attempts: int = default("init_attempts")
    init_timeout: float = default("init_timeout")
    backoff_initial: float = default("backoff_initial")
    backoff_max: float = default("backoff_max")
    liveness_timeout: float = default("liveness_timeout")
    report_timeout: float = default("report_timeout")
    wait_for_ready: bool = default("wait_for_ready")
    channel_options: tuple[tuple[str, int | str], ...] = field(default_factory=tuple)  # gRPC's (name, value) pairs

    def __post_init__(self) -> None:
        bad = [f"{name}={getattr(self, name)!r} (must be > 0)"
               for name in ("call_timeout", "init_timeout", "report_timeout") if not _positive(getattr(self, name))]
        if not isinstance(self.init_attempts, int) or self.init_attempts < 1:
            bad.append(f"init_attempts={self.init_attempts!r} (must be an integer >= 1)")
        if not isinstance(self.liveness_timeout, (int, float)) or self.liveness_timeout < 0:
            bad.append(f"liveness_timeout={self.liveness_timeout!r} (must be >= 0; 0 disables)")
        try:
            check_backoff(self.backoff_initial, self.backoff_max)
        except (TypeError, ValueError):
            bad.append(f"backoff_initial={self.backoff_initial!r}, backoff_max={self.backoff_max!r} "
                       "(need 0 < backoff_initial <= backoff_max)")
        if bad:
            raise ConfigurationError("bad DLRecoverManager arguments: " + "; ".join(bad))
        object.__setattr__(self, "channel_options", channel_options(self.channel_options))


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def channel_options(options: Iterable[tuple[str, int | str]]) -> tuple[tuple[str, int | str], ...]:
    out = tuple(tuple(o) for o in options)
    for option in out:
        if len(option) != 2 or not isinstance(option[0], str):
            raise ConfigurationError(f"channel_options entries must be (name, value) pairs, got {option!r}")
    return out  # type: ignore[return-value]


def client_info(info: object) -> recover_pb2.ClientInfo:
    """A private copy of `info`, with this process's host and pid filled in when empty."""
    if not isinstance(info, recover_pb2.ClientInfo):
        raise TypeError(f"info must be a recover_pb2.ClientInfo, got {type(info).__name__}")
    if not info.jobId:
        raise ConfigurationError("ClientInfo.jobId is empty; every call needs the job id")
    return with_identity(info)


def with_identity(info: recover_pb2.ClientInfo) -> recover_pb2.ClientInfo:
    """A copy with host and pid set: `taskd status` shows them, and a re-register must keep them."""
    copy = recover_pb2.ClientInfo()
    copy.CopyFrom(info)
    if not copy.host:
        copy.host = socket.gethostname()
    if not copy.pid:
        copy.pid = os.getpid()
    return copy


def frame(value: object) -> str:
    if value not in FRAMES:
        raise ValueError(f"unknown frame {value!r}; known: {', '.join(FRAMES)}")
    return str(value)


def handler(name: object, fn: object) -> tuple[str, Callable[..., Any] | None]:
    if not isinstance(name, str) or not name:
        raise ValueError(f"handler name must be a non-empty string, got {name!r}")
    if name not in HANDLER_NAMES:
        raise ValueError(
            f"unknown action or signal type {name!r}; actions: {', '.join(ACTIONS)}; "
            f"signal types: {', '.join(SIGNAL_TYPES)}"
        )
    if fn is not None and not callable(fn):
        raise TypeError(f"handler for {name!r} is not callable: {fn!r}")
    return name, fn


def int32(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise BadArgument(f"{what} must be a 32-bit integer, got {value!r}")
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise BadArgument(f"{what} must be an integer, got {value!r}") from None
    if not _INT32[0] <= number <= _INT32[1]:
        raise BadArgument(f"{what} must be a 32-bit integer, got {value!r}")
    return number


def _rank(value: object) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise BadArgument(f"rank must be a non-negative integer, got {value!r}")


def report_fault_ranks(value: object) -> FaultRanks:
    """TaskD-style `{rank: 0|1|2}` (ints or numeric strings) -> `FaultRanks`; BadArgument otherwise."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadArgument(f"fault_ranks must be a dict {{rank: fault_type}}, got {type(value).__name__}")
    ranks = {_rank(rank): kind.strip() if isinstance(kind, str) else kind for rank, kind in value.items()}
    for rank, kind in ranks.items():
        if isinstance(kind, bool) or not isinstance(kind, (int, str)) or int32_or_none(kind) is None:
            raise BadArgument(f"fault type of rank {rank} must be 0, 1 or 2, got {kind!r}")
    try:
        return fault_ranks({rank: int(kind) for rank, kind in ranks.items()})
    except ValueError as exc:
        raise BadArgument(str(exc)) from None


def fault_detail(detail: object, fault_codes: object) -> str:
    """`detail`, with TaskD's `fault_codes` ({rank: code}, from MindIO) appended so the controller keeps them."""
    text = str(detail or "")
    if fault_codes is None:
        return text
    if not isinstance(fault_codes, Mapping):
        raise BadArgument(f"fault_codes must be a dict {{rank: code}} or None, got {type(fault_codes).__name__}")
    if not fault_codes:
        return text
    codes = "fault codes " + ", ".join(f"rank {_rank(rank)}: {code}" for rank, code in fault_codes.items())
    return f"{text}; {codes}" if text else codes


def int32_or_none(value: object) -> int | None:
    try:
        return int32(value, "value")
    except BadArgument:
        return None


def strategies(values: Iterable[object] | str | None) -> list[str]:
    """The offered strategies: a typo must fail here, not be silently ignored by the controller."""
    if values is None:
        return []
    if not isinstance(values, str):
        values = list(values)
        for value in values:
            if not isinstance(value, str):
                raise ValueError(
                    f"strategy_list must hold strategy names, got {value!r}; known: {', '.join(Strategy.KNOWN)}"
                )
    return parse_strategies(values, Strategy.KNOWN)  # type: ignore[arg-type]


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    """taskd.worker.env's parser (the one for every integer variable), with the client's error type."""
    try:
        value = worker_env_int(name, default, env)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    return default if value is None else value
