"""RunConfig: everything `taskd run` was asked to do, checked once, where it is built.

`RunConfig.from_args` maps flags (and, for absent flags, the environment) to fields and parses
torchrun's value forms (`--nnodes 1:4`, `--nproc-per-node auto`, `-r 0:1,1:2`). The constructor
checks every field and raises RunConfigError with one line per problem, each naming the flag or
variable the value came from.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from taskd.run_config.flags import flag_name
from taskd.run_config.parse import LAUNCH_MODES, RunConfigError
from taskd.settings import RUN_SETTINGS, WARM_SPARE_MODES, default


def _find_module(name: str) -> bool:
    """Whether `python -m name` (run from this directory) finds the top-level package, without importing it."""
    top = name.split(".")[0]
    return importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path]) is not None or \
        top in sys.builtin_module_names


def _log_dir_problem(path: str) -> str | None:
    """Whether `path` is, or can become, a writable directory (checked without creating it)."""
    probe = os.path.abspath(path)
    if os.path.exists(probe) and not os.path.isdir(probe):
        return f"{path} exists and is not a directory"
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"cannot create {path}: {probe} is not a directory"
    return None if os.access(probe, os.W_OK | os.X_OK) else f"cannot create {path}: {probe} is not writable"


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One `taskd run`: what to start on this node, where the job meets, and how it recovers.

    `sources` maps a field to the flag or variable its value came from; errors name it. A field
    absent from `sources` was a default (and errors name its flag).
    """

    entrypoint: tuple[str, ...]  # a rank's full argv
    script: str
    script_args: tuple[str, ...]
    launch_mode: str  # script | module (-m) | no-python | run-path
    nproc_per_node: int = default("ranks_per_node")
    nnodes: int = default("node_count")
    # torchrun's MIN of MIN:MAX: the job starts with nnodes, and may go on with MIN after a node loss (scale-in,
    # taskd.controller.nodes.resize) if its ranks declared a resize hook; 0 (or nnodes) = a fixed-size job
    min_nnodes: int = default("min_nodes")
    node_rank: int = default("node_rank")
    standby: bool = default("standby")  # a spare node: no node rank until the controller assigns it a lost one's
    metrics_listen: str | None = default("metrics_listen")  # this node's Prometheus metrics (agent/watches/metrics.py)
    drain_file: str | None = default("drain_file")  # the drain hook's file (agent/link/drain.py)
    job_id: str  # given, else generated (run_config/build.py)
    server: str | None = default("server")  # None = an embedded controller
    # a multi-node job without --server: node 0 hosts its controller here, next to the rendezvous endpoint (PORT + 1),
    # and the other nodes connect to it, each with the secret of TASKD_TOKEN_FILE (run_config/build.py)
    hosted_controller: str | None = None
    # how this agent authenticates to --server (paths; None: the TASKD_TOKEN_FILE / TASKD_TLS_* variable)
    token_file: str | None = default("token_file")
    tls_ca: str | None = default("tls_ca")
    tls_cert: str | None = default("tls_cert")
    tls_key: str | None = default("tls_key")
    standalone: bool = default("standalone")
    master_addr: str = default("master_addr")
    master_port: int = default("master_port")  # 0 = a free port (one-node jobs)
    max_restarts: int = default("max_restarts")
    strategies: tuple[str, ...] = default("strategies")  # empty = the agent's default
    monitor_interval: float = default("monitor_interval")
    stop_grace: float = default("stop_grace")
    heartbeat_timeout: float | None = default("heartbeat_timeout")
    straggler_factor: float | None = default("straggler_factor")
    straggler_interval: float = default("straggler_interval")
    migrate_stragglers: bool = default("migrate_stragglers")
    dump_timeout: float = default("dump_timeout")
    warm_spares: int = default("warm_spares")
    warm_spare_mode: str = default("warm_spare_mode")
    snapshot_memory: str | None = default("snapshot_memory")  # None: TASKD_SNAPSHOT_MEMORY's default, half of /dev/shm
    snapshot_persist_dir: str | None = default("snapshot_persist_dir")  # None: snapshots stay in memory only
    snapshot_persist_every: int = default("snapshot_persist_every")
    snapshot_persist_keep: int = default("snapshot_persist_keep")
    quiet: bool = default("quiet")
    log_dir: str | None = default("log_dir")
    redirects: Mapping[int, int] = field(default_factory=dict)  # local rank -> 0 none, 1 out, 2 err, 3 both
    tee: Mapping[int, int] = field(default_factory=dict)
    local_ranks_filter: frozenset[int] | None = None  # None = every local rank on the console
    role: str = default("role")
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    # --rdzv-conf join_timeout: the agent's wait for every node (None: TASKD_JOIN_TIMEOUT, else its default)
    join_timeout: float | None = None
    # --rdzv-conf last_call_timeout: a MIN:MAX job's wait for more nodes once MIN joined (None: its default)
    last_call_timeout: float | None = None
    # one line each, for flags that mean less under taskd than under torchrun
    notices: tuple[str, ...] = field(default_factory=tuple)
    from_environment: tuple[str, ...] = field(default_factory=tuple)  # "nnodes=2 (SLURM_NNODES)"
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = self._problems()
        if problems:
            raise RunConfigError(problems)

    def _src(self, name: str) -> str:
        return self.sources.get(name) or flag_name(name)

    def _problems(self) -> list[str]:
        out: list[str] = []

        def check(name: str, ok: bool, rule: str) -> None:
            if not ok:
                out.append(f"{self._src(name)} must be {rule}, not {getattr(self, name)!r}")

        for s in RUN_SETTINGS:  # the bounds of taskd/settings.py; node_rank's depends on nnodes, below
            value = getattr(self, s.run)
            if s.bound is not None and s.name != "node_rank" and value is not None:
                check(s.run, s.bound.allows(value), s.bound.rule)
        if self.nnodes >= 1 and not self.standby:
            check("node_rank", 0 <= self.node_rank < self.nnodes, f"in [0, {self.nnodes - 1}] (nnodes {self.nnodes}"
                  f"{' from ' + self.sources['nnodes'] if 'nnodes' in self.sources else ''})")
        check("master_port", 0 <= self.master_port <= 65535, "in [0, 65535]")
        check("warm_spare_mode", self.warm_spare_mode in WARM_SPARE_MODES, " or ".join(WARM_SPARE_MODES))
        from taskd.launcher.snapshots import is_memory  # the launcher's package, only once a config is checked

        check("snapshot_memory", self.snapshot_memory is None or is_memory(self.snapshot_memory),
              "bytes, e.g. 2G, 512M or 1000000")
        if self.launch_mode not in LAUNCH_MODES:
            out.append(f"launch_mode must be one of {', '.join(LAUNCH_MODES)}, not {self.launch_mode!r}")
        if not self.entrypoint or not self.job_id:
            out.append("entrypoint and job_id must not be empty")
        if self.standalone and self.server:
            out.append(f"{self._src('server')}: --standalone runs the job's own embedded controller; drop one")
        if self.standby and not self.server and not self.hosted_controller:
            out.append("--standby joins a running job as a spare node: it needs the job's controller (--server "
                       "HOST:PORT or MINDX_SERVER_IP, or node 0's beside --rdzv-endpoint)")
        if self.standalone and self.nnodes != 1:
            out.append(f"{self._src('nnodes')}: --standalone is a one-node job, not {self.nnodes} nodes")
        for name in ("redirects", "tee"):
            bad = {lr: v for lr, v in getattr(self, name).items() if not 0 <= lr < self.nproc_per_node
                   or v not in (0, 1, 2, 3)}
            if bad:
                out.append(f"{self._src(name)}: local rank -> 0..3 for ranks 0..{self.nproc_per_node - 1}, not {bad}")
        out += self._strategy_problems() + self._address_problems() + self._script_problems()
        if self.log_dir and (why := _log_dir_problem(self.log_dir)):
            out.append(f"{self._src('log_dir')}: {why}")
        return out

    def _strategy_problems(self) -> list[str]:
        from taskd.vocabulary import parse_strategies

        try:
            parse_strategies(list(self.strategies))
        except ValueError as exc:
            return [f"{self._src('strategies')}: {exc}"]
        return []

    def _address_problems(self) -> list[str]:
        from taskd.client.errors import ConfigurationError
        from taskd.client.rpc import normalize_address

        if not self.server:
            return []
        try:
            normalize_address(self.server)
        except ConfigurationError as exc:
            return [f"{self._src('server')}: {exc}"]
        return []

    def _script_problems(self) -> list[str]:
        script, src = self.script, self._src("script")
        if self.launch_mode == "module":
            if not all(part.isidentifier() for part in script.split(".")):
                return [f"-m {script}: not a module name (pkg.module)"]
            if not _find_module(script):
                return [f"-m {script}: no module {script.split('.')[0]!r} in the current directory or on sys.path"]
        elif self.launch_mode == "no-python" or (self.launch_mode == "script" and not script.endswith(".py")
                                                 and os.sep not in script):
            if os.sep in script:
                if not os.path.isfile(script) or not os.access(script, os.X_OK):
                    return [f"{src} {script}: no such executable file"]
            elif shutil.which(script) is None:
                return [f"{src} {script}: no such file or command on PATH"]
        elif not os.path.exists(script):
            return [f"{src} {script}: no such file"]
        return []

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> RunConfig:
        """Flags (parsed by add_run_arguments) over the environment over defaults; RunConfigError lists all problems."""
        from taskd.run_config.build import build

        return build(cls, args, os.environ if environ is None else environ)

    def environment_line(self) -> str | None:
        return "from the environment: " + ", ".join(self.from_environment) if self.from_environment else None
