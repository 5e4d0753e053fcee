"""The layout is the architecture (docs/architecture.md): layers never import upward, no cycles, small modules,
no class reading another's `_private` members, no
module reading another module's `_private` names.

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


NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}  # public, underscored against clashes
FRAMEWORK_PRIVATES = {"_has_rebuilt_buckets"}  # torch DDP's own, which taskd's DDP wrapper sets too
# A class that keeps the privates of another class of its module in step, by design, and why.
FRIENDS = {"taskd.controller.machine.agents.AgentTable": "an AgentInfo's slots are set only through its table, which "
           "keeps its indexes in step with each change"}


def _privates_of(cls: ast.ClassDef) -> set[str]:
    """The `_private` members a class defines: its methods and class attributes, and what it sets on self or cls."""
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    for n in cls.body:
        if isinstance(n, ast.Assign):
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
    names.update(n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                 and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_uses(trees: dict[str, ast.Module]) -> list[str]:
    """Every `x._name` where `_name` is a private member of a taskd class, read outside a class that defines it
    and not through `self`/`cls`: another class's privates, wherever its module (a function beside the class too)."""
    members = set().union(*(_privates_of(n) for t in trees.values() for n in ast.walk(t)
                            if isinstance(n, ast.ClassDef))) - NAMEDTUPLE_API - FRAMEWORK_PRIVATES
    found = []

    def visit(node: ast.AST, module: str, own: frozenset[str]) -> None:
        if isinstance(node, ast.ClassDef):
            own = own | _privates_of(node)
            if f"{module}.{node.name}" in FRIENDS:
                own = own | set().union(*(_privates_of(n) for n in ast.walk(trees[module])
                                          if isinstance(n, ast.ClassDef)))
        if isinstance(node, ast.Attribute) and node.attr in members and node.attr not in own \
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(f"{module}:{node.lineno} {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, module, own)

    for module, tree in trees.items():
        visit(tree, module, frozenset())
    return found


def test_no_class_reads_another_classs_private_members() -> None:
    """The rule the old 25-methods-per-class cap stood for: what a class keeps `_private` is its own. A function
    that needs it is the class's method, or the class offers it public (ControllerLink.record_of, RecoverClient's
    identity(), ControllerMetrics.jobs)."""
    trees = {m: ast.parse(p.read_text()) for m, p in MODULES.items()}
    wrong = private_uses(trees)
    assert wrong == [], "another class's _private members, read from outside it:\n" + "\n".join(sorted(wrong))


def test_the_private_rule_sees_a_function_beside_its_class_and_another_module() -> None:
    """The rule's own check, on sources of its own: the two shapes issue 35 found, and what stays allowed."""
    link = ast.parse("class Link:\n    def __init__(self):\n        self._mgr = None\n"
                     "    def same(self, other):\n        return other._mgr\n"
                     "def record_of(link):\n    return link._mgr\n")
    gauges = ast.parse("class Gauges:\n    def collect(self):\n        return self._m._mgr, self._m.jobs\n"
                       "def fine(t):\n    return t._replace(a=1), t._other\n")
    assert sorted(private_uses({"link": link, "gauges": gauges})) == ["gauges:3 self._m._mgr", "link:7 link._mgr"]


def module_privates(module: str, tree: ast.Module, modules: set[str]) -> list[str]:
    """Every module-level `_private` name of another taskd module that `module` imports (`from m import _x`) or
    reads through the module (`m._x`, `pkg.m._x`): what a module keeps `_private` is its own too."""
    package = module if any(m.startswith(module + ".") for m in modules) else module.rpartition(".")[0]
    aliases: dict[str, str] = {}
    found = []

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                parts = package.split(".")
                source = ".".join(parts[:len(parts) - node.level + 1] + ([source] if source else []))
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                elif source in modules and source != module and private(alias.name):
                    found.append(f"{module}:{node.lineno} from {source} import {alias.name}")
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in modules})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            value = node.value
            owner = aliases.get(value.id) if isinstance(value, ast.Name) else ast.unparse(value)
            if owner in modules and owner != module:
                found.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_reads_another_modules_private_names() -> None:
    """A module-level `_name` (a struct of the heartbeat file's layout, a module's singleton) is its module's own:
    another module that needs it gets a public name (heartbeat_file's `SEQ`, progress's `reattach()`)."""
    wrong = [use for m, p in MODULES.items() for use in module_privates(m, ast.parse(p.read_text()), set(MODULES))]
    assert wrong == [], "another module's _private names, read from outside it:\n" + "\n".join(sorted(wrong))


def test_the_module_private_rule_sees_an_import_and_a_read_through_the_module() -> None:
    modules = {"taskd.w", "taskd.w.hbf", "taskd.w.progress"}
    progress = ast.parse("from taskd.w import hbf\nfrom taskd.w.hbf import _SEQ, SIZE\nimport taskd.w.hbf as h\n"
                         "def beat(buf):\n    return hbf._SEQ, h._ACK, taskd.w.hbf._ALL, hbf.SIZE, hbf.__doc__\n")
    own = ast.parse("_SEQ = 1\nfrom . import progress\ndef f():\n    return _SEQ, progress.beat\n")
    assert module_privates("taskd.w.progress", progress, modules) == [
        "taskd.w.progress:2 from taskd.w.hbf import _SEQ", "taskd.w.progress:5 hbf._SEQ", "taskd.w.progress:5 h._ACK",
        "taskd.w.progress:5 taskd.w.hbf._ALL"]
    assert module_privates("taskd.w.hbf", own, modules) == []
    relative = ast.parse("from .hbf import _SEQ\nfrom . import hbf as f\nx = f._LIVE\n")
    assert module_privates("taskd.w.progress", relative, modules) == [
        "taskd.w.progress:1 from taskd.w.hbf import _SEQ", "taskd.w.progress:3 f._LIVE"]


# these import their framework, at the top
FRAMEWORK_BINDINGS = ("taskd.worker.torch", "taskd.worker.torch_facts", "taskd.worker.torch_data",
                      "taskd.worker.torch_state", "taskd.worker.torch_mark", "taskd.worker.torch_buckets",
                      "taskd.worker.torch_snapshot", "taskd.worker.torch_hsdp", "taskd.worker.torch_retry",
                      "taskd.worker.torch_fsdp_live",
                      "taskd.worker.torch_hsdp_live", "taskd.worker.torch_live_snapshot", "taskd.worker.mindspore",
                      "taskd.worker.hf_snapshot", "taskd.worker.lightning_snapshot")
FRAMEWORKS = ("torch", "mindspore", "numpy")  # only inside functions: serialised when a rank hands them over


def test_worker_needs_only_the_standard_library() -> None:
    """Ranks import taskd.worker: it must not drag grpc, protobuf or psutil into the training process. An import
    in a ``try`` whose ``except ImportError`` falls back to the standard library is optional (an accelerator, e.g.
    zlib-ng's CRC-32): the rank runs without it."""
    import sys

    std = sys.stdlib_module_names
    wrong = []
    for module, path in MODULES.items():
        if not module.startswith("taskd.worker") or module in FRAMEWORK_BINDINGS:
            continue
        tree = ast.parse(path.read_text())
        lazy = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
        optional = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) and _falls_back(t)
                    for b in t.body for n in ast.walk(b)}
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
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


def _falls_back(node: ast.Try) -> bool:
    """Whether a ``try`` catches ImportError and imports only standard modules in its handler (the fallback)."""
    import sys

    caught = [n.id for h in node.handlers if h.type is not None
              for n in ast.walk(h.type) if isinstance(n, ast.Name)]
    if not {"ImportError", "ModuleNotFoundError"} & set(caught):
        return False
    fallback = [n for h in node.handlers for n in ast.walk(h) if isinstance(n, ast.Import | ast.ImportFrom)]
    names = [a.name for n in fallback if isinstance(n, ast.Import) for a in n.names] + \
        [n.module or "" for n in fallback if isinstance(n, ast.ImportFrom)]
    return bool(names) and all(name.split(".")[0] in sys.stdlib_module_names for name in names)


def test_docs_cite_only_files_in_the_repository() -> None:
    cited = []
    for path in [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), *PACKAGE.rglob("*.py")]:
        if "DESIGN.md" in path.read_text():
            cited.append(str(path.relative_to(ROOT)))
    assert cited == [], f"these cite DESIGN.md, which is not in the repository: {cited}"


def test_the_runtime_dependencies_are_grpcio_protobuf_and_psutil() -> None:
    """The agent and the controller install with these three only: anything else (torch, MindSpore, zlib-ng's
    faster CRC for snapshots) is an extra, which the code imports optionally."""
    import configparser
    import re

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    lines = [ln.split("#")[0].strip() for ln in cfg["options"]["install_requires"].splitlines()]
    names = sorted(re.split(r"[<>=!~ \[]", ln)[0].lower() for ln in lines if ln)
    assert names == ["grpcio", "protobuf", "psutil"]
