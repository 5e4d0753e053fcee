"""The README's performance table cites BENCHMARKS.md: each row links a table, and each figure is that table's.

A figure re-measured in BENCHMARKS.md and not in the README (or the other way round) fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.]*\d)")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def sections(markdown: str) -> dict[str, str]:
    """{anchor: the text from that `## ` heading to the next one}."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.M)
    return {slug(title): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def how_fast_rows() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## How fast", 1)[1].split("\n## ", 1)[0]
    return [line for line in block.splitlines() if line.startswith("| [")]


def test_every_row_of_the_readme_table_links_an_existing_benchmark_table() -> None:
    tables = sections((ROOT / "BENCHMARKS.md").read_text())
    rows = how_fast_rows()
    assert len(rows) >= 4, "the README's How fast table lost its rows"
    for row in rows:
        anchors = re.findall(r"\(BENCHMARKS\.md#([\w-]+)\)", row)
        assert anchors, f"row cites no BENCHMARKS.md table: {row}"
        for anchor in anchors:
            assert anchor in tables, f"BENCHMARKS.md has no section #{anchor} (sections: {sorted(tables)})"


def test_every_readme_figure_is_in_the_table_it_cites() -> None:
    tables = sections((ROOT / "BENCHMARKS.md").read_text())
    for row in how_fast_rows():
        anchor = re.findall(r"\(BENCHMARKS\.md#([\w-]+)\)", row)[0]
        cited = tables[anchor]
        text = re.sub(r"\]\([^)]*\)", "]", row)  # the links' own text is not a figure
        for figure in NUMBER.findall(text):
            assert re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", cited), (
                f"README figure {figure} is not in BENCHMARKS.md#{anchor}: {row}")


def test_every_benchmark_script_has_a_table_with_its_command() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    for name in ("detection", "recovery", "live_recovery", "peers", "work_lost", "controller_scale", "overhead",
                 "chaos", "goodput"):
        assert f"python bench/{name}.py" in text, f"BENCHMARKS.md has no command for bench/{name}.py"
