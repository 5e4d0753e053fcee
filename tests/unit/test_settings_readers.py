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
}


def env_reads(text: str) -> set[str]:
    """The TASKD_*/MINDX_* variables `text` reads through os.environ[...], os.environ.get, os.getenv or env.get, by
    a constant or by a module-level name bound to one (TOKEN_ENV stays a name: its value is the table's)."""
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
        if isinstance(arg, ast.Constant):
            found.add(arg.value)
        elif isinstance(arg, ast.Name):
            found.add(constants.get(arg.id, arg.id))
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
            "env_int(env, 'TASKD_U', 0)\nenv_float('TASKD_T')\nenv_int('RANK')\n")
    assert env_reads(text) == {"TASKD_X", "MINDX_Y", "TOKEN_ENV", "TASKD_W", "TASKD_V", "TASKD_U", "TASKD_T"}
