"""No module of taskd reads a TASKD_*/MINDX_* variable of its own process outside the settings table's readers
(taskd/settings.py's `env_text`/`env_item`, `AgentConfig.from_env`, `taskd run`'s environment step,
taskd/server_settings.py), the rank side aside (taskd/worker/, whose `Var` is its own table). What is still read
elsewhere is listed here, each with why: only another process's environment (issue 35, item 3)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RANK_SIDE = ROOT / "taskd" / "worker"

PARSERS = ("env_int", "env_float", "worker_env_int")  # taskd.worker.env's parsers and the client's, by name
NOT_OURS = {
    # another process's environment, read through psutil to tell msrun's ranks of this job: not a setting
    "taskd/process/msrun.py": {"MINDX_TASK_ID"},
    # the ranks' variable (taskd/worker/env.py's `Var`), which this agent sets for the ranks msrun starts: one
    # already set is used as it is, and the agent unsets only its own
    "taskd/agent/watches/hangs.py": {"TASKD_HEARTBEAT_DIR"},
    # the ranks' variable (`Var`), the agent's doorbell it exports for its ranks: at the job's end it unsets only
    # its own (another agent in the same process may have set it since)
    "taskd/agent/ranks/control.py": {"TASKD_AGENT_BELL"},
    # the ranks' variable (`Var`): a user's own is left to the ranks, not replaced by the multi-node default
    "taskd/run.py": {"TASKD_REJOIN_TIMEOUT"},
    # a test's fault (slow-disk:SECONDS before each persisted copy's fsync), not a knob
    "taskd/launcher/snapshots.py": {"TASKD_SNAPSHOT_PERSIST_FAULT"},
}


def env_reads(text: str) -> set[str]:
    """The TASKD_*/MINDX_* variables `text` reads through os.environ[...], os.environ.get, os.getenv, env.get or
    `NAME in environ`, by a constant, by a module-level name bound to one (TOKEN_ENV stays a name: its value is the
    table's) or by a constant's attribute (`Var.TASKD_X`: the rank side's names, read by the agent's side)."""
    tree = ast.parse(text)
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 for t in n.targets if isinstance(t, ast.Name)}
    found = set()
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            owner = ast.unparse(node.func.value)
            if node.func.attr == "getenv" or (node.func.attr == "get" and (owner == "env" or "environ" in owner)):
                arg = node.args[0]
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in PARSERS:
            found.update(a.value for a in node.args if isinstance(a, ast.Constant))  # env_int(env, "TASKD_X", 0)
        elif isinstance(node, ast.Subscript) and "environ" in ast.unparse(node.value):
            arg = node.slice
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                and "environ" in ast.unparse(node.comparators[0]):
            arg = node.left
        if isinstance(arg, ast.Constant):
            found.add(arg.value)
        elif isinstance(arg, ast.Name):
            found.add(constants.get(arg.id, arg.id))
        elif isinstance(arg, ast.Attribute):
            found.add(arg.attr)
    return {n for n in found if isinstance(n, str) and (n.startswith(("TASKD_", "MINDX_")) or n == "TOKEN_ENV")}


def test_no_module_reads_a_taskd_variable_outside_the_table() -> None:
    found = {}
    for path in sorted((ROOT / "taskd").rglob("*.py")):
        if RANK_SIDE in path.parents or path.name.endswith("_pb2.py"):
            continue
        if reads := env_reads(path.read_text(encoding="utf-8")):
            found[str(path.relative_to(ROOT))] = reads
    assert found == NOT_OURS, "read it through taskd/settings.py (a row with env=..., then env_text)"


def test_the_scan_finds_a_variable_read() -> None:
    text = ("import os\nVAR = 'TASKD_V'\nos.environ.get('TASKD_X')\nos.getenv('MINDX_Y')\nenv.get(TOKEN_ENV)\n"
            "os.environ.get('HOME')\nd.get('TASKD_Z')\nos.environ['TASKD_W']\nos.environ.get(VAR, '')\n"
            "env_int(env, 'TASKD_U', 0)\nenv_float('TASKD_T')\nenv_int('RANK')\nos.environ.get(Var.TASKD_S)\n"
            "if 'TASKD_R' in os.environ: pass\nif Var.MINDX_Q not in environ: pass\nif Var.TASKD_P in d: pass\n")
    assert env_reads(text) == {"TASKD_X", "MINDX_Y", "TOKEN_ENV", "TASKD_W", "TASKD_V", "TASKD_U", "TASKD_T",
                               "TASKD_S", "TASKD_R", "MINDX_Q"}
