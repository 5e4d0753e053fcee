"""docs/architecture.md's map of the agent and the controller is current, and says what the code says.

When the first test fails, run `python -m taskd.module_map --write docs/architecture.md`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from taskd import module_map
from taskd.module_map import describe_map, module_rows, update_doc

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def test_the_map_in_architecture_md_is_current() -> None:
    text = DOC.read_text()
    assert update_doc(text) == text, "run: python -m taskd.module_map --write docs/architecture.md"


def test_every_module_of_the_agent_and_the_controller_has_one_row() -> None:
    files = sorted(str(p.relative_to(ROOT / "taskd")) for sub in module_map.MAPPED
                   for p in (ROOT / "taskd" / sub).rglob("*.py"))
    rows = module_rows()
    assert sorted(row.folder + row.file for row in rows) == files
    assert all(row.summary for row in rows), "every module of the map says what it holds"


def test_a_row_shows_the_folder_first_line_and_imports(tmp_path: Path) -> None:
    """On a package of its own: relative and absolute imports resolved, the standard library left out, a folder
    below the package shown as such, and a docstring that goes on marked."""
    pkg = tmp_path / "agent"
    (pkg / "round").mkdir(parents=True)
    (tmp_path / "vocabulary.py").write_text('"""Words."""\n')
    (pkg / "__init__.py").write_text('"""The agent."""\n')
    (pkg / "ranks.py").write_text('"""Ranks | states: the table,\nand the layout."""\nimport os\nimport psutil\n'
                                  "from ..vocabulary import Code\n")
    (pkg / "round" / "__init__.py").write_text('"""The round."""\n')
    (pkg / "round" / "rules.py").write_text(  # nested imports count too
        '"""Rules."""\nfrom taskd.agent import ranks\n\n\nclass R:\n    def f(self):\n        try:\n'
        "            import grpc.aio\n        except ImportError:\n            from . import states\n")
    (pkg / "round" / "states.py").write_text('"""States."""\nfrom __future__ import annotations\n')
    rows = {row.folder + row.file: row for row in module_rows(tmp_path, ("agent",))}
    assert list(rows) == ["agent/__init__.py", "agent/ranks.py", "agent/round/__init__.py", "agent/round/rules.py",
                          "agent/round/states.py"]
    assert rows["agent/ranks.py"].summary == "Ranks | states: the table, …"
    assert (rows["agent/ranks.py"].imports, rows["agent/ranks.py"].outside) == (("vocabulary",), ("psutil",))
    assert rows["agent/round/rules.py"].imports == (".ranks", ".round.states")
    assert rows["agent/round/rules.py"].outside == ("grpc",)
    assert rows["agent/round/states.py"].imports == () and rows["agent/round/states.py"].outside == ()
    text = describe_map(list(rows.values()))
    assert "**taskd/agent/**: 5 modules" in text
    assert "| agent/ | `ranks.py` | Ranks \\| states: the table, … | `vocabulary`; psutil |" in text
    assert "| agent/round/ | `states.py` | States. | (nothing of taskd) |" in text


def test_check_fails_while_stale_and_write_refreshes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The command on a package of its own (the real map's renders are the tests above)."""
    (tmp_path / "taskd" / "agent").mkdir(parents=True)
    (tmp_path / "taskd" / "controller").mkdir()
    (tmp_path / "taskd" / "agent" / "link.py").write_text('"""The link."""\nfrom taskd.controller import core\n')
    (tmp_path / "taskd" / "controller" / "core.py").write_text('"""The core."""\n')
    monkeypatch.setattr(module_map, "PACKAGE", tmp_path / "taskd")
    stale = tmp_path / "architecture.md"
    stale.write_text(f"# x\n\n{module_map.BEGIN}\nold map\n{module_map.END}\n")
    assert module_map.main(["--check", str(stale)]) == 1
    assert "python -m taskd.module_map --write" in capsys.readouterr().err
    assert module_map.main(["--write", str(stale)]) == 0
    assert module_map.main(["--check", str(stale)]) == 0
    assert "| agent/ | `link.py` | The link. | `controller.core` |" in stale.read_text()
    assert "| controller/ | `core.py` | The core. | (nothing of taskd) |" in stale.read_text()
