"""Which processes a new msrun's agent may SIGKILL as workers a dead msrun of its job left (process/msrun.py):
only workers of its own job and ranks, and only when their parent is no longer an msrun of that job."""

from __future__ import annotations

from taskd.process.msrun import is_stale_worker

JOB = "mnist-exp42"
WORKER = {"MINDX_TASK_ID": JOB, "MS_ROLE": "MS_WORKER", "RANK_ID": "1"}
MSRUN = {"MINDX_TASK_ID": JOB}  # msrun's own environment: the user set the job id for it
INIT: dict[str, str] = {}  # an orphan's new parent: init or a subreaper


def test_an_orphaned_worker_of_this_nodes_rank_is_stale() -> None:
    assert is_stale_worker(WORKER, INIT, JOB, (1,))
    assert is_stale_worker(WORKER, None, JOB, (1,))  # parent gone or unreadable


def test_a_worker_whose_msrun_lives_is_never_stale() -> None:
    assert not is_stale_worker(WORKER, MSRUN, JOB, (1,))


def test_other_ranks_jobs_roles_and_unset_job_ids_are_left_alone() -> None:
    assert not is_stale_worker(WORKER, INIT, JOB, (0,))  # another node's rank
    assert not is_stale_worker({**WORKER, "MINDX_TASK_ID": "other"}, INIT, JOB, (1,))
    assert not is_stale_worker({**WORKER, "MS_ROLE": "MS_SCHED"}, INIT, JOB, (1,))
    assert not is_stale_worker({k: v for k, v in WORKER.items() if k != "RANK_ID"}, INIT, JOB, (1,))
    assert not is_stale_worker(WORKER, INIT, "", (1,))
