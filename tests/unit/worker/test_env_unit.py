"""The tests of tests/e2e/worker/test_env.py that start no process and open no network socket (the unit
tier).

Split from it by move_tests.py; its subject: The launcher writes a rank's environment and the worker
SDK reads it: they must agree on every name.
"""

from __future__ import annotations

from support.worker import rank_env_spec

from taskd.launcher.env import rank_env
from taskd.launcher.spec import WorkerSpec


def test_names_and_values_are_unchanged():
    """The variable names are an external contract (msrun, torchrun, scripts): pin them."""
    env = rank_env(rank_env_spec(), local_rank=0, restart_count=2, heartbeat_file="/tmp/hb", base={})
    assert env == {
        "RANK_ID": "3", "RANK_SIZE": "6", "DEVICE_ID": "0", "MS_WORKER_NUM": "6", "MS_NODE_ID": "3",
        "MS_ROLE": "MS_WORKER", "MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": "29500",
        "RANK": "3", "LOCAL_RANK": "0", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "2",
        "TASKD_RESTART_COUNT": "2", "TASKD_JOB_ID": "job-e", "PYTHONUNBUFFERED": "1",
        "TASKD_HEARTBEAT_FILE": "/tmp/hb",
        # torchrun's, as LocalElasticAgent._start_workers sets them (one role: ROLE_* = the job's)
        "GROUP_WORLD_SIZE": "2", "ROLE_NAME": "default", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "6",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "job-e", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",  # 3 ranks per node and none set by the user
    }
    assert "TASKD_HEARTBEAT_FILE" not in rank_env(rank_env_spec(), 0, 0, None, base={"TASKD_HEARTBEAT_FILE": "/old"})


def test_torchrun_variables_follow_the_spec_and_the_job():
    one = WorkerSpec(entrypoint=["true"], nproc_per_node=1, master_port=29500, job_id="j", role="trainer",
                     max_restarts=3)
    env = rank_env(one, 0, restart_count=5, heartbeat_file=None, base={"TORCHELASTIC_ERROR_FILE": "/outer"},
                   job_restart_count=2, error_file=None)
    assert "OMP_NUM_THREADS" not in env  # one rank per node: torch picks its own thread count
    assert "TORCHELASTIC_ERROR_FILE" not in env  # an outer launcher's file is not this rank's
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TASKD_RESTART_COUNT"]) == ("2", "5")  # job-wide vs own
    assert (env["ROLE_NAME"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("trainer", "3")
    env = rank_env(rank_env_spec(), 1, 0, None, base={"OMP_NUM_THREADS": "4"}, error_file="/run/rank_4.error.json")
    assert env["OMP_NUM_THREADS"] == "4"  # the user's choice is kept
    assert env["TORCHELASTIC_ERROR_FILE"] == "/run/rank_4.error.json"
    with_extra = WorkerSpec(entrypoint=["true"], nproc_per_node=2, extra_env={"OMP_NUM_THREADS": "8"})
    assert rank_env(with_extra, 0, 0, None, base={})["OMP_NUM_THREADS"] == "8"
