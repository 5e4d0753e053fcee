"""taskd/settings.py is the one place of every setting: each config, flag and variable is derived from it or
checked against it here, and no default is written anywhere else in taskd/. No process, no network."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from taskd.agent.config import ENV_NAMES, AgentConfig
from taskd.controller.cli_commands import add_server_arguments, flag_dest, server_config
from taskd.controller.config import FLAGS, ControllerConfig
from taskd.run import agent_settings
from taskd.run_config import RunConfig, RunConfigError, add_run_arguments
from taskd.settings import AGENT_SETTINGS, RUN_SETTINGS, SETTINGS, Bound, Setting, _check, default, setting

ROOT = Path(__file__).resolve().parents[2]
WITH_ENV = [s for s in AGENT_SETTINGS if s.env]
BOUNDED_ENV = [s for s in WITH_ENV if s.bound is not None]
# node_rank's bound depends on nnodes; --nnodes is N|MIN:MAX, whose parser refuses 0 before the bound does
BOUNDED_FLAGS = [s for s in RUN_SETTINGS
                 if s.bound is not None and s.flags and s.name not in ("node_rank", "node_count")]
SERVER = [s for s in SETTINGS if s.server_field]


def _field_default(cls: type, name: str) -> object:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskd run")
    add_run_arguments(parser)
    return parser


def _run(argv: list[str]) -> RunConfig:
    return RunConfig.from_args(_run_parser().parse_args([*argv, "--no-python", "true"]), {})


def _below(bound: Bound, kind: type) -> str:
    """A value the bound refuses, as a flag or variable would give it."""
    value = bound.low if not bound.inclusive else bound.low - 1
    return str(value if kind is int else float(value))


# ------------------------------------------------------------------ the table itself

def test_the_table_refuses_a_contradiction_at_import() -> None:
    bad = [Setting("x", int, -1, "doc", Bound(0)), Setting("y", int, None, "doc"),
           Setting("z", float, 1, "doc"), Setting("w", int, 0, "doc", flags=("w",)),
           Setting("v", int, 0, "doc", scope="anywhere"),
           Setting("u", int, 0, "doc", flags=("--u",), env="U", scope="flag"),
           Setting("t", int, 0, "", flags=("--t",), scope="run"),
           Setting("s", int, 0, "doc", flags=("--s",), scope="run", help="a second text")]
    for entry in bad:
        with pytest.raises(AssertionError):
            _check((entry,))
    with pytest.raises(AssertionError, match="named twice"):
        _check((Setting("a", int, 0, "doc", env="TASKD_A"), Setting("b", int, 0, "doc", env="TASKD_A")))
    with pytest.raises(KeyError, match="no setting 'max_restart'"):
        default("max_restart")


# ------------------------------------------------------------------ AgentConfig and msrun's TASKD_* variables

@pytest.mark.parametrize("s", AGENT_SETTINGS, ids=lambda s: s.name)
def test_agent_config_defaults_are_the_tables(s: Setting) -> None:
    got = _field_default(AgentConfig, s.name)
    assert (list(got) if s.kind is tuple else got) == (list(s.default) if s.kind is tuple else s.agent_default)


def test_agent_config_has_a_field_for_every_agent_setting_and_no_other() -> None:
    fields = {f.name for f in dataclasses.fields(AgentConfig)} - {"origins"}
    assert fields == {s.name for s in AGENT_SETTINGS}
    assert ENV_NAMES == {s.name: s.env for s in WITH_ENV}


@pytest.mark.parametrize("s", WITH_ENV, ids=lambda s: s.env)
def test_the_agent_reads_the_tables_variable(monkeypatch: pytest.MonkeyPatch, s: Setting) -> None:
    for var in ENV_NAMES.values():
        monkeypatch.delenv(var, raising=False)
    text, value = {int: ("7", 7), float: ("7.5", 7.5), str: ("node-7:1", "node-7:1"),
                   tuple: ("exit", ["exit"])}[s.kind]
    monkeypatch.setenv(s.env, text)
    config = AgentConfig.from_env(launcher="taskd")
    assert getattr(config, s.name) == value
    assert config.origins[s.name] == s.env


@pytest.mark.parametrize("s", BOUNDED_ENV, ids=lambda s: s.env)
def test_the_agent_refuses_a_variable_out_of_bounds_naming_it(monkeypatch: pytest.MonkeyPatch, s: Setting) -> None:
    assert s.bound is not None
    monkeypatch.setenv(s.env, _below(s.bound, s.kind))
    with pytest.raises(ValueError, match=rf"^{s.name} \({s.env}\) must be {s.bound.rule}, not "):
        AgentConfig.from_env()


@pytest.mark.parametrize("s", [s for s in WITH_ENV if s.kind in (int, float)], ids=lambda s: s.env)
def test_the_agent_refuses_a_variable_that_is_no_number_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                                  s: Setting) -> None:
    monkeypatch.setenv(s.env, "lots")
    kind = "an integer" if s.kind is int else "a number"
    with pytest.raises(ValueError, match=rf"^{s.name}: {s.env}='lots' is not {kind}$"):
        AgentConfig.from_env()


# ------------------------------------------------------------------ RunConfig and `taskd run`'s flags

@pytest.mark.parametrize("s", RUN_SETTINGS, ids=lambda s: s.name)
def test_run_config_defaults_are_the_tables(s: Setting) -> None:
    """None on `taskd run` = not given: the agent decides (its variable, else the table's default)."""
    got = _field_default(RunConfig, s.run)
    if s.run == "job_id":  # build always sets it (given, else generated): a RunConfig built in code names it
        assert got is dataclasses.MISSING
        return
    assert got == s.default or (got is None and s.agent and s.env), f"RunConfig.{s.run} = {got!r}"


@pytest.mark.parametrize("s", [s for s in RUN_SETTINGS if s.flags], ids=lambda s: s.name)
def test_every_spelling_of_a_settings_flag_is_registered_as_its_field(s: Setting) -> None:
    actions = {opt: a for a in _run_parser()._actions for opt in a.option_strings}
    for flag in s.flags:
        assert actions[flag].dest == s.run and actions[flag].default is None, flag


def test_every_taskd_run_flag_is_a_row_of_the_table() -> None:
    """torchrun's flags too (scope "flag": no field of their own; run_config/build.py reads them)."""
    dests = {a.dest for a in _run_parser()._actions if a.option_strings} - {"help"}
    assert dests == {s.dest for s in SETTINGS if s.flags}, "a new flag: add its Setting row"
    spellings = {opt for a in _run_parser()._actions for opt in a.option_strings} - {"-h", "--help"}
    assert spellings == {flag for s in SETTINGS for flag in s.flags}


def test_the_launchers_flag_names_are_the_tables() -> None:
    """WorkerSpec names the `taskd run` flag of a bad field (launcher/spec.py's FLAGS): the same spelling."""
    from taskd.launcher.spec import FLAGS as SPEC_FLAGS

    shared = {s.run: s for s in RUN_SETTINGS if s.run in SPEC_FLAGS}
    assert {"max_restarts", "nnodes", "nproc_per_node", "warm_spares", "master_addr"} <= set(shared)
    assert {name: SPEC_FLAGS[name] for name in shared} == {name: s.flag for name, s in shared.items()}


def test_taskd_run_without_flags_gets_the_tables_defaults() -> None:
    config = _run([])
    for s in RUN_SETTINGS:
        if s.run not in ("job_id", "join_timeout", "last_call_timeout"):  # generated; the agent's
            assert getattr(config, s.run) == s.default, s.name


@pytest.mark.parametrize("s", BOUNDED_FLAGS, ids=lambda s: s.name)
def test_taskd_run_refuses_a_flag_out_of_bounds_naming_it(s: Setting) -> None:
    assert s.bound is not None
    with pytest.raises(RunConfigError) as info:
        _run([f"{s.flags[1] if len(s.flags) > 1 else s.flags[0]}={_below(s.bound, s.kind)}"])
    assert [p for p in info.value.problems if p.startswith(f"{s.flags[0]} must be {s.bound.rule}, not ")], \
        info.value.problems


def test_taskd_run_hands_the_agent_every_setting_it_has_a_flag_for_naming_its_source() -> None:
    config = _run(["--max_restarts", "2", "--rdzv-conf", "join_timeout=9", "--strategies", "exit"])
    values, origins = agent_settings(config)
    assert set(values) == set(origins) == {s.name for s in AGENT_SETTINGS if s.run}
    assert (values["max_restarts"], values["join_timeout"], values["strategies"]) == (2, 9.0, ["exit"])
    assert (origins["max_restarts"], origins["join_timeout"]) == ("--max-restarts", "--rdzv-conf join_timeout")
    assert origins["heartbeat_timeout"] == "--heartbeat-timeout" and values["heartbeat_timeout"] is None
    with pytest.raises(ValueError, match=r"max_restarts \(--max-restarts\) must be >= 0 and <= 10000, not -1"):
        AgentConfig.from_env(origins, launcher="taskd", **{**values, "max_restarts": -1})


def test_taskd_run_reads_the_variables_the_table_gives_it() -> None:
    env = {s.env: f"value-of-{s.name}" if s.kind is str else "7" for s in RUN_SETTINGS if s.run_env}
    config = RunConfig.from_args(_run_parser().parse_args(["--no-python", "true"]),
                                 {**env, "MINDX_SERVER_IP": "10.0.0.1:8899", "TASKD_SNAPSHOT_MEMORY": "2G"})
    assert (config.job_id, config.server, config.snapshot_memory) == ("value-of-job_id", "10.0.0.1:8899", "2G")
    assert (config.snapshot_persist_dir, config.snapshot_persist_every, config.snapshot_persist_keep) == \
        ("value-of-snapshot_persist_dir", 7, 7)
    assert config.sources["job_id"] == "MINDX_TASK_ID"
    with pytest.raises(RunConfigError, match="TASKD_SNAPSHOT_MEMORY must be bytes, e.g. 2G"):
        RunConfig.from_args(_run_parser().parse_args(["--no-python", "true"]), {"TASKD_SNAPSHOT_MEMORY": "lots"})
    with pytest.raises(RunConfigError, match="--snapshot-memory must be bytes"):
        RunConfig.from_args(_run_parser().parse_args(["--snapshot-memory", "2X", "--no-python", "true"]), {})


# ------------------------------------------------------------------ `taskd server`: the same settings, its flags

def _server_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskd server")
    add_server_arguments(parser)
    return parser


@pytest.mark.parametrize("s", SERVER, ids=lambda s: s.name)
def test_taskd_server_holds_the_same_setting_with_the_tables_default(s: Setting) -> None:
    assert FLAGS[s.server_field] == s.server_flag
    assert _field_default(ControllerConfig, s.server_field) == s.default
    assert getattr(_server_parser().parse_args([]), flag_dest(s.server_flag)) == s.default


def test_every_taskd_server_flag_reaches_its_controller_config_field() -> None:
    """server_config is derived from FLAGS: a flag missing there would be parsed and then ignored."""
    dests = {a.dest for a in _server_parser()._actions if a.option_strings} - {"help", "log_level"}
    assert dests == {flag_dest(flag) for flag in FLAGS.values()}
    assert set(FLAGS) <= {f.name for f in dataclasses.fields(ControllerConfig)}
    config = server_config(_server_parser().parse_args(["--max-restarts", "7", "--max-calls-per-second", "5"]))
    assert (config.default_max_restarts, config.calls_per_second_per_peer) == (7, 5.0)
    plain = server_config(_server_parser().parse_args([]))
    assert all(getattr(plain, name) == _field_default(ControllerConfig, name) for name in FLAGS if name != "token_file")


# ------------------------------------------------------------------ no default written anywhere else

# Names whose literal 0 / "" / () elsewhere is a protobuf message's "unset" (ClientInfo, the controller's
# events), not a copy of a default: scanning them would only find the wire.
WIRE = {"node_rank", "node_count", "ranks_per_node", "role", "job_id", "strategies", "quiet", "server", "log_dir",
        "standby",  # ClientInfo.standby / AgentRecord.standby: False is the wire's unset
        "launcher"}  # who runs an agent: each caller says (`AgentConfig.from_env(launcher="taskd")`), not a default
# (file, class): literal defaults that are not taskd run's or the agent's, and why.
ELSEWHERE = {
    # the launcher's programmatic API keeps torchrun's defaults where they differ from taskd run's; `taskd run`
    # passes every value. Its other defaults are the table's (`default(name)`).
    ("taskd/launcher/spec.py", "WorkerSpec"): {"max_restarts", "rdzv_store"},
}


# (file, parameter): a parameter named like a setting that holds something else, and what.
OTHER_MEANING = {
    ("taskd/worker/torch.py", "init_timeout"): "LiveGroup's rendezvous join (the rank side), not the client's Init",
}


def _scanned_names() -> dict[str, Setting]:
    out = {}
    for s in SETTINGS:
        if s.name not in WIRE and s.default is not None:
            out.update({n: s for n in (s.name, s.run, s.server_field) if n})
    return out


def _literal_defaults(text: str, where: str, names: dict[str, Setting]) -> list[str]:
    """Literal defaults of fields, parameters and `parse(name, parser, default)` calls named like a setting."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id in names
                        and isinstance(item.value, ast.Constant) and item.value.value is not None
                        and item.target.id not in ELSEWHERE.get((where, node.name), ())):
                    found.append(f"{node.name}.{item.target.id} = {item.value.value!r}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True),
                     *zip(args.kwonlyargs, args.kw_defaults, strict=True)]
            found += [f"{node.name}({a.arg}={d.value!r})" for a, d in pairs if a.arg in names
                      and isinstance(d, ast.Constant) and d.value is not None and (where, a.arg) not in OTHER_MEANING]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name) \
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "parse" and len(node.args) >= 3 \
                and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in names and isinstance(node.args[2], ast.Constant) \
                and node.args[2].value is not None:
            found.append(ast.unparse(node))  # values.parse("max_restarts", _int, 3)
        if isinstance(node, ast.Call):  # AgentConfig(max_restarts=3), for_agent(stop_grace=5.0)
            found += [f"{ast.unparse(node.func)}({k.arg}={k.value.value!r})" for k in node.keywords
                      if k.arg in names and isinstance(k.value, ast.Constant) and k.value.value is not None]
    return found


def test_no_default_is_written_outside_the_table() -> None:
    names = _scanned_names()
    assert {"max_restarts", "default_max_restarts", "join_timeout", "stop_grace"} <= set(names)
    found = []
    for path in sorted((ROOT / "taskd").rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")) or path.name == "settings.py":
            continue
        where = str(path.relative_to(ROOT))
        found += [f"{where}: {hit}" for hit in _literal_defaults(path.read_text(encoding="utf-8"), where, names)]
    assert found == [], "take these defaults from taskd/settings.py (default(name)):\n" + "\n".join(found)


def test_the_scan_finds_a_copied_default() -> None:
    text = ("class C:\n    max_restarts: int = 3\n    node_rank: int = 0\n    stop_grace: float = default('x')\n"
            "def f(stop_grace=5.0, heartbeat_timeout=None):\n    return parse('monitor_interval', float, 1.0)\n"
            "g(dump_timeout=30.0, node_rank=0, log_dir=None)\n")
    assert sorted(_literal_defaults(text, "taskd/x.py", _scanned_names())) == [
        "C.max_restarts = 3", "f(stop_grace=5.0)", "g(dump_timeout=30.0)", "parse('monitor_interval', float, 1.0)"]
    assert _literal_defaults("class WorkerSpec:\n    max_restarts: int = 0\n", "taskd/launcher/spec.py",
                             _scanned_names()) == []


def test_setting_names_its_flag_for_errors() -> None:
    assert setting("max_restarts").flag == "--max-restarts"
    assert setting("join_timeout").flag == "--rdzv-conf join_timeout" and setting("join_timeout").run == "join_timeout"
    assert setting("controller_timeout").run == "" and setting("node_count").run == "nnodes"


def test_a_ranks_client_reads_the_agents_variables() -> None:
    """taskd.client (which a rank may import without the agent) reads the same names as AgentConfig.from_env."""
    from taskd.client import current

    env = {setting("job_id").env: "job-7", setting("server").env: "127.0.0.1:1", setting("node_rank").env: "2",
           setting("node_count").env: "4", setting("ranks_per_node").env: "8"}
    manager = current.manager_from_env(env)
    try:
        info = manager.client_info
        assert (info.jobId, manager.server_addr, info.nodeRank, info.nodeCount, info.ranksPerNode) == (
            "job-7", "127.0.0.1:1", 2, 4, 8)
    finally:
        manager.stop()


def test_a_bound_refuses_nan_as_every_config_does() -> None:
    """NaN compares false with everything: AgentConfig let TASKD_STOP_GRACE=nan through before the table."""
    with pytest.raises(ValueError, match=r"stop_grace must be >= 0, not nan"):
        AgentConfig(stop_grace=float("nan"))
    with pytest.raises(RunConfigError, match=r"--stop-grace must be >= 0, not nan"):
        _run(["--stop-grace", "nan"])


# ------------------------------------------------------------------ no config dataclass with a literal default

CONFIG_NAME = re.compile(r"(Config|Spec|Settings|Options)$")


def _configs() -> list[type]:
    """Every config dataclass of taskd/: a class decorated with `dataclass` whose name ends in Config, Spec,
    Settings or Options, found by reading the source (a new config is covered without being listed here)."""
    found = []
    for path in sorted((ROOT / "taskd").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and CONFIG_NAME.search(node.name) and any(
                    "dataclass" in ast.unparse(d) for d in node.decorator_list):
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                found.append(getattr(importlib.import_module(module), node.name))
    return found


# (class, field): literal defaults that are not a setting, and why
NOT_SETTINGS = {
    # the launcher's programmatic API (WorkerSpec) keeps torchrun's defaults where they differ from taskd run's,
    # which passes every value
    ("WorkerSpec", "max_restarts"): "torchrun's WorkerSpec budget, 0; taskd run passes --max-restarts (3)",
    ("WorkerSpec", "rdzv_store"): "torchrun's way, rank 0 hosts the store; taskd run passes TASKD_RDZV_STORE (auto)",
    ("WorkerSpec", "job_id"): "the API's name for a job no one named; taskd run passes its job id (given, else "
                              "generated)",
    ("WorkerSpec", "console"): "a program's launcher prints nothing unless asked; taskd run passes `not --quiet`",
}


def literal_defaults(cls: type, skip: Mapping[tuple[str, str], str] = NOT_SETTINGS) -> list[str]:
    """The fields of `cls` (its own body, inherited ones in theirs) whose default is written there as a literal:
    a constant other than None, or a tuple/list/number expression, rather than taken from a row of the table."""
    import inspect

    tree = ast.parse(inspect.getsource(cls).lstrip())
    found = []
    for item in tree.body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None):
            continue
        value = item.value
        literal = isinstance(value, ast.Constant) and value.value is not None or \
            isinstance(value, ast.Tuple | ast.List | ast.Dict | ast.BinOp | ast.UnaryOp)
        if literal and (cls.__name__, item.target.id) not in skip:
            found.append(f"{cls.__name__}.{item.target.id} = {ast.unparse(value)}")
    return found


def test_no_config_dataclass_has_a_literal_default() -> None:
    """Every config's defaults come from the table (taskd/settings.py, taskd/server_settings.py), or, for a value
    that is no user's knob, from a named constant that says why: issue 35 item 3."""
    configs = _configs()
    names = {cls.__name__ for cls in configs}
    assert {"AgentConfig", "RunConfig", "MachineConfig", "ControllerConfig", "ClientOptions", "PeerLimitConfig",
            "WatchConfig", "WorkerSpec"} <= names, names
    excepted = {hit.split(" = ")[0] for cls in configs for hit in literal_defaults(cls, skip={})}
    assert {f"{cls}.{field}" for cls, field in NOT_SETTINGS} <= excepted, "an exception that is no literal default"
    found = [hit for cls in configs for hit in literal_defaults(cls)]
    assert found == [], "take these defaults from the settings table (default(...), server_default(...))"


def test_the_literal_default_scan_finds_one() -> None:
    class Options:
        a: int = 3
        b: str | None = None
        c: tuple[int, ...] = ()
        d: float = default("stop_grace")
        e: int = 64 * 2

    assert literal_defaults(Options) == ["Options.a = 3", "Options.c = ()", "Options.e = 64 * 2"]


def test_client_options_defaults_are_the_tables() -> None:
    from taskd.client.arguments import ClientOptions

    rows = {s.name: s for s in SETTINGS if s.scope == "client"}
    fields = {f.name for f in dataclasses.fields(ClientOptions)} - {"channel_options"}  # gRPC's pairs: no row
    assert fields == set(rows)
    assert all(_field_default(ClientOptions, name) == s.default for name, s in rows.items())
