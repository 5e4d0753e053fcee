"""Whether a job's ranks will use taskd's live binding, read from their code with ``ast`` (nothing is run).

The agent-hosted store (host.py) is what live recovery needs, and what a plain env:// script must not get: torch
2.13 adds no per-attempt key prefix for ``TORCHELASTIC_USE_AGENT_STORE``, so a store that outlives a whole-job
restart hands a plain script's new ranks the previous attempt's keys (torchrun's shared store hung 3 of 3 such
restarts, issue 32), and a script or framework that binds ``MASTER_PORT`` itself (MindSpore) finds it taken. So
``auto`` decides per job, from the code: the entry script or ``-m`` module, the modules of its own it imports
(beside it, or under the working directory: `import lm_live; lm_live.main()`, issue 32 F3), and the Python
command a ``--no-python`` wrapper runs (``numactl ... python -u train.py``). A script that still escapes this
look (a shell script that runs Python) is told so by ``LiveGroup`` itself, with the variable that fixes it.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import re
from collections.abc import Sequence

LIVE_BINDING = "taskd.worker.torch"
MAX_SCRIPT = 4 << 20  # bytes of a script read for its imports
MAX_FILES = 64  # modules of the script's own read at most: a bounded look at job start, not an import
PYTHON = re.compile(r"python(\d+(\.\d+)*)?$")
FLAGS_WITH_VALUE = frozenset("WX")  # python's options that take the next argument


def _is_binding(name: str) -> bool:
    return name == LIVE_BINDING or name.startswith(LIVE_BINDING + ".")


def _parse(path: str) -> ast.Module | None:
    try:
        with open(path, "rb") as fh:
            return ast.parse(fh.read(MAX_SCRIPT))
    except (OSError, SyntaxError, ValueError):
        return None


def _module_files(name: str, path: list[str]) -> list[str]:
    """The source files `import name` runs when found on `path` (each package's __init__ on the way), found as
    the import system finds them, nothing imported; [] when it is not there."""
    files: list[str] = []
    for part in name.split("."):
        found = importlib.machinery.PathFinder.find_spec(part, path) if path else None
        if found is None:
            break
        if found.origin and found.origin.endswith(".py"):
            files.append(found.origin)
        path = list(found.submodule_search_locations or [])
    return files


class _Reader:
    """One bounded walk over a script and the modules of its own it imports."""

    def __init__(self, roots: list[str]) -> None:
        self.roots = roots
        self.seen: set[str] = set()

    def reaches(self, script: str) -> bool:
        todo = [os.path.realpath(script)]
        while todo and len(self.seen) < MAX_FILES:
            path = todo.pop()
            if path in self.seen:
                continue
            self.seen.add(path)
            tree = _parse(path)
            if tree is None:
                continue
            for node in ast.walk(tree):
                names = self._imported(node, path)
                if names is None:
                    return True
                for name, where in names:
                    todo.extend(os.path.realpath(f) for f in _module_files(name, where))
        return False

    def _imported(self, node: ast.AST, path: str) -> list[tuple[str, list[str]]] | None:
        """Modules `node` imports with where to look for them; None when it imports the live binding."""
        if isinstance(node, ast.Import):
            if any(_is_binding(a.name) for a in node.names):
                return None
            return [(a.name, self.roots) for a in node.names if a.name.split(".")[0] != "taskd"]
        if not isinstance(node, ast.ImportFrom):
            return []
        if node.level == 0 and node.module:
            if _is_binding(node.module) or (node.module == "taskd.worker" and any(a.name == "torch"
                                                                                  for a in node.names)):
                return None
            if node.module.split(".")[0] == "taskd":
                return []
            return [(node.module, self.roots), *((f"{node.module}.{a.name}", self.roots) for a in node.names)]
        base = os.path.dirname(path)
        for _ in range(node.level - 1):
            base = os.path.dirname(base)
        if node.module:
            return [(node.module, [base]), *((f"{node.module}.{a.name}", [base]) for a in node.names)]
        return [(a.name, [base]) for a in node.names]


def uses_live_binding(script: str | os.PathLike[str], cwd: str | None = None) -> bool:
    """Whether ``script`` imports taskd's torch binding (``taskd.worker.torch``), itself or through modules of its
    own (found beside it or under ``cwd``; taskd's and installed packages are not read). An unreadable or
    unparsable script counts as not using it."""
    script = os.fspath(script)
    roots = [os.path.dirname(os.path.abspath(script))]
    if cwd is not None and os.path.abspath(cwd) not in roots:
        roots.append(os.path.abspath(cwd))
    return _Reader(roots).reaches(script)


def wrapped_python(argv: Sequence[str]) -> tuple[str, str] | None:
    """What a ``--no-python`` command runs in Python: ("script", path) or ("module", name) for the first argument
    named like a Python interpreter (``numactl --cpunodebind=0 python -u train.py``); None if there is none, or
    it runs ``-c`` code."""
    for i, arg in enumerate(argv):
        if PYTHON.match(os.path.basename(arg)):
            rest = list(argv[i + 1:])
            break
    else:
        return None
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            return ("script", rest[0]) if rest else None
        if not arg.startswith("-") or arg == "-":
            return ("script", arg) if arg != "-" else None
        letters = arg[1:]
        for j, letter in enumerate(letters):
            if letter == "c":
                return None
            if letter == "m":
                name = letters[j + 1:] or (rest.pop(0) if rest else "")
                return ("module", name) if name else None
            if letter in FLAGS_WITH_VALUE:
                if j == len(letters) - 1 and rest:
                    rest.pop(0)
                break
            if letter == "-":  # a long option (--version, --help): nothing runs a script
                return None
    return None


__all__ = ["LIVE_BINDING", "uses_live_binding", "wrapped_python"]
