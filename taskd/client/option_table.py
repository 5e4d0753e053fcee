"""docs/client.md's table of the client's options (`DLRecoverManager(..., **options)`, `ClientOptions`), generated
from the rows of taskd/settings.py whose scope is "client".

    python -m taskd.client.option_table --write docs/client.md   # --check docs/client.md: exit 1 while stale
"""

from __future__ import annotations

from taskd.doc_block import DocBlock
from taskd.settings import SETTINGS, Setting

CLIENT_SETTINGS = tuple(s for s in SETTINGS if s.scope == "client")


def _default(s: Setting) -> str:
    """`10 s` for seconds (a float), the value itself otherwise."""
    return f"{s.value_text} s" if s.kind is float else s.value_text


def describe_options() -> str:
    rows = ["| option | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{s.name}` | {_default(s)} | {s.doc.replace('|', chr(92) + '|')}. |" for s in CLIENT_SETTINGS]
    return "\n".join(rows)


DOC = DocBlock("client-options", "taskd.client.option_table", "docs/client.md", "the client's option table",
               describe_options, description=__doc__.splitlines()[0])
BEGIN, END, update_doc, main = DOC.begin, DOC.end, DOC.update, DOC.main

if __name__ == "__main__":
    raise SystemExit(main())
