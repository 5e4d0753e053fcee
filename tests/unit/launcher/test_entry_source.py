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


def test_a_helper_module_entry_reaches_the_binding_through_its_own_modules(tmp_path):
    """issue 32, F3: `import lm_live; lm_live.main()` lost live recovery: only the entry file was read."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("from .gpt import GPT\n")
    (tmp_path / "models" / "gpt.py").write_text("from taskd.worker.torch import LiveGroup\n")
    (tmp_path / "lm_live.py").write_text("import os\nfrom models import GPT\n")
    (tmp_path / "entry.py").write_text("import lm_live\nlm_live.main()\n")
    (tmp_path / "plain.py").write_text("import torch, numpy, lm_plain_missing\nfrom taskd import worker\n")
    assert uses_live_binding(tmp_path / "entry.py")
    assert not uses_live_binding(tmp_path / "plain.py")
    elsewhere = tmp_path / "scripts"
    elsewhere.mkdir()
    (elsewhere / "run.py").write_text("import lm_live\n")
    assert not uses_live_binding(elsewhere / "run.py")  # lm_live is neither beside it nor under the cwd given
    assert uses_live_binding(elsewhere / "run.py", cwd=str(tmp_path))


def test_an_import_cycle_and_a_deep_tree_are_read_in_bounded_time(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("import a\n")
    assert not uses_live_binding(tmp_path / "a.py")
    for i in range(200):
        (tmp_path / f"m{i}.py").write_text(f"import m{i + 1}\n")
    (tmp_path / "m200.py").write_text("import taskd.worker.torch\n")
    assert not uses_live_binding(tmp_path / "m0.py")  # past MAX_FILES modules: not seen (LiveGroup says so)


def test_a_no_python_command_is_read_for_the_script_its_python_runs(tmp_path):
    """issue 32, F3: `--no-python numactl --cpunodebind=0 python -u lm_live.py` lost live recovery."""
    _tree(tmp_path)
    script = str(tmp_path / "lm_plain.py")
    assert entry_source(["numactl", "--cpunodebind=0", "python", "-u", "lm_plain.py"], str(tmp_path)) == script
    assert entry_source(["nice", "/usr/bin/python3.11", "-X", "dev", "-W", "ignore", script, "--lr", "1"]) == script
    assert entry_source(["python3", "-um", "pkg.sub.lm_live"], str(tmp_path)) == \
        str(tmp_path / "pkg" / "sub" / "lm_live.py")
    assert entry_source(["numactl", "python", "-c", "import lm_plain"], str(tmp_path)) is None
    assert entry_source(["python", "-u", "missing.py"], str(tmp_path)) is None
    assert entry_source(["bash", "train.sh"], str(tmp_path)) is None


def test_live_group_says_why_it_is_not_live_under_taskd_only(monkeypatch):
    from taskd.worker.live import why_not_live

    monkeypatch.delenv("TASKD_HEARTBEAT_FILE", raising=False)
    monkeypatch.delenv("TASKD_RDZV_STORE", raising=False)
    assert why_not_live() == ""  # torchrun, plain python
    monkeypatch.setenv("TASKD_HEARTBEAT_FILE", "/run/x/rank_0.hb")
    assert "TASKD_RDZV_STORE=agent" in why_not_live()
    monkeypatch.setenv("TASKD_RDZV_STORE", "rank")
    assert "TASKD_RDZV_STORE=rank" in why_not_live()
