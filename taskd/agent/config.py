"""Agent configuration, read from the environment so that msrun can build the plugin with no arguments."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field, fields

from taskd.vocabulary import Strategy, parse_strategies

# Strategies an agent offers by default (DESIGN.md): restarting one rank mid-training breaks
# MindSpore's collectives, so under msrun only whole-job restarts are offered.
DEFAULT_STRATEGIES = {
    "taskd": [Strategy.RECOVER, Strategy.JOB_RESCHEDULING, Strategy.EXIT],
    "msrun": [Strategy.JOB_RESCHEDULING, Strategy.EXIT],
}


def _env_int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _env_float(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


# Where from_env reads each setting: a bad value's error names the variable to fix.
ENV_NAMES = {
    "node_rank": "TASKD_NODE_RANK", "node_count": "TASKD_NNODES", "ranks_per_node": "TASKD_NPROC_PER_NODE",
    "max_restarts": "TASKD_MAX_RESTARTS", "monitor_interval": "TASKD_MONITOR_INTERVAL",
    "heartbeat_timeout": "TASKD_HEARTBEAT_TIMEOUT",
}


def _invalid(name: str, value: float, rule: str) -> ValueError:
    """`max_restarts (TASKD_MAX_RESTARTS) must be >= 0, not -1`: names the variable when it set the value."""
    env = ENV_NAMES.get(name, "")
    try:
        from_env = float(os.environ.get(env, "").strip()) == value
    except ValueError:
        from_env = False
    return ValueError(f"{name}{f' ({env})' if from_env else ''} must be {rule}, not {value}")


@dataclass
class AgentConfig:
    """Everything the agent needs to know; `None` means "derive it at start()"."""

    launcher: str = "msrun"  # "msrun" or "taskd": decides the default strategies
    job_id: str | None = None
    server: str | None = None  # host[:port]; None = run an embedded controller
    node_rank: int | None = None  # None = from MONITOR's node_id, else 0
    node_count: int | None = None  # None = MS_WORKER_NUM / ranks per node, else 1
    ranks_per_node: int | None = None  # None = number of MONITOR entries
    strategies: list[str] = field(default_factory=list)  # empty = DEFAULT_STRATEGIES[launcher]
    max_restarts: int = 3
    monitor_interval: float = 1.0  # slow MONITOR/psutil sweep; exits are seen at once through pidfds
    stop_grace: float = 5.0  # SIGTERM to SIGKILL when the agent stops ranks itself
    controller_timeout: float = 30.0  # how long to retry an unreachable controller before degrading
    heartbeat_timeout: float | None = None  # None = no hang detection
    log_dir: str | None = None
    dump_timeout: float = 30.0

    @classmethod
    def from_env(cls, **overrides: object) -> AgentConfig:
        """Build from TASKD_* / MINDX_* variables; keyword overrides win (used by `taskd run`)."""
        env = os.environ
        cfg = cls(
            job_id=env.get("MINDX_TASK_ID") or None,
            server=env.get("MINDX_SERVER_IP") or None,
            node_rank=_env_int("TASKD_NODE_RANK", None),
            node_count=_env_int("TASKD_NNODES", None),
            ranks_per_node=_env_int("TASKD_NPROC_PER_NODE", None),
            strategies=parse_strategies(env.get("TASKD_STRATEGIES", "")),
            max_restarts=_env_int("TASKD_MAX_RESTARTS", 3) or 0,
            monitor_interval=_env_float("TASKD_MONITOR_INTERVAL", 1.0),  # 0 is refused below, not made 1
            stop_grace=_env_float("TASKD_STOP_GRACE", 5.0) or 0.0,
            controller_timeout=_env_float("TASKD_CONTROLLER_TIMEOUT", 30.0) or 0.0,
            heartbeat_timeout=_env_float("TASKD_HEARTBEAT_TIMEOUT", None),
            log_dir=env.get("TASKD_LOG_DIR") or None,
        )
        known = {f.name for f in fields(cls)}
        for key, value in overrides.items():
            if key not in known:
                raise TypeError(f"unknown agent setting {key!r}; known: {', '.join(sorted(known))}")
            if value is not None:
                setattr(cfg, key, value)
        if isinstance(cfg.strategies, str):
            cfg.strategies = parse_strategies(cfg.strategies)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.launcher not in DEFAULT_STRATEGIES:
            raise ValueError(f"launcher must be one of {sorted(DEFAULT_STRATEGIES)}, not {self.launcher!r}")
        if self.max_restarts < 0:
            raise _invalid("max_restarts", self.max_restarts, ">= 0")
        if self.monitor_interval <= 0:
            raise _invalid("monitor_interval", self.monitor_interval, "> 0")
        if self.heartbeat_timeout is not None and self.heartbeat_timeout <= 0:
            raise _invalid("heartbeat_timeout", self.heartbeat_timeout, "> 0")
        for name in ("node_rank", "node_count", "ranks_per_node"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "node_rank" else 1):
                raise _invalid(name, value, ">= 0" if name == "node_rank" else ">= 1")

    @property
    def offered_strategies(self) -> list[str]:
        return list(self.strategies) or list(DEFAULT_STRATEGIES[self.launcher])

    def resolved_job_id(self) -> str:
        if not self.job_id:
            self.job_id = f"{self.launcher}-{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        return self.job_id
