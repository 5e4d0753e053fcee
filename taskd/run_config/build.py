"""RunConfig.from_args: flags over the environment over defaults, every problem collected at once."""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from taskd.run_config.environment import environment_values
from taskd.run_config.flags import NOTICES, flag_name
from taskd.run_config.parse import (
    DEFAULT_MASTER_PORT,
    NUMA_MODES,
    START_METHODS,
    RunConfigError,
    parse_nnodes,
    parse_nproc,
    parse_rank_set,
    parse_rdzv_conf,
    parse_std,
)
from taskd.settings import RUN_SETTINGS, env_text, setting

TOKEN_FILE_VAR = setting("token_file").env  # the client's (client/credentials.py), read through the table
T = TypeVar("T")
C = TypeVar("C")
NOT_FLAGS = frozenset({"command", "verbose", "script", "script_args"})


def _int(text: Any) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None


def _float(text: Any) -> float:
    try:
        return float(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None


def _switch(value: Any) -> bool:
    return value is True or str(value).strip() not in ("", "0", "False")


class _Values:
    """Raw values with where each came from; parse() records problems instead of stopping at the first."""

    def __init__(self) -> None:
        self.raw: dict[str, tuple[Any, str]] = {}
        self.sources: dict[str, str] = {}
        self.problems: list[str] = []
        self.notices: list[str] = []
        self.from_env: list[str] = []

    def __contains__(self, dest: str) -> bool:
        return dest in self.raw

    def parse(self, dest: str, parser: Callable[[Any], T], default: T) -> T:
        if dest not in self.raw:
            return default
        value, source = self.raw[dest]
        try:
            parsed = parser(value)
        except ValueError as exc:
            self.problems.append(f"{source}: {exc}")
            return default
        self.sources[dest] = source
        return parsed


def _resolve_aliases(values: _Values, standalone: bool) -> None:
    """torchrun's names for taskd settings: --rdzv-id is the job id, --rdzv-endpoint node 0's MASTER_ADDR:PORT."""
    raw = values.raw
    if "rdzv_id" in raw:
        rdzv_id, source = raw.pop("rdzv_id")
        if "job_id" in raw and raw["job_id"][0] != rdzv_id:
            values.problems.append(f"{source} {rdzv_id!r} and {raw['job_id'][1]} {raw['job_id'][0]!r} name "
                                   "different jobs; give one")
        elif rdzv_id != TORCHRUN_RDZV_ID:  # torchrun's default value, i.e. not given
            raw.setdefault("job_id", (rdzv_id, source))
    if "shutdown_timeout" in raw:
        grace, source = raw.pop("shutdown_timeout")
        if "stop_grace" in raw and raw["stop_grace"][0] != grace:
            values.problems.append(f"{source} and {raw['stop_grace'][1]} disagree; give one")
        raw.setdefault("stop_grace", (grace, source))
    if standalone and "master_port" in raw:  # torchrun's standalone picks its own port: two such jobs share a host
        port, source = raw.pop("master_port")
        values.notices.append(f"{source} {port}: ignored with --standalone (as torchrun does): a free port")
    if "rdzv_endpoint" in raw:
        endpoint, source = raw.pop("rdzv_endpoint")
        if standalone:
            values.notices.append(f"{source} {endpoint}: ignored with --standalone (as torchrun does)")
            return
        from taskd.address import parse_host_port

        try:
            host, port = parse_host_port(endpoint, DEFAULT_MASTER_PORT, what="endpoint", forms="HOST[:PORT]")
        except ValueError as exc:
            values.problems.append(f"{source}: {exc}")
            return
        raw.setdefault("master_addr", (host, source))
        raw.setdefault("master_port", (str(port), source))


def _gather(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[_Values, bool]:
    values = _Values()
    for dest, value in vars(args).items():
        if value is not None and not dest.startswith("_") and dest not in NOT_FLAGS:
            values.raw[dest] = (value, flag_name(dest))
    candidates, problems = environment_values(environ)
    values.problems += problems
    pet = [c for c in candidates if c.source.startswith("PET_")]
    for cand in pet:  # torchrun's flag defaults: the same level as the flags
        if cand.dest not in values:
            values.raw[cand.dest] = (cand.value, cand.source)
            values.from_env.append(f"{cand.dest}={cand.value} ({cand.source})")
    standalone = "standalone" in values and _switch(values.raw["standalone"][0])
    _resolve_aliases(values, standalone)
    if not standalone:  # a standalone job is local: no cluster variable applies
        for cand in candidates[len(pet):]:
            if cand.dest not in values:
                values.raw[cand.dest] = (cand.value, cand.source)
                values.from_env.append(f"{cand.dest}={cand.value} ({cand.source})")
    return values, standalone


def _entrypoint(values: _Values, script: str, script_args: list[str]) -> tuple[str, list[str]]:
    from taskd.launcher.spec import command_for

    module, no_python, run_path = (values.parse(d, _switch, False) for d in ("module", "no_python", "run_path"))
    if module and no_python:
        values.problems.append("-m/--module and --no-python cannot be combined (torchrun refuses it too)")
    if run_path:
        return "run-path", [sys.executable, "-u", script, *script_args]
    if no_python:
        return "no-python", [script, *script_args]
    if module:
        return "module", [sys.executable, "-u", "-m", script, *script_args]
    return "script", command_for(script, script_args)


def build(cls: type[C], args: argparse.Namespace, environ: Mapping[str, str]) -> C:
    """A `cls` (RunConfig, passed in so that this module does not import it back) from flags and environment."""
    values, standalone = _gather(args, environ)
    script, script_args = args.script, list(args.script_args or [])
    launch_mode, entrypoint = _entrypoint(values, script, script_args)
    min_nnodes, nnodes = values.parse("nnodes", parse_nnodes, (1, 1))
    if min_nnodes == nnodes:
        min_nnodes = 0  # a fixed-size job (RunConfig.min_nnodes)
    else:
        values.notices.append(f"{values.sources['nnodes']} {min_nnodes}:{nnodes}: once nodes 0..{min_nnodes - 1} "
                              "joined, the job starts after a last call (--rdzv-conf last_call_timeout) with the "
                              f"nodes present and grows when more arrive; after a node loss it may go on with "
                              f"{min_nnodes} (scale-in, if every rank has LiveGroup(on_resize=...))")
    nproc, how = values.parse("nproc_per_node", lambda t: parse_nproc(str(t), environ), (1, ""))
    if how:
        values.notices.append(f"{values.sources['nproc_per_node']} {values.raw['nproc_per_node'][0]}: "
                              f"{nproc} rank(s), one per {how}")
    for dest, choices in (("start_method", START_METHODS), ("numa_binding", NUMA_MODES)):
        if dest in values and values.raw[dest][0] not in choices:
            values.problems.append(f"{values.raw[dest][1]}: {values.raw[dest][0]!r} is not one of {', '.join(choices)}")
    values.notices += [f"{values.raw[d][1]}: {text}" for d, text in NOTICES.items() if d in values]
    server = values.parse("server", str, None)
    hosted = _hosted_controller(values, nnodes, environ) if nnodes > 1 and not server and not standalone else None
    redirects = values.parse("redirects", lambda t: parse_std(str(t), nproc), {})
    tee = values.parse("tee", lambda t: parse_std(str(t), nproc), {})
    log_dir = values.parse("log_dir", str, None)
    if log_dir is None and any((*redirects.values(), *tee.values())):
        log_dir = tempfile.mkdtemp(prefix="taskd-logs-")
        values.notices.append(f"--redirects/--tee without --log-dir: rank logs go to {log_dir}")
    rdzv_conf = values.parse("rdzv_conf", lambda t: parse_rdzv_conf(str(t)), {})
    fields: dict[str, Any] = {s.run: values.parse(s.run, PARSERS[s.kind], s.default) for s in RUN_SETTINGS
                              if s.run not in SPECIAL}  # the plain ones: flag, variable or taskd/settings.py
    fields.update(
        entrypoint=tuple(entrypoint), script=script, script_args=tuple(script_args), launch_mode=launch_mode,
        nproc_per_node=nproc, nnodes=nnodes, min_nnodes=min_nnodes, standalone=standalone,
        job_id=_job_id(values, nnodes, standalone),
        server=server, hosted_controller=hosted,
        master_port=values.parse("master_port", _int, 0 if nnodes == 1 else DEFAULT_MASTER_PORT),
        log_dir=log_dir, redirects=redirects, tee=tee,
        local_ranks_filter=values.parse("local_ranks_filter", lambda t: parse_rank_set(str(t)), None),
        rdzv_conf=rdzv_conf, join_timeout=_rdzv_seconds(values, rdzv_conf, "join_timeout"),
        last_call_timeout=_rdzv_seconds(values, rdzv_conf, "last_call_timeout"),
    )
    if "job_id" in values.raw:
        values.sources.setdefault("job_id", values.raw["job_id"][1])
    problems = list(values.problems)
    try:
        config = cls(**fields, notices=tuple(values.notices), from_environment=tuple(values.from_env),
                     sources=dict(values.sources))
    except RunConfigError as exc:
        raise RunConfigError(problems + exc.problems) from None
    if problems:
        raise RunConfigError(problems)
    return config


def _hosted_controller(values: _Values, nnodes: int, environ: Mapping[str, str]) -> str | None:
    """Where node 0's `taskd run` hosts a multi-node job's controller when no --server is given: next to the
    rendezvous endpoint (torchrun's unchanged `--rdzv-endpoint HOST:PORT` line, issue 32 F5), on PORT + 1, every
    node authenticated by the secret in TASKD_TOKEN_FILE (or --token-file). None, with a problem saying exactly
    what to add, when the line has no endpoint or no secret."""
    nodes = f"{values.sources.get('nnodes', '--nnodes')} {nnodes}"
    if "master_addr" not in values:
        values.problems.append(
            f"{nodes}: a job of several nodes needs one controller for all of them: add --rdzv-endpoint HOST:PORT "
            "(node 0's address; node 0's taskd run then hosts the controller, and every node needs "
            f"{TOKEN_FILE_VAR}, see docs/pytorch.md), or run `taskd server` on one host and pass --server HOST:PORT "
            "(or set MINDX_SERVER_IP)")
        return None
    host = str(values.raw["master_addr"][0])
    port = values.parse("master_port", _int, DEFAULT_MASTER_PORT)
    where = values.raw["master_addr"][1]
    if not 0 < port < 65535:
        values.problems.append(f"{values.sources.get('master_port', where)} {port}: node 0 hosts the job's "
                               "controller on the next port, so the port must be 1..65534")
        return None
    from taskd.address import join_host_port

    address = join_host_port(host, port + 1)
    if "token_file" not in values and not env_text("token_file", environ):
        values.problems.append(
            f"{nodes} with {where} and no --server: node 0's taskd run hosts the job's controller at {address}, and "
            f"every node must prove it belongs to the job: put one secret in a file every node can read "
            f"(`openssl rand -hex 32 > FILE; chmod 600 FILE`, or a Slurm/Kubernetes secret) and set "
            f"{TOKEN_FILE_VAR}=FILE on every node (or pass --token-file FILE); or run `taskd server` and pass --server")
        return None
    return address


def _job_id(values: _Values, nnodes: int, standalone: bool) -> str:
    """The job id given, else one of our own for a one-node job, else torchrun's default rendezvous id "none":
    every node of a multi-node line must name the same job, and one that made up its own id waited for nodes
    that registered under theirs (issue 21, D5). An empty MINDX_TASK_ID counts as not given."""
    given = values.parse("job_id", str, "").strip()
    if given:
        return given
    if nnodes > 1 and not standalone:
        values.notices.append(f"no --rdzv-id or --job-id: the job id is {TORCHRUN_RDZV_ID!r}, torchrun's default, "
                              "so that every node names the same job; give each job on one controller its own id")
        return TORCHRUN_RDZV_ID
    return f"taskd-{uuid.uuid4().hex[:8]}"


TORCHRUN_RDZV_ID = "none"


def _rdzv_seconds(values: _Values, rdzv_conf: Mapping[str, str], key: str) -> float | None:
    """torchrun's `--rdzv-conf join_timeout=N` (how long a node waits for the others) or `last_call_timeout=N`
    (a MIN:MAX job's wait for more once MIN joined): None when not given."""
    if key not in rdzv_conf:
        return None
    source = f"{values.sources.get('rdzv_conf', '--rdzv-conf')} {key}"
    try:
        seconds = _float(rdzv_conf[key])
    except ValueError as exc:
        values.problems.append(f"{source}: {exc}")
        return None
    values.sources[key] = source
    return seconds


def _strategies(text: Any) -> tuple[str, ...]:
    from taskd.vocabulary import parse_strategies

    return tuple(parse_strategies(str(text)))


PARSERS: dict[type, Callable[[Any], Any]] = {int: _int, float: _float, str: str, bool: _switch, tuple: _strategies}
# settings parsed above with torchrun's forms (N|MIN:MAX, auto|cpu|gpu) or from two flags (--rdzv-conf's)
SPECIAL = frozenset({"job_id", "server", "nnodes", "nproc_per_node", "log_dir", "join_timeout", "master_port",
                     "last_call_timeout"})
