"""The docs' settings tables agree with taskd/settings.py: msrun's is generated from it (and current), the
README's and docs/pytorch.md's `taskd run` rows are checked against it. No process, no network."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import taskd.settings as settings_module
from taskd.run_config.flags import GROUPS, RUN_FLAGS
from taskd.settings import AGENT_SETTINGS, OTHER_VARIABLES, RUN_SETTINGS, Setting, describe_settings, update_doc

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "RELIABILITY.md", *sorted((ROOT / "docs").glob("*.md"))]
BY_FLAG = {flag: s for s in RUN_SETTINGS for flag in s.flags}


def test_msruns_table_is_generated_from_the_current_settings(tmp_path: Path) -> None:
    doc = ROOT / "docs" / "mindspore.md"
    text = doc.read_text(encoding="utf-8")
    assert update_doc(text) == text, "run: python -m taskd.settings --write docs/mindspore.md"
    stale = tmp_path / "mindspore.md"
    stale.write_text(text.replace("| `TASKD_STOP_GRACE` |", "| `TASKD_STOP_GRAC` |"), encoding="utf-8")
    assert settings_module.main(["--check", str(stale)]) == 1
    assert settings_module.main(["--write", str(stale)]) == 0 and stale.read_text(encoding="utf-8") == text
    assert settings_module.main(["--check", str(stale)]) == 0


def test_msruns_table_lists_every_variable_the_agent_reads() -> None:
    table = describe_settings()
    for s in AGENT_SETTINGS:
        if s.env:
            assert f"| `{s.env}` | {s.doc} |" in table
    assert all(f"| `{var}` |" in table for var, _, _ in OTHER_VARIABLES)
    with pytest.raises(ValueError, match="markers are missing"):
        update_doc("no table here")


def _rows(path: Path) -> list[list[str]]:
    """The cells of every table row whose first cell starts with a `--flag`."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `-"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def _agrees(s: Setting, cell: str) -> bool:
    """Whether a doc's default cell says the table's default."""
    cell = cell.strip().strip("`")
    if s.shown and cell == s.shown:
        return True
    if s.default is None:
        return cell in ("off", "none") or bool(s.env and f"${s.env}" in cell)
    if isinstance(s.default, bool):
        return cell == ("on" if s.default else "off")
    if isinstance(s.default, int | float):
        return float(cell) == s.default
    return cell == s.default


@pytest.mark.parametrize("module, doc, row", [
    ("taskd.run_config.flag_table", "README.md", "| `--stop-grace S` |"),
    ("taskd.client.option_table", "docs/client.md", "| `call_timeout` |"),
], ids=["README", "client"])
def test_a_flag_table_is_generated_from_the_current_settings(module: str, doc: str, row: str, tmp_path: Path) -> None:
    """README's `taskd run` flags and docs/client.md's client options are blocks generated from the table's rows."""
    generator = importlib.import_module(module)
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert generator.update_doc(text) == text, f"run: python -m {module} --write {doc}"
    assert row in text
    stale = tmp_path / "doc.md"
    stale.write_text(text.replace(row, row.replace("`", "", 1)), encoding="utf-8")
    assert generator.main(["--check", str(stale)]) == 1
    assert generator.main(["--write", str(stale)]) == 0 and stale.read_text(encoding="utf-8") == text


def test_the_readmes_flag_table_has_a_line_for_every_flag_but_torchruns_notices() -> None:
    from taskd.run_config.flag_table import SHOWN, describe_flags

    table = describe_flags()
    for s in RUN_FLAGS:
        dash = next(f for f in s.flags if "_" not in f)
        assert (f"`{dash}" in table) == (s in SHOWN), dash
        if s in SHOWN:
            assert (s.help_text() or "").replace("|", "\\|").replace("<", "\\<") in table
    assert {s.name for s in RUN_FLAGS} - {s.name for s in SHOWN} == set(GROUPS[-1][1])


def test_docs_pytorch_names_the_tables_defaults() -> None:
    checked = set()
    for first, text in (row[:2] for row in _rows(ROOT / "docs" / "pytorch.md")):
        s = BY_FLAG.get(first.strip("`").split()[0])
        said = re.search(r"default(?: is)? `?([\w.]+)`?", text)
        if s is not None and said:
            assert _agrees(s, said.group(1)), f"docs/pytorch.md: {first} says {said.group(0)!r}"
            checked.add(s.name)
    assert {"max_restarts", "monitor_interval", "node_count", "ranks_per_node", "node_rank", "role"} <= checked


def test_every_taskd_variable_the_docs_name_exists() -> None:
    """A variable renamed or removed in taskd/ (or in the CI scripts the docs describe) must not live on in the docs."""
    files = [*(ROOT / "taskd").rglob("*.py"), *(ROOT / ".ci").glob("*.sh")]
    source = "\n".join(p.read_text(encoding="utf-8") for p in files)
    known = set(re.findall(r"\b(?:TASKD|MINDX)_[A-Z0-9_]*[A-Z0-9]\b", source))
    for doc in DOCS:
        named = set(re.findall(r"\b(?:TASKD|MINDX)_[A-Z0-9_]*[A-Z0-9]\b", doc.read_text(encoding="utf-8")))
        assert named <= known, f"{doc.relative_to(ROOT)} names variables taskd does not read: {named - known}"


def test_the_ranks_stack_signal_default_is_msruns_table() -> None:
    from taskd.worker.progress import DEFAULT_STACK_SIGNAL

    row = dict((var, value) for var, _, value in OTHER_VARIABLES)["TASKD_STACK_SIGNAL"]
    assert row == f"`{DEFAULT_STACK_SIGNAL.name}`"


PROSE = re.compile(r"`((?:TASKD|MINDX)_[A-Z_]+|--[a-z-]+)`[^.(|]{0,40}\((\d+(?:\.\d+)?)[ ;)s]")


def test_a_default_the_docs_prose_gives_in_parentheses_is_the_tables() -> None:
    """"`TASKD_SCHEDULER_GRACE` seconds (60)", "`--max-restarts` (3)": the figure is the table's default."""
    by_name = {s.env: s for s in AGENT_SETTINGS if s.env} | BY_FLAG
    by_name |= {s.server_flag: s for s in RUN_SETTINGS + AGENT_SETTINGS if s.server_flag}
    checked = []
    for doc in DOCS:
        for name, figure in PROSE.findall(doc.read_text(encoding="utf-8")):
            s = by_name.get(name)
            if s is not None:
                assert float(figure) == s.default, f"{doc.relative_to(ROOT)}: {name} ({figure}), the table: {s.default}"
                checked.append(name)
    assert {"TASKD_CONTROLLER_TIMEOUT", "TASKD_SCHEDULER_GRACE", "--max-restarts"} <= set(checked)
