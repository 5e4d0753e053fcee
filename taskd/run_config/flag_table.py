"""README's table of `taskd run`'s flags, generated from the rows of taskd/settings.py: one line per flag, in
--help's order, its meaning the row's --help line (so README and `taskd run --help` say the same).

    python -m taskd.run_config.flag_table --write README.md   # --check README.md: exit 1 while it is stale
"""

from __future__ import annotations

from taskd.doc_block import DocBlock
from taskd.run_config.flags import GROUPS
from taskd.settings import Setting, setting

# every group of --help but its last, torchrun's flags that only print a notice (docs/pytorch.md lists them)
SHOWN = tuple(setting(name) for _, names in GROUPS[:-1] for name in names)


def cell(text: str) -> str:
    """Text that stays one cell of a Markdown table and shows its <PLACEHOLDERS>."""
    return text.replace("|", "\\|").replace("<", "\\<")


def flag_cell(s: Setting) -> str:
    """`--nnodes N|MIN:MAX`, `-m`/`--module`: the dash spellings (the underscore ones are accepted too)."""
    dashes = [f for f in s.flags if "_" not in f]
    value = f" {s.metavar}" if s.metavar and s.kind is not bool else ""
    return "/".join(f"`{f}{value if f == dashes[-1] else ''}`" for f in dashes).replace("|", "\\|")


def describe_flags() -> str:
    rows = ["| flag | meaning |", "| --- | --- |"]
    rows += [f"| {flag_cell(s)} | {cell(s.help_text() or '')} |" for s in SHOWN]
    return "\n".join(rows)


DOC = DocBlock("run-flags", "taskd.run_config.flag_table", "README.md", "the taskd run flag table", describe_flags,
               description=__doc__.splitlines()[0])
BEGIN, END, update_doc, main = DOC.begin, DOC.end, DOC.update, DOC.main

if __name__ == "__main__":
    raise SystemExit(main())
