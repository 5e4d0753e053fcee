"""docs/controller.md's table of the flags of `taskd status`, `taskd token` and `taskd migrate`, generated from
their rows (taskd/server_settings.py's `COMMAND_FLAGS`): the same defaults and help lines as their --help.

    python -m taskd.controller.command_table --write docs/controller.md   # --check: exit 1 while it is stale
"""

from __future__ import annotations

from taskd.doc_block import DocBlock
from taskd.server_settings import COMMAND_FLAGS, CommandFlag
from taskd.settings import setting


def _cell(text: str) -> str:
    """Text that stays one cell of a Markdown table."""
    return text.replace("|", "\\|").replace("<", "\\<")


def _default(s: CommandFlag) -> str:
    if s.required:
        return "required"
    if s.one_of:
        choice = [f"`{o.flag}`" for o in COMMAND_FLAGS if (o.command, o.one_of) == (s.command, s.one_of)]
        return f"one of {'/'.join(choice)}"
    if s.same:  # the meaning says what an unset variable leaves
        return f"`${setting(s.same).env}`"
    if s.kind is bool:
        return "off"
    return "unset" if s.default is None else f"{s.default:g}" if isinstance(s.default, float) else str(s.default)


def describe_commands() -> str:
    rows = ["| command | flag | default | meaning |", "| --- | --- | --- | --- |"]
    for s in COMMAND_FLAGS:
        flag = f"`{s.flag}{f' {s.metavar}' if s.metavar else ''}`"
        rows.append(f"| `taskd {s.command}` | {_cell(flag)} | {_default(s)} | {_cell(s.help_text() or '')} |")
    return "\n".join(rows)


DOC = DocBlock("command-flags", "taskd.controller.command_table", "docs/controller.md",
               "the flag table of taskd status, token and migrate", describe_commands,
               description=__doc__.splitlines()[0])
BEGIN, END, update_doc, main = DOC.begin, DOC.end, DOC.update, DOC.main

if __name__ == "__main__":
    raise SystemExit(main())
