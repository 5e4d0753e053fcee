"""The layout is the architecture (docs/architecture.md): layers never import upward, no cycles, small modules.

Read from the source with `ast`, so an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from taskd.module_map import module_files, module_imports

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "taskd"

# Which parts of taskd each part may import (besides itself). The lowest layers come first.
# Composition roots (taskd.run, taskd.cli, the TaskD compatibility shims) are not listed: they wire the rest.
# Base modules import nothing of taskd, or only other base modules.
BASE = {"taskd.vocabulary", "taskd.address", "taskd.proto", "taskd.callbacks", "taskd.settings", "taskd.rule_table",
        "taskd.doc_block", "taskd.pace", "taskd.server_settings"}
ALLOWED: dict[str, set[str]] = {
    "taskd.vocabulary": set(),
    "taskd.address": set(),
    "taskd.proto": set(),
    "taskd.callbacks": set(),
    "taskd.rule_table": set(),  # a transition table as data: the controller's and the agent's are built on it
    "taskd.doc_block": set(),  # a generated Markdown block in a doc (markers, --write/--check)
    "taskd.module_map": {"taskd.doc_block"},  # docs/architecture.md's map of the agent and the controller (ast only)
    "taskd.pace": set(),  # the straggler judge (pure): the agent and the controller both judge with it
    "taskd.settings": {"taskd.doc_block"},  # the settings table (taskd/settings.py): every config derives from it
    "taskd.server_settings": {"taskd.settings", "taskd.vocabulary"},  # `taskd server`'s rows of the settings table
    "taskd.worker": set(),  # ranks import it: the standard library only (taskd.worker.torch adds torch)
    "taskd.process": {"taskd.worker"},
    "taskd.rendezvous": {"taskd.process", "taskd.worker"},
    "taskd.launcher": {"taskd.process", "taskd.worker", "taskd.rendezvous"} | BASE,
    "taskd.client": {"taskd.worker"} | BASE,  # worker: standard library only, the lowest layer
    "taskd.controller": BASE,
    "taskd.agent": {"taskd.client", "taskd.process", "taskd.worker"} | BASE,
}
COMPOSITION_ROOTS = ("taskd.run", "taskd.run_config", "taskd.cli", "taskd.__main__", "taskd.console",
                     "taskd.framework", "taskd.python", "taskd.toolkit", "taskd.api")
MAX_LINES = 500
MAX_METHODS = 25


MODULES = module_files(PACKAGE)
# what each module imports of taskd, read as docs/architecture.md's module map reads it
GRAPH = {name: module_imports(name, path, ast.parse(path.read_text(), filename=str(path)), MODULES)[0]
         for name, path in MODULES.items()}


def _part(module: str) -> str | None:
    for part in sorted(ALLOWED, key=len, reverse=True):
        if module == part or module.startswith(part + "."):
            return part
    return None


def _is_root(module: str) -> bool:
    return any(module == root or module.startswith(root + ".") for root in COMPOSITION_ROOTS)


def test_every_module_belongs_to_a_layer_or_is_a_composition_root() -> None:
    homeless = [m for m in MODULES if m != "taskd" and _part(m) is None and not _is_root(m)]
    assert homeless == [], f"give these a layer in tests/unit/test_architecture.py and docs/architecture.md: {homeless}"


def test_layers_never_import_upward() -> None:
    wrong = []
    for module, imports in GRAPH.items():
        part = _part(module)
        if part is None:
            continue
        for target in imports:
            other = _part(target)
            if other == part:
                continue
            if module in ("taskd.worker.torch", "taskd.worker.mindspore") and other is None:
                continue
            if other is None or other not in ALLOWED[part]:
                wrong.append(f"{module} -> {target}")
    assert wrong == [], "imports against the layering in docs/architecture.md:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle() -> None:
    # Tarjan's strongly connected components over the module graph.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in GRAPH.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            # A package's __init__ re-exporting its own modules is not a cycle of responsibilities.
            if len(component) > 1 and not _only_package_reexports(component):
                cycles.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert cycles == [], f"import cycles: {cycles}"


def _only_package_reexports(component: list[str]) -> bool:
    packages = [m for m in component if MODULES[m].name == "__init__.py"]
    if not packages:
        return False
    rest = [m for m in component if m not in packages]
    return all(any(m.startswith(p + ".") for p in packages) for m in rest) and all(
        not (GRAPH[m] & set(packages)) for m in rest)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_is_small(module: str) -> None:
    lines = MODULES[module].read_text().count("\n")
    assert lines <= MAX_LINES, f"{MODULES[module]} has {lines} lines: split it by responsibility"


def test_classes_are_small() -> None:
    big = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                # Dunders are protocol (Mapping, context manager), not responsibilities.
                methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                           and not (n.name.startswith("__") and n.name.endswith("__"))]
                if len(methods) > MAX_METHODS:
                    big.append(f"{module}.{node.name}: {len(methods)} methods")
    assert big == [], f"classes over {MAX_METHODS} methods: {big}"


# these import their framework, at the top
FRAMEWORK_BINDINGS = ("taskd.worker.torch", "taskd.worker.torch_facts", "taskd.worker.torch_data",
                      "taskd.worker.torch_state", "taskd.worker.torch_mark", "taskd.worker.torch_buckets",
                      "taskd.worker.torch_snapshot", "taskd.worker.torch_hsdp",
                      "taskd.worker.torch_hsdp_live", "taskd.worker.torch_live_snapshot", "taskd.worker.mindspore",
                      "taskd.worker.hf_snapshot", "taskd.worker.lightning_snapshot")
FRAMEWORKS = ("torch", "mindspore", "numpy")  # only inside functions: serialised when a rank hands them over


def test_worker_needs_only_the_standard_library() -> None:
    """Ranks import taskd.worker: it must not drag grpc, protobuf or psutil into the training process."""
    import sys

    std = sys.stdlib_module_names
    wrong = []
    for module, path in MODULES.items():
        if not module.startswith("taskd.worker") or module in FRAMEWORK_BINDINGS:
            continue
        tree = ast.parse(path.read_text())
        lazy = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
        for node in ast.walk(tree):
            if id(node) in lazy and isinstance(node, ast.Import | ast.ImportFrom) and (
                    (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name) or ""
            ).split(".")[0] in FRAMEWORKS:
                continue
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            wrong += [f"{module}: {n}" for n in names if n.split(".")[0] not in std and not n.startswith("taskd")]
    assert wrong == []


def test_docs_cite_only_files_in_the_repository() -> None:
    cited = []
    for path in [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), *PACKAGE.rglob("*.py")]:
        if "DESIGN.md" in path.read_text():
            cited.append(str(path.relative_to(ROOT)))
    assert cited == [], f"these cite DESIGN.md, which is not in the repository: {cited}"
