"""The declared launcher interface: both launchers satisfy it member by member, and the agent uses only it."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest

from taskd.agent.ranks.launcher import MSRUN, Launcher, MsrunLauncher, NodeRankFixed, launcher_of
from taskd.launcher import LocalLauncher, WorkerSpec

AGENT = Path(__file__).resolve().parents[4] / "taskd" / "agent"
MEMBERS = sorted(name for name in vars(Launcher) if not name.startswith("_"))
PROPERTIES = sorted(name for name in MEMBERS if isinstance(vars(Launcher)[name], property))
METHODS = sorted(set(MEMBERS) - set(PROPERTIES))


def _signature(func: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]


def test_the_protocol_lists_what_the_agent_reaches() -> None:
    assert {"rank_files", "live_recovery", "rank_declarations"} == set(PROPERTIES)
    assert {"control_path", "returncode", "tail_log", "error_report", "heartbeat_path", "log_path",
            "set_restart_count", "set_generation", "set_node_rank", "set_node_count", "prepare_replacement",
            "discard_prepared", "prepare_successor", "adopt_successor", "discard_successor"} == set(METHODS)


@pytest.mark.parametrize("cls", [LocalLauncher, MsrunLauncher], ids=lambda c: c.__name__)
def test_each_launcher_class_has_every_member_with_the_protocols_signature(cls: type) -> None:
    for name in METHODS:
        assert callable(vars(cls).get(name)), f"{cls.__name__}.{name} is missing"
        assert _signature(vars(cls)[name]) == _signature(vars(Launcher)[name]), f"{cls.__name__}.{name}"
    for name in PROPERTIES:  # a property or a plain attribute (set on the class or in __init__)
        assert name in vars(cls) or name in inspect.getsource(cls.__init__), f"{cls.__name__}.{name} is missing"


def test_msrun_null_object_answers_nothing_and_refuses_a_node_rank() -> None:
    assert isinstance(MSRUN, Launcher) and launcher_of(None) is MSRUN
    assert (MSRUN.rank_files, MSRUN.live_recovery, MSRUN.rank_declarations) == (False, False, False)
    assert MSRUN.control_path() is None and MSRUN.returncode(0) is None and MSRUN.error_report(0) is None
    assert MSRUN.tail_log(0) == [] and MSRUN.heartbeat_path(0) is None and MSRUN.log_path(0) is None
    assert MSRUN.set_restart_count(2) is None and MSRUN.set_generation(3) is None
    assert MSRUN.prepare_replacement(0, 1) is False and MSRUN.discard_prepared() is None  # msrun starts its own ranks
    with pytest.raises(NodeRankFixed, match="--node_rank 1"):
        MSRUN.set_node_rank(1)


def test_local_launcher_is_a_launcher_and_takes_a_node_rank_late(tmp_path: Path) -> None:
    spec = WorkerSpec([sys.executable, "-c", "pass"], nproc_per_node=2, nnodes=3, node_rank=2, master_port=29999,
                      log_dir=str(tmp_path / "logs"), run_dir=str(tmp_path / "run"))
    launcher = LocalLauncher(spec, subreaper=False)
    try:
        assert isinstance(launcher, Launcher) and launcher_of(launcher) is launcher
        assert (launcher.rank_files, launcher.live_recovery, launcher.rank_declarations) == (True, False, True)
        assert launcher.control_path() is None and launcher.returncode(0) is None
        assert launcher.tail_log(0) == [] and launcher.error_report(0) is None
        assert launcher.heartbeat_path(1).endswith("rank_5.hb") and launcher.log_path(1).endswith("rank_5.log")
        launcher.set_restart_count(1)
        launcher.set_generation(2)
        launcher.set_node_rank(1)  # a standby assigned node 1: every per-rank name follows
        assert launcher.heartbeat_path(1).endswith("rank_3.hb") and launcher.log_path(0).endswith("rank_2.log")
        assert [e["global_rank"] for e in launcher.monitor([-1]).values()] == [2, 3]
        with pytest.raises(ValueError, match=r"\[0, 3\)"):
            launcher.set_node_rank(3)
    finally:
        launcher.close()


def _launcher_expressions(tree: ast.AST) -> list[ast.AST]:
    """Expressions that name the launcher: `details`, `self.details`, `self.control.details`, `launcher`."""
    def names_launcher(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in ("details", "launcher")) or \
            (isinstance(node, ast.Attribute) and node.attr == "details")
    return [n for n in ast.walk(tree) if names_launcher(n)]


def test_the_agent_never_probes_a_launcher() -> None:
    probes = []
    for path in sorted(AGENT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("hasattr", "getattr", "callable") and node.args \
                    and _launcher_expressions(node.args[0]):
                probes.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert probes == []


def test_the_agent_uses_only_declared_members() -> None:
    used = {}
    for path in sorted(AGENT.rglob("*.py")):
        if path == AGENT / "ranks" / "launcher.py":
            continue
        tree = ast.parse(path.read_text())
        launchers = {id(n) for n in _launcher_expressions(tree)}  # once per module: per attribute, it was quadratic
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and id(node.value) in launchers:
                used.setdefault(node.attr, f"{path.name}:{node.lineno}")
    undeclared = {name: where for name, where in used.items() if name not in MEMBERS and name != "details"}
    assert undeclared == {}
    assert {"returncode", "set_restart_count", "set_generation", "heartbeat_path"} <= set(used)
