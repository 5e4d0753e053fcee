"""docs/architecture.md says what is true, where a test can tell: the files it names exist, the unit tier's
stated bound is README's measured one, and what it says of the standby state matches the code.

(The layering, cycles and sizes it describes are tests/unit/test_architecture.py's; its generated blocks,
test_module_map.py's and the round table's; "one place per setting", test_settings.py's.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from taskd.agent.round.rules import RULES
from taskd.agent.round.states import NodeState

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
STANDBY_UNREACHED = "STANDBY and its rules are not reached yet"


def _prose() -> str:
    """The doc less its generated blocks (the map names every module by construction)."""
    text = DOC.read_text()
    return re.sub(r"<!-- ([\w-]+):begin.*?<!-- \1:end -->", "", text, flags=re.S)


def test_every_file_the_doc_names_exists() -> None:
    """A path (`agent/round/states.py`, `tests/unit/conftest.py`) exists from the repository or from taskd/; a bare
    module name (`checkpoint.py`, named in its package's row) is some module of taskd."""
    text = _prose()
    names = set(re.findall(r"(?<![\w./-])([\w-]+(?:/[\w.-]+)*\.(?:py|md|proto))\b", text))
    modules = {p.name for p in (ROOT / "taskd").rglob("*.py")} | {p.name for p in (ROOT / "taskd").rglob("*.proto")}
    missing = []
    for name in sorted(names):
        if name.endswith(".proto") and "/" not in name:  # `taskd.proto`: the package, not a file
            continue
        if "/" in name:
            if not any((base / name).exists() for base in (ROOT, ROOT / "taskd", ROOT / "docs")):
                missing.append(name)
        elif name not in modules and not (ROOT / name).exists() and not (ROOT / "docs" / name).exists():
            missing.append(name)
    assert missing == [], f"docs/architecture.md names files that do not exist: {missing}"


# "The state machines are pure" and "Clocks are passed in": these modules do no I/O and read no clock.
PURE = ("taskd.agent.link.report_policy", "taskd.client.retry", "taskd.controller.machine.strategy",
        "taskd.controller.machine.state_machine", "taskd.controller.machine.table", "taskd.controller.machine.handlers",
        "taskd.agent.round.handlers", "taskd.agent.round.rules",
        "taskd.agent.round.states", "taskd.agent.round.events")
IMPURE = {"time", "datetime", "threading", "socket", "grpc", "sqlite3", "subprocess", "os", "asyncio", "select"}
CLOCK = re.compile(r"(^|\.)(monotonic|time|sleep|perf_counter|process_time|now|utcnow)$")


def _impurities(source: str) -> list[str]:
    """The imports of I/O or clock modules and the clock calls in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.partition(".")[0] in IMPURE]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").partition(".")[0] in IMPURE:
            found.append(f"from {node.module}")
        elif isinstance(node, ast.Call) and CLOCK.search(ast.unparse(node.func)):
            found.append(f"{ast.unparse(node.func)}()")
    return found


def test_the_machines_and_policies_the_doc_calls_pure_read_no_clock_and_do_no_io() -> None:
    text = _prose()
    assert "**The state machines are pure.**" in text and "**Clocks are passed in.**" in text
    impure = {}
    for name in PURE:
        path = ROOT / (name.replace(".", "/") + ".py")
        assert path.exists(), f"{name} moved: update PURE here and the design rules in docs/architecture.md"
        if found := _impurities(path.read_text()):
            impure[name] = found
    assert impure == {}


def test_the_purity_scan_sees_a_clock_and_an_import() -> None:
    assert _impurities("import time\nfrom os import path\nx = time.monotonic()\ny = clock()\n") == \
        ["time", "from os", "time.monotonic()"]


def test_the_unit_tiers_bound_holds_for_the_cpu_time_readme_measured() -> None:
    """The design record states the bound; README's development section says what was measured, when and on
    which commit. Its CPU time is what an idle machine's wall time cannot go under."""
    bound = re.search(r"`python -m pytest tests/unit` is the fast loop, under (\d+) s", _prose().replace("\n  ", " "))
    assert bound, "docs/architecture.md no longer states the unit tier's bound"
    readme = (ROOT / "README.md").read_text()
    measured = re.search(r"^\s*\| unit tier \|[^|]*\|[^|]*\| *([\d.]+) s", readme, flags=re.M)  # CPU
    assert measured, "README's development section lost the unit tier's measured time"
    assert float(measured.group(1)) < int(bound.group(1)), (measured.group(0), bound.group(0))


def _standby_assignments(tree: ast.AST) -> list[int]:
    """Lines that set a `...state` to STANDBY."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and re.search(r"\bSTANDBY\b", ast.unparse(node.value))
            and any(ast.unparse(target).endswith("state") for target in node.targets)]


def _code_enters_standby() -> list[str]:
    """Where the agent's code puts a node in STANDBY: a rule that targets it, or an assignment of it."""
    where = [f"rule {r.event.__name__} -> STANDBY" for r in RULES if NodeState.STANDBY in r.targets]
    for path in sorted((ROOT / "taskd" / "agent").rglob("*.py")):
        where += [f"{path.relative_to(ROOT)}:{line}" for line in _standby_assignments(ast.parse(path.read_text()))]
    return where


def test_what_the_doc_says_of_the_standby_state_is_what_the_code_does() -> None:
    """Today nothing enters STANDBY (a standby waits before the machine starts); when the machine owns the
    standby's life, the doc's sentence saying otherwise must go (and this test then wants it gone)."""
    entered = _code_enters_standby()
    says_unreached = STANDBY_UNREACHED in _prose().replace("\n  ", " ")
    if entered:
        assert not says_unreached, f"the code enters STANDBY ({entered}): drop {STANDBY_UNREACHED!r} from the doc"
    else:
        assert says_unreached, "nothing enters STANDBY: docs/architecture.md must not present it as a live state"


def test_the_standby_scan_sees_an_assignment() -> None:
    tree = ast.parse("self.machine.state = NodeState.STANDBY\nother = NodeState.STANDBY\nx.state = S.RUNNING\n")
    assert _standby_assignments(tree) == [1]
