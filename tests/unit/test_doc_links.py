"""The docs' links lead somewhere: each relative link names a file that exists and, with `#anchor`, a heading in it.

A section moved to a page of its own (docs/node-loss.md) or renamed leaves links behind; they fail here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The Markdown outside fenced code blocks (a `](x)` in code is not a link)."""
    return "\n".join(part for i, part in enumerate(re.split(r"^```.*$", text, flags=re.M)) if i % 2 == 0)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(path.read_text()), flags=re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")  # GitHub numbers a repeated heading
    return out


def test_the_slug_is_githubs() -> None:
    assert slug("A lost node (issue 17)") == "a-lost-node-issue-17"
    assert slug("What `taskd run` does for it") == "what-taskd-run-does-for-it"


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for doc in DOCS:
        for target in LINK.findall(_prose(doc.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_node_loss_has_a_page_of_its_own() -> None:
    page = (ROOT / "docs" / "node-loss.md").read_text()
    assert {"a-lost-node", "scale-in-and-scale-out"} <= anchors(ROOT / "docs" / "node-loss.md")
    assert "--standby" in page and "LiveGroup(..., on_resize=fn)" in page
    pytorch = (ROOT / "docs" / "pytorch.md").read_text()
    assert "### Scale-in and scale-out" not in pytorch and "](node-loss.md)" in pytorch
