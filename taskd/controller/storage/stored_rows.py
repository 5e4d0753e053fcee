"""What a stored job row must hold to be restored: each field's kind, as data, checked on load.

SQLite keeps whatever it is given, and a state file can be edited, restored from an old backup or
damaged: a snapshot whose `restarts` is "three" restored fine and then broke every `ListJobs`, and
one non-JSON row stopped `taskd server` without naming the file or the job. A row that breaks a rule
here is not loaded (the store says which file, job and field); the other jobs load as usual.

Keys a snapshot does not have take their defaults (older taskd versions wrote fewer); keys this table
does not know are ignored (a newer taskd that adds one that must not be dropped raises the state
file's version instead: taskd/controller/storage/store.py, STATE_VERSION).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from taskd.controller.machine.model import JobState

INT32_MAX = 2**31 - 1
Check = Callable[[Any], str]
"""A field's rule: "" when the value is of its kind, else what it should be."""


def _count(v: Any) -> str:
    ok = isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT32_MAX
    return "" if ok else "a whole number in [0, 2^31-1]"


def _int(v: Any) -> str:
    ok = isinstance(v, int) and not isinstance(v, bool) and -INT32_MAX - 1 <= v <= INT32_MAX
    return "" if ok else "a 32-bit whole number"


def _time(v: Any) -> str:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return "" if ok else "a finite number (a time)"


def _opt(check: Check) -> Check:
    def optional(v: Any) -> str:
        return "" if v is None else (check(v) and f"null or {check(v)}")
    return optional


def _str(v: Any) -> str:
    return "" if isinstance(v, str) else "a string"


def _bool(v: Any) -> str:
    return "" if isinstance(v, bool) else "true or false"


def _state(v: Any) -> str:
    known = [s.value for s in JobState]
    return "" if v in known else f"one of {', '.join(known)}"


def _list_of(check: Check) -> Check:
    def items(v: Any) -> str:
        if not isinstance(v, list):
            return "a list"
        for i, x in enumerate(v):
            if why := check(x):
                return f"a list whose entries are each {why} (entry {i} is not)"
        return ""
    return items


def _node_map(check: Check) -> Check:
    """{"<node rank>": value}: JSON object keys are strings."""
    def nodes(v: Any) -> str:
        if not isinstance(v, dict):
            return "an object"
        for k, x in v.items():
            if not (isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 10):
                return f"an object keyed by node or rank numbers (key {k[:32]!r} is not)"
            if why := check(x):
                return f"an object whose values are each {why} (the value of {k!r} is not)"
        return ""
    return nodes


def _str_map(v: Any) -> str:
    ok = isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
    return "" if ok else "an object of strings"


def _tuple(*checks: Check) -> Check:
    """A list of at least len(checks) entries, each of its kind (a newer taskd may add more at the end)."""
    def entries(v: Any) -> str:
        if not isinstance(v, list) or len(v) < len(checks):
            return f"a list of {len(checks)} entries"
        for i, (check, x) in enumerate(zip(checks, v, strict=False)):
            if why := check(x):
                return f"a list whose entry {i} is {why}"
        return ""
    return entries


def _object(rules: Mapping[str, tuple[Check, bool]], name: str) -> Check:
    def fields(v: Any) -> str:
        if not isinstance(v, dict):
            return "an object"
        why = _first_problem(v, rules, f"{name}.")
        return why and f"an object whose {why}"
    return fields


FENCE = _tuple(_count, _str, _int, _time, _str, _int, _opt(_time), _bool)
"""[node rank, host, pid, lost at, replaced by host, by pid, replaced at, by a standby] (snapshot.py)."""
STANDBY = _tuple(_str, _int, _time, _opt(_count), _str)
"""[host, pid, since, assigned node, role]."""

ROUND: Mapping[str, tuple[Check, bool]] = {
    "number": (_count, True),
    "started_at": (_time, True),
    "faults": (_node_map(_str), True),
    "excluded": (_str_map, False),
    "failed": (_list_of(_str), False),
    "tried": (_list_of(_str), False),
    "strategy": (_str, False),
    "lost": (_node_map(_time), False),
    "participants": (_list_of(_count), False),
    "statuses": (_list_of(_count), False),
    "reports": (_node_map(_list_of(_str)), False),
    "unrejoined": (_bool, False),
    "strategy_started_at": (_time, False),
}

SIGNAL: Mapping[str, tuple[Check, bool]] = {
    "uuid": (_str, True),
    "signal_type": (_str, True),
    "actions": (_list_of(_str), True),
    "faults": (_list_of(_tuple(_count, _str)), True),
    "strategy": (_str, True),
    "timeout": (_int, True),
    "reason": (_str, True),
    "nodes": (_list_of(_count), True),
    "generation": (_count, True),
    "restarts": (_count, True),
    "round": (_count, True),
    "extra": (_list_of(_tuple(_str, lambda v: "")), False),
}
"""The job's last signal (re-sent to an agent that owes an answer to it after a restart)."""

RESUME_WATCH: Mapping[str, tuple[Check, bool]] = {
    "round": (_count, True),
    "started_at": (_time, True),
    "since": (_time, True),
    "lost": (_node_map(_time), False),
    "nodes": (_opt(_list_of(_count)), False),
    "resumed": (_node_map(_opt(_time)), False),
    "done": (_bool, False),
}

SNAPSHOT: Mapping[str, tuple[Check, bool]] = {
    # field: (its rule, required)
    "job_id": (_str, True),
    "state": (_state, True),
    "created_at": (_time, False),
    "updated_at": (_time, False),
    "node_count": (_count, True),
    "ranks_per_node": (_count, False),
    "max_restarts": (_count, True),
    "policy": (_list_of(_str), False),
    "restarts": (_count, False),
    "round_counter": (_count, False),
    "queued": (_node_map(_str), False),
    "deadline": (_opt(_time), False),
    "recover_succeeded_at": (_opt(_time), False),
    "unsettled_recovers": (_count, False),
    "recover_banned": (_bool, False),
    "info": (_str, False),
    "signal_seq": (_count, False),
    "rejoining": (_node_map(_time), False),
    "min_nodes": (_count, False),
    "absent": (_node_map(_time), False),
    "fences": (_list_of(FENCE), False),
    "standbys": (_list_of(STANDBY), False),
    "resume_watch": (_opt(_object(RESUME_WATCH, "resume_watch")), False),
    "last_signal": (_opt(_object(SIGNAL, "last_signal")), False),
    "round": (_opt(_object(ROUND, "round")), False),
}
"""The job row's snapshot (taskd/controller/storage/snapshot.py writes it)."""

AGENT_COLUMNS: Sequence[tuple[str, Check]] = (
    ("node_rank", _count), ("role", _opt(_str)), ("host", _opt(_str)), ("pid", _opt(_int)),
    ("ranks_per_node", _opt(_count)), ("registered_at", _opt(_time)), ("last_seen", _opt(_time)),
    ("finished", _int), ("exit_code", _int),
)
"""An `agents` row, in the order `Store.load_jobs` selects its columns."""


def _first_problem(v: Mapping[str, Any], rules: Mapping[str, tuple[Check, bool]], where: str = "") -> str:
    for name, (check, required) in rules.items():
        if name not in v:
            if required:
                return f"field {where}{name} is missing"
            continue
        if why := check(v[name]):
            return f"field {where}{name} is {_shown(v[name])}, not {why}"
    return ""


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def snapshot_problem(snap: Any, job_id: Any) -> str:
    """"" when the decoded snapshot of the row keyed `job_id` restores; else the field at fault and why."""
    if not isinstance(snap, dict):
        return f"its snapshot is {_shown(snap)}, not a JSON object"
    if why := _first_problem(snap, SNAPSHOT):
        return why
    if snap["job_id"] != job_id:
        return f"field job_id is {_shown(snap['job_id'])}, not the row's key {_shown(job_id)}"
    return ""


def agent_problem(row: Sequence[Any]) -> str:
    """"" when an `agents` row (without its job id) restores; else the column at fault and why."""
    for (name, check), value in zip(AGENT_COLUMNS, row, strict=True):
        if why := check(value):
            return f"column {name} is {_shown(value)}, not {why}"
    return ""
