"""Agent configuration, read from the environment so that msrun can build the plugin with no arguments.

Its settings (defaults, variables, bounds) are rows of taskd/settings.py's table. An `AgentConfig`
checks itself when it is built: a bad value is refused naming the field and, when known, the TASKD_*
variable or the `taskd run` flag it came from (`origins`).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from taskd.address import LOCAL_PROXY_ADDRESS, LOCAL_PROXY_ENV, local_proxy_enabled
from taskd.pace import check_factor
from taskd.settings import AGENT_SETTINGS, default, setting
from taskd.vocabulary import Strategy, parse_strategies
from taskd.worker.env import env_float, env_int

# Strategies an agent offers by default: restarting one rank mid-training breaks MindSpore's
# collectives, so under msrun only whole-job restarts are offered.
DEFAULT_STRATEGIES = {
    "taskd": [Strategy.RETRY, Strategy.RECOVER, Strategy.JOB_RESCHEDULING, Strategy.EXIT],  # retry: live ranks only
    "msrun": [Strategy.JOB_RESCHEDULING, Strategy.EXIT],
}

# Where from_env reads each setting (taskd/settings.py): a bad value's error names the variable to fix.
ENV_NAMES = {s.name: s.env for s in AGENT_SETTINGS if s.env}


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent needs to know; `None` means "derive it when the job starts". Frozen: what changes while
    the job runs (the node this agent holds, whether it is a standby) is the round machine's state."""

    # every field is a setting of taskd/settings.py, its default taken from there
    launcher: str = default("launcher")  # "msrun" or "taskd": decides the default strategies
    job_id: str | None = default("job_id")
    server: str | None = default("server")  # host[:port]; None = the embedded controller the caller hands in
    # None: derived when the job starts (taskd/settings.py's `derived`), e.g. node_rank from MONITOR's node_id
    node_rank: int | None = setting("node_rank").agent_default  # a standby's is the node it is assigned
    node_count: int | None = setting("node_count").agent_default  # MS_WORKER_NUM / ranks per node, else 1
    ranks_per_node: int | None = setting("ranks_per_node").agent_default  # the number of MONITOR entries
    min_nodes: int = default("min_nodes")  # scale-in's MIN (`--nnodes MIN:MAX`): see `scales`
    strategies: list[str] = field(default_factory=lambda: list(default("strategies")))  # empty: DEFAULT_STRATEGIES
    max_restarts: int = default("max_restarts")
    monitor_interval: float = default("monitor_interval")  # slow sweep; exits are seen at once through pidfds
    stop_grace: float = default("stop_grace")  # SIGTERM to SIGKILL when the agent stops ranks itself
    controller_timeout: float = default("controller_timeout")  # retrying an unreachable controller, then degrade
    heartbeat_timeout: float | None = default("heartbeat_timeout")  # None = no hang detection
    log_dir: str | None = default("log_dir")
    dump_timeout: float = default("dump_timeout")
    # multi-node msrun: how long an agent whose ranks all finished waits for the controller to say the
    # whole job ended (node 0 keeps msrun's scheduler meanwhile, which the other nodes' ranks still use)
    scheduler_grace: float = default("scheduler_grace")
    # multi-node: how long an agent waits, before starting any rank, for every node of the job to register
    # with the controller (torchrun's rendezvous join_timeout, 600 s); then it exits 1 naming the missing nodes
    join_timeout: float = default("join_timeout")
    # `--nnodes MIN:MAX`: the wait for more nodes once MIN joined (torchrun's last_call_timeout); node 0's hosted
    # controller applies it (a `taskd server` has its own --last-call-timeout)
    last_call_timeout: float = default("last_call_timeout")
    # node loss: a replacement waits this long for the round's strategy (the controller's --node-rejoin-timeout
    # bounds the round on its side); a standby joins with no node and waits for one to be assigned to it
    node_rejoin_timeout: float = default("node_rejoin_timeout")
    standby: bool = default("standby")
    metrics_listen: str | None = default("metrics_listen")  # HOST[:PORT] of this node's metrics (watches/metrics.py)
    straggler_factor: float | None = default("straggler_factor")  # None = no straggler reports (taskd/pace.py)
    straggler_interval: float = default("straggler_interval")
    migrate_stragglers: bool = default("migrate_stragglers")  # a sustained straggler moves to a warm spare
    drain_file: str | None = default("drain_file")  # the drain hook's file (agent/link/drain.py); None: off
    # field -> the variable or flag that set it, named by a validation error (not part of the settings)
    origins: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.strategies, (str, tuple)):
            object.__setattr__(self, "strategies", self._parse_strategies(self.strategies))
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
            kind = setting(name).kind
            try:
                if kind is tuple:
                    value: object = cls._parse_strategies(os.environ.get(var, ""), f" ({var})") or None
                elif kind in (int, float):
                    value = env_int(var) if kind is int else env_float(var)
                else:
                    value = os.environ.get(var) or None
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
            if value is not None:
                values[name], where[name] = value, var
        if "server" in values and local_proxy_enabled(os.environ):  # TaskD's rule: the node's proxy instead
            values["server"], where["server"] = LOCAL_PROXY_ADDRESS, f"{LOCAL_PROXY_ENV}=on"
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
        for s in AGENT_SETTINGS:
            value = getattr(self, s.name)
            if value is None and (s.optional or s.derived):
                continue
            if s.kind is str:
                if not isinstance(value, str):
                    raise ValueError(f"{s.name}{self._origin(s.name)} must be a string, not {value!r}")
            elif s.kind in (int, float):
                if isinstance(value, bool) or not isinstance(value, int if s.kind is int else (int, float)):
                    kind = "an integer" if s.kind is int else "a number"
                    raise ValueError(f"{s.name}{self._origin(s.name)} must be {kind}, not {value!r}")
                if s.bound is not None and not s.bound.allows(value):
                    raise ValueError(f"{s.name}{self._origin(s.name)} must be {s.bound.rule}, not {value}")

        if self.min_nodes and self.node_count is not None and self.min_nodes > self.node_count:
            raise ValueError(f"min_nodes{self._origin('min_nodes')} {self.min_nodes} is above the job's "
                             f"{self.node_count} node(s): MIN:MAX needs MIN <= MAX")
        if why := check_factor(self.straggler_factor):  # the table's bound lets inf through
            raise ValueError(f"straggler_factor{self._origin('straggler_factor')} {why}")
        if self.migrate_stragglers and self.straggler_factor is None:
            raise ValueError(f"migrate_stragglers{self._origin('migrate_stragglers')} needs a straggler factor "
                             "(--straggler-factor F): nothing names a straggler without one")
        if self.drain_file is not None:
            from taskd.agent.link.drain import check_drain_file

            if why := check_drain_file(self.drain_file):
                raise ValueError(f"drain_file{self._origin('drain_file')}: {why}")
        if self.metrics_listen is not None:
            from taskd.agent.watches.metrics import check_listen

            if why := check_listen(self.metrics_listen):
                raise ValueError(f"metrics_listen{self._origin('metrics_listen')}: {why}")

    def _origin(self, name: str) -> str:
        source = self.origins.get(name)
        return f" ({source})" if source else ""

    @property
    def scales(self) -> bool:
        """The job may go on with fewer nodes (`--nnodes MIN:MAX`, MIN < MAX), if its ranks have a resize hook."""
        return 0 < self.min_nodes < (self.node_count or 1)

    @property
    def offered_strategies(self) -> list[str]:
        return list(self.strategies) or list(DEFAULT_STRATEGIES[self.launcher])


def new_job_id(launcher: str) -> str:
    """The id of a job nobody named (no MINDX_TASK_ID): unique enough for one controller."""
    return f"{launcher}-{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
