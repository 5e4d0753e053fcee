"""Agent configuration, read from the environment so that msrun can build the plugin with no arguments.

An `AgentConfig` checks itself when it is built: a bad value is refused naming the field and, when
known, the TASKD_* variable or the `taskd run` flag it came from (`origins`).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from taskd.vocabulary import Strategy, parse_strategies
from taskd.worker.env import env_float, env_int

# Strategies an agent offers by default: restarting one rank mid-training breaks MindSpore's
# collectives, so under msrun only whole-job restarts are offered.
DEFAULT_STRATEGIES = {
    "taskd": [Strategy.RETRY, Strategy.RECOVER, Strategy.JOB_RESCHEDULING, Strategy.EXIT],  # retry: live ranks only
    "msrun": [Strategy.JOB_RESCHEDULING, Strategy.EXIT],
}

# Where from_env reads each setting: a bad value's error names the variable to fix.
ENV_NAMES = {
    "job_id": "MINDX_TASK_ID", "server": "MINDX_SERVER_IP",
    "node_rank": "TASKD_NODE_RANK", "node_count": "TASKD_NNODES", "ranks_per_node": "TASKD_NPROC_PER_NODE",
    "strategies": "TASKD_STRATEGIES", "max_restarts": "TASKD_MAX_RESTARTS",
    "monitor_interval": "TASKD_MONITOR_INTERVAL", "stop_grace": "TASKD_STOP_GRACE",
    "controller_timeout": "TASKD_CONTROLLER_TIMEOUT", "heartbeat_timeout": "TASKD_HEARTBEAT_TIMEOUT",
    "log_dir": "TASKD_LOG_DIR", "scheduler_grace": "TASKD_SCHEDULER_GRACE", "join_timeout": "TASKD_JOIN_TIMEOUT",
    "node_rejoin_timeout": "TASKD_NODE_REJOIN_TIMEOUT",
}
_INT_VARS = ("node_rank", "node_count", "ranks_per_node", "max_restarts")
_FLOAT_VARS = ("monitor_interval", "stop_grace", "controller_timeout", "heartbeat_timeout", "scheduler_grace",
               "join_timeout", "node_rejoin_timeout")
_TEXT_VARS = ("job_id", "server", "log_dir")

# (field, lowest allowed, whether the lowest is allowed, may be None)
_BOUNDS = (
    ("max_restarts", 0, True, False), ("monitor_interval", 0, False, False), ("stop_grace", 0, True, False),
    ("controller_timeout", 0, True, False), ("heartbeat_timeout", 0, False, True), ("dump_timeout", 0, False, False),
    ("scheduler_grace", 0, True, False), ("join_timeout", 0, False, False), ("node_rejoin_timeout", 0, False, False),
    ("node_rank", 0, True, True), ("node_count", 1, True, True), ("ranks_per_node", 1, True, True),
)


@dataclass
class AgentConfig:
    """Everything the agent needs to know; `None` means "derive it when the job starts"."""

    launcher: str = "msrun"  # "msrun" or "taskd": decides the default strategies
    job_id: str | None = None
    server: str | None = None  # host[:port]; None = the embedded controller the caller hands in
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
    # multi-node msrun: how long an agent whose ranks all finished waits for the controller to say the
    # whole job ended (node 0 keeps msrun's scheduler meanwhile, which the other nodes' ranks still use)
    scheduler_grace: float = 60.0
    # multi-node: how long an agent waits, before starting any rank, for every node of the job to register
    # with the controller (torchrun's rendezvous join_timeout, 600 s); then it exits 1 naming the missing nodes
    join_timeout: float = 600.0
    # node loss: a replacement waits this long for the round's strategy (the controller's --node-rejoin-timeout
    # bounds the round on its side); a standby joins with no node and waits for one to be assigned to it
    node_rejoin_timeout: float = 300.0
    standby: bool = False
    # field -> the variable or flag that set it, named by a validation error (not part of the settings)
    origins: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.strategies, (str, tuple)):
            self.strategies = self._parse_strategies(self.strategies)
        self.validate()

    @classmethod
    def from_env(cls, origins: Mapping[str, str] | None = None, **overrides: object) -> AgentConfig:
        """Build from TASKD_* / MINDX_* variables; keyword overrides win (`origins` names their flags)."""
        known = {f.name for f in fields(cls)} - {"origins"}
        for key in overrides:
            if key not in known:
                raise TypeError(f"unknown agent setting {key!r}; known: {', '.join(sorted(known))}")
        values: dict[str, object] = {}
        where: dict[str, str] = {}
        for name, var in ENV_NAMES.items():
            if overrides.get(name) is not None:
                continue  # a flag wins: a bad variable it overrides is not the user's problem
            try:
                if name in _INT_VARS:
                    value: object = env_int(var)
                elif name in _FLOAT_VARS:
                    value = env_float(var)
                elif name == "strategies":
                    value = cls._parse_strategies(os.environ.get(var, ""), f" ({var})") or None
                else:
                    value = os.environ.get(var) or None
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
            if value is not None:
                values[name], where[name] = value, var
        for key, value in overrides.items():
            if value is not None:
                values[key] = value
                where.pop(key, None)
                if origins and key in origins:
                    where[key] = origins[key]
        return cls(**values, origins=where)  # type: ignore[arg-type]

    @staticmethod
    def _parse_strategies(text: str | list[str] | tuple[str, ...], origin: str = "") -> list[str]:
        try:
            return parse_strategies(text)
        except ValueError as exc:
            raise ValueError(f"strategies{origin}: {exc}") from None

    def validate(self) -> None:
        """Refuse a bad value, naming the field and where it came from."""
        if self.launcher not in DEFAULT_STRATEGIES:
            raise ValueError(f"launcher must be one of {sorted(DEFAULT_STRATEGIES)}, not {self.launcher!r}")
        self._parse_strategies(self.strategies, self._origin("strategies"))
        for name, lowest, inclusive, optional in _BOUNDS:
            value = getattr(self, name)
            if value is None and optional:
                continue
            integral = name in _INT_VARS
            if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)):
                kind = "an integer" if integral else "a number"
                raise ValueError(f"{name}{self._origin(name)} must be {kind}, not {value!r}")
            if value < lowest or (value == lowest and not inclusive):
                rule = f">= {lowest}" if inclusive else f"> {lowest}"
                raise ValueError(f"{name}{self._origin(name)} must be {rule}, not {value}")
        for name in _TEXT_VARS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}{self._origin(name)} must be a string, not {value!r}")

    def _origin(self, name: str) -> str:
        source = self.origins.get(name)
        return f" ({source})" if source else ""

    @property
    def offered_strategies(self) -> list[str]:
        return list(self.strategies) or list(DEFAULT_STRATEGIES[self.launcher])


def new_job_id(launcher: str) -> str:
    """The id of a job nobody named (no MINDX_TASK_ID): unique enough for one controller."""
    return f"{launcher}-{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
