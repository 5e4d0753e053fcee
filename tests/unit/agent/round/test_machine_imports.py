"""The agent's round machine is pure: importing it loads no gRPC, no client, no process mechanics.

The unit tier starts no process, so `python -c "import taskd.agent.round.rules, sys; assert 'grpc' not in
sys.modules"` is checked here from the source: every module the machine imports, and every package
`__init__` those imports run, read with `ast` (an import inside a function counts too).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def _path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported(module: str, path: Path) -> set[str]:
    """Every module name `module`'s source imports (absolute; `from pkg import name` may name a submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if _path(f"{base}.{alias.name}"))
    return names


def _closure(start: str) -> tuple[set[str], set[str]]:
    """(taskd modules loaded by importing `start`, the other top-level packages they import)."""
    seen: set[str] = set()
    outside: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            name = ".".join(parts[:i])
            if name in seen:
                continue
            path = _path(name)
            if path is None:
                continue
            seen.add(name)
            for target in _imported(name, path):
                if target.split(".")[0] == "taskd":
                    todo.append(target)
                elif target and target != "__future__":
                    outside.add(target.split(".")[0])
    return seen, outside


def test_the_round_machine_imports_no_grpc_and_no_mechanics() -> None:
    loaded, outside = _closure("taskd.agent.round.rules")
    assert "taskd.agent.round.rules" in loaded and "taskd.agent.round.handlers" in loaded
    foreign = sorted(outside - set(sys.stdlib_module_names))
    assert foreign == [], f"the round machine imports {foreign}: it must need the standard library only"
    mechanics = sorted(m for m in loaded if m.startswith(("taskd.client", "taskd.proto", "taskd.process"))
                       or m in ("taskd.agent.link.controller", "taskd.agent.supervisor"))
    assert mechanics == [], f"the round machine loads {mechanics}: its orders and states must stand alone"


def test_the_check_sees_an_import_of_grpc() -> None:
    """The closure follows package __init__s: the link to the controller loads grpc through taskd.client."""
    loaded, outside = _closure("taskd.agent.link.controller")
    assert "grpc" in outside and "taskd.client" in loaded
