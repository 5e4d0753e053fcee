"""The map of the agent's and the controller's modules in docs/architecture.md, generated from their source.

One row per module: its folder, the first line of its docstring and what it imports (the taskd modules,
`.name` for one of its own package, then the outside packages; the standard library left out). Read with
`ast`, so nothing is imported and a module that does not import yet still gets its row. Refresh it after
adding, renaming or moving a module, or changing its imports or its docstring's first line:
`python -m taskd.module_map --write docs/architecture.md` (tests/unit/test_module_map.py fails while stale).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from taskd.doc_block import DocBlock

PACKAGE = Path(__file__).resolve().parent  # taskd/
MAPPED = ("agent", "controller")  # the subpackages the map covers
_GENERATED = ("_pb2.py", "_pb2_grpc.py")


@dataclass(frozen=True)
class ModuleRow:
    """One module as the map shows it."""

    folder: str  # its folder under taskd/, with a trailing slash: "agent/"
    file: str  # its file name: "supervisor.py"
    summary: str  # the first line of its docstring ("" without one)
    imports: tuple[str, ...]  # taskd modules it imports: ".ranks" in its own package, else without "taskd."
    outside: tuple[str, ...]  # packages from outside taskd and the standard library, sorted


def module_files(root: Path) -> dict[str, Path]:
    """Every module under `root`'s package (taskd/), by dotted name; a package by its own name."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        if path.name.endswith(_GENERATED):
            continue
        parts = ["taskd", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of `body`, nested ones included (an import inside a function counts); expressions are
    not walked, where no import can be."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, None) or []:
                if isinstance(child, ast.stmt):
                    yield from statements([child])
                else:  # an except handler, a match case: statements inside
                    yield from statements(child.body)


def module_imports(name: str, path: Path, tree: ast.Module, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """The taskd modules `name` imports (resolved to the longest known name) and the outside packages."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    ours: set[str] = set()
    outside: set[str] = set()
    for node in statements(tree.body):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            top = target.partition(".")[0]
            if top != "taskd":
                if top and top not in sys.stdlib_module_names and top != "__future__":
                    outside.add(top)
                continue
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                ours.add(target)
    return ours, outside


def _summary(tree: ast.Module) -> str:
    """The docstring's first line; " …" when its sentence goes on to the next line."""
    lines = (ast.get_docstring(tree) or "").strip().splitlines()
    if not lines:
        return ""
    first = lines[0].strip()
    return first + " …" if len(lines) > 1 and lines[1].strip() else first


def module_rows(root: Path | None = None, mapped: tuple[str, ...] | None = None) -> list[ModuleRow]:
    """The rows of the map, package by package, folder by folder, file by file (default: taskd's, `MAPPED`)."""
    root = PACKAGE if root is None else root
    mapped = MAPPED if mapped is None else mapped
    known = module_files(root)
    rows = []
    for sub in mapped:
        for path in sorted((root / sub).rglob("*.py"), key=lambda p: (p.parent.relative_to(root).parts, p.name)):
            if path.name.endswith(_GENERATED):
                continue
            parts = ["taskd", *path.relative_to(root).with_suffix("").parts]
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            ours, outside = module_imports(name, path, tree, known)
            shown = sorted(f".{m.removeprefix(f'taskd.{sub}.')}" if m.startswith(f"taskd.{sub}.") else
                           m.removeprefix("taskd.") for m in ours)
            rows.append(ModuleRow(f"{path.parent.relative_to(root).as_posix()}/", path.name, _summary(tree),
                                  tuple(shown), tuple(sorted(outside))))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def describe_map(rows: list[ModuleRow] | None = None) -> str:
    """The map as Markdown: one table per mapped package."""
    rows = module_rows() if rows is None else rows
    out: list[str] = []
    for sub in dict.fromkeys(row.folder.split("/")[0] for row in rows):
        mine = [row for row in rows if row.folder.split("/")[0] == sub]
        if out:
            out.append("")
        out += [f"**taskd/{sub}/**: {len(mine)} modules", "",
                "| folder | module | what it holds (its docstring's first line) | imports |",
                "| --- | --- | --- | --- |"]
        for row in mine:
            imports = ", ".join(f"`{m}`" for m in row.imports)
            if row.outside:
                imports += ("; " if imports else "") + ", ".join(row.outside)
            out.append(f"| {row.folder} | `{row.file}` | {_cell(row.summary)} | {imports or '(nothing of taskd)'} |")
    return "\n".join(out)


DOC = DocBlock("module-map", "taskd.module_map", "docs/architecture.md", "the map of the agent and the controller",
               describe_map, description=__doc__.splitlines()[0])
BEGIN, END, update_doc, main = DOC.begin, DOC.end, DOC.update, DOC.main

if __name__ == "__main__":
    raise SystemExit(main())
