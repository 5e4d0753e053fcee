"""The tests of tests/e2e/launcher/test_launcher.py that start no process and open no network socket
(the unit tier).

Split from it by move_tests.py; its subject: LocalLauncher with real processes: msrun's callback
semantics, environment, logs, process hygiene.
"""

from __future__ import annotations

import sys

import pytest

from taskd.launcher import WorkerSpec, WorkerSpecError, command_for


def test_worker_spec_validation():
    with pytest.raises(ValueError):
        WorkerSpec("train.py")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        WorkerSpec(["x"], nproc_per_node=0)
    with pytest.raises(ValueError):
        WorkerSpec(["x"], nnodes=2, node_rank=2)
    assert command_for("a.py", ["--x"]) == [sys.executable, "-u", "a.py", "--x"]
    assert command_for("/bin/true") == ["/bin/true"]


def test_worker_spec_names_every_bad_field_and_its_flag():
    with pytest.raises(WorkerSpecError) as caught:
        WorkerSpec(["x"], nproc_per_node=2, master_port=70000, job_id="", warm_spares=-1, max_restarts=True,
                   redirects=4, tee={0: 1, 5: 2}, role="a\x00b", node_rank=-1, warm_spare_mode="eager")
    problems = caught.value.problems
    expected = {"master_port (--master-port)", "job_id (--job-id)", "warm_spares (--warm-spares)",
                "warm_spare_mode (--warm-spare-mode)",
                "max_restarts (--max-restarts)", "redirects (--redirects)", "tee (--tee)", "role (--role)",
                "node_rank (--node-rank)"}
    assert {p.split(" must")[0].split(" maps")[0] for p in problems} == expected, problems
    assert any("tee (--tee) maps 5, which is not a local rank (0..1)" in p for p in problems)
    assert "70000" in str(caught.value)
    with pytest.raises(WorkerSpecError, match=r"entrypoint \(SCRIPT \[ARGS\]\)"):
        WorkerSpec([])


def test_worker_spec_streams_follow_torchrun():
    spec = WorkerSpec(["x"], nproc_per_node=3, console=True, redirects={0: 3, 1: 1}, tee={1: 1})
    assert spec.streams_of(2) == (0, 0) and spec.streams_of(0) == (3, 0)
    assert spec.console_streams(0) == (False, False)  # redirected: log file only
    assert spec.console_streams(1) == (True, True)  # stdout redirected but tee'd: both
    assert spec.console_streams(2) == (True, True)
    assert WorkerSpec(["x"], redirects=2).console_streams(0) == (False, False)  # no console at all
    assert WorkerSpec(["x"], console=True, redirects=2).console_streams(0) == (True, False)
    assert spec.redirects_any() and not WorkerSpec(["x"]).redirects_any()


def test_a_script_mode_spare_gets_what_every_rank_shares_and_nothing_that_names_a_rank():
    from taskd.launcher.env import RANK_VARIABLES, rank_env, spare_env

    spec = WorkerSpec(["x"], nproc_per_node=2, extra_env={"FOO": "bar"}, job_id="j")
    outer = {"RANK": "7", "LOCAL_RANK": "3", "TASKD_HEARTBEAT_FILE": "/x.hb", "PATH": "/bin", "TASKD_TOKEN": "s"}
    env = spare_env(spec, True, outer)
    assert env["FOO"] == "bar" and env["PATH"] == "/bin" and env["OMP_NUM_THREADS"] == "1"
    assert not RANK_VARIABLES & set(env), "no rank's identity, an outer launcher's included"
    assert "TASKD_TOKEN" not in env, "no credential either"
    rank = rank_env(spec, 1, 0, "/hb", outer)
    assert {k for k in rank if k not in env} <= RANK_VARIABLES | {"RANK"}, "all a rank has more names the rank"
    standby = WorkerSpec(["x"], nproc_per_node=2, nnodes=2, node_rank=None, job_id="j")
    assert not RANK_VARIABLES & set(spare_env(standby, True, outer)), "a standby's spares too (no node yet)"
