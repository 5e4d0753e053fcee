"""The launcher writes a rank's environment and the worker SDK reads it: they must agree on every name.

Round trips through a real rank process, so a rename on one side only fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys

from support.worker import rank_env_spec

from taskd.launcher.env import rank_env
from taskd.worker.env import Var
from taskd.worker.heartbeat_file import HeartbeatFile

WAIT = 60.0  # generous: the suite must pass on a loaded 2-core machine

RANK_SCRIPT = """
import json
from taskd import worker
worker.heartbeat(7)
print(json.dumps({"rank": worker.rank(), "local_rank": worker.local_rank(), "world_size": worker.world_size(),
                  "restart_count": worker.restart_count(), "job_id": worker.job_id()}))
"""


def run_rank(env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", RANK_SCRIPT], env=env, capture_output=True, timeout=WAIT, check=True)
    return json.loads(done.stdout)


def test_a_rank_reads_back_what_the_launcher_wrote(tmp_path):
    hb_path = str(tmp_path / "rank_5.hb")
    HeartbeatFile(hb_path).create()
    stale = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "TASKD_RESTART_COUNT": "9", "PATH": "/usr/bin:/bin"}
    env = rank_env(rank_env_spec(), local_rank=2, restart_count=4, heartbeat_file=hb_path, base=stale)
    seen = run_rank(env)
    assert seen == {"rank": 5, "local_rank": 2, "world_size": 6, "restart_count": 4, "job_id": "job-e"}
    with HeartbeatFile(hb_path) as hb:  # the rank found its heartbeat file through the launcher's variable
        state = hb.read()
    assert state.step == 7 and state.beats == 1


def test_msrun_names_alone_are_enough(tmp_path):
    """A script started by msrun only has msrun's variables: the reader falls back to them."""
    env = rank_env(rank_env_spec(), local_rank=1, restart_count=0, heartbeat_file=None, base={"PATH": "/usr/bin:/bin"})
    torchrun_only = (Var.RANK, Var.LOCAL_RANK, Var.WORLD_SIZE, Var.TASKD_JOB_ID, Var.TASKD_RESTART_COUNT,
                     Var.TORCHELASTIC_RESTART_COUNT)
    msrun_env = {k: v for k, v in env.items() if k not in torchrun_only}
    seen = run_rank(msrun_env)
    assert (seen["rank"], seen["local_rank"], seen["world_size"], seen["job_id"]) == (4, 1, 6, None)


