"""The tests of tests/e2e/process/test_pidfd.py that start no process and open no network socket (the
unit tier).

Split from it by move_tests.py; its subject: taskd.process: the one pidfd selector loop (exits,
pipes, wake-ups) with real processes, and its layering.
"""

from __future__ import annotations

import ast
from pathlib import Path


def test_taskd_process_imports_nothing_above_it():
    root = Path(__file__).resolve().parents[3] / "taskd" / "process"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.startswith("taskd.") or name.startswith("taskd.process"), f"{path.name}: {name}"
