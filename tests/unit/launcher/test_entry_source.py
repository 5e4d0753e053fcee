"""Which file a rank runs first, `-m MODULE` included (issue 21, D4: `taskd run -m` lost live recovery)."""

from __future__ import annotations

import sys
from pathlib import Path

from taskd.launcher.node_files import entry_source
from taskd.rendezvous import uses_live_binding

PY = sys.executable


def _tree(root: Path) -> None:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("raise SystemExit('a package was imported to find a module')\n")
    (root / "pkg" / "__main__.py").write_text("print('main')\n")
    (root / "pkg" / "sub" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "lm_live.py").write_text("from taskd.worker.torch import LiveGroup\n")
    (root / "lm_plain.py").write_text("import torch\n")


def test_a_module_is_found_as_python_m_finds_it_from_the_working_directory_without_importing_it(tmp_path):
    _tree(tmp_path)
    live = entry_source([PY, "-u", "-m", "pkg.sub.lm_live", "--steps", "3"], str(tmp_path))
    assert live == str(tmp_path / "pkg" / "sub" / "lm_live.py") and uses_live_binding(live)
    plain = entry_source([PY, "-u", "-m", "lm_plain"], str(tmp_path))
    assert plain == str(tmp_path / "lm_plain.py") and not uses_live_binding(plain)
    assert entry_source([PY, "-u", "-m", "pkg"], str(tmp_path)) == str(tmp_path / "pkg" / "__main__.py")


def test_what_cannot_be_found_or_is_no_python_source_is_none(tmp_path):
    _tree(tmp_path)
    assert entry_source([PY, "-u", "-m", "no_such_module"], str(tmp_path)) is None
    assert entry_source([PY, "-u", "-m", "lm_plain.not_a_package"], str(tmp_path)) is None
    assert entry_source(["./train.sh", "-m", "x"], str(tmp_path)) is None  # --no-python
    assert entry_source([PY, "-u", str(tmp_path / "lm_plain.py")], None) == str(tmp_path / "lm_plain.py")
