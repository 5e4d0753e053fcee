"""A controller restart in the middle of a round loses no round (issue 31, F2), end to end.

One `taskd server` with a state file on a fixed loopback port, two `taskd run` nodes. Rank 1 (node 1) crashes;
the moment node 1's console prints the crash, the server is SIGKILLed, and 1 s later a new one starts on the
same port and state file. Whatever state the round was stored in (stopping, collecting, recovering), every job
must succeed with the fault-free run's parameters and one restart charged, and the round's restart must run
once: node 0's old recover status must not stall the re-run round (it was answered 401 for ~28 s while node 1
trained on, and the job failed "node(s) 1 finished while round 1 was open").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support import ROOT, free_port, leftovers, wait_for
from support.restartable import Server, node, server, status
from support.run import EXAMPLE

# rank 0 trains on through the server's restart, as a real job would: paced (0.03 s a step) until the round closed,
# up to ~26 s after the crash. With 300 steps (~8 s) a restarted server that took over 10 s to answer at load 22
# found node 0 finished and failed the job ("node(s) 0 finished while round 1 was open"); unpaced, the steps
# left take about a second.
STEPS = 900
CRASH_AT = 30
# when the server is SIGKILLed, job by job: the moment rank 1's crash is printed (the round not open yet, or just
# opened), the round stored as open but undecided, the round stored as RECOVERING (its strategy chosen; here the
# restart and both statuses take ~10 ms, so the kill may land just after the round closed: the F2 failure was
# seen with it landing in RECOVERING, and the live test below holds RECOVERING for seconds)
KILL_AT = ("crash", "STOPPING COLLECTING", "RECOVERING")


def example(tmp: Path, crash: bool, sleep: float = 0.03) -> list[str]:
    """The job; the crashing one sleeps per step only while tmp/pace exists (see run_killing_the_server)."""
    crash_args = ["--crash-once-at-step", str(CRASH_AT), "--sleep-while", str(tmp / "pace")] if crash else []
    return [str(EXAMPLE), "--steps", str(STEPS), "--ckpt-every", "5", "--ckpt-dir", str(tmp / "ckpt"),
            "--out", str(tmp / "out"), "--step-sleep", str(sleep), *crash_args]


def round_closed(ctl: Server, tmp: Path, job: str) -> bool:
    """Rank 1 was replaced and the server (the restarted one) stored the job RUNNING again: its round is closed
    and stored so, and nothing can re-run it."""
    return "replaced rank(s)" in (tmp / "node1.log").read_text(errors="replace") and \
        ctl.stored_state(job).split(" ")[0] == "RUNNING"


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    tmp = tmp_path_factory.mktemp("restart-baseline")
    proc = subprocess.run([sys.executable, "-m", "taskd.run", "--nproc-per-node", "2", "--quiet",
                           *example(tmp, crash=False, sleep=0.0)], capture_output=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    return [np.load(tmp / "out" / f"rank{r}.npy") for r in range(2)]


def crashed(tmp: Path, procs: list[subprocess.Popen[bytes]]) -> bool:
    return "crashing at step" in (tmp / "node1.log").read_text(errors="replace") or any(
        p.poll() is not None for p in procs)


def run_killing_the_server(ctl: Server, tmp: Path, job: str, kill_at: str, script: list[str]) -> tuple[str, dict]:
    """Run a 2-node job whose rank 1 crashes; SIGKILL the server at `kill_at`, restart it 1 s later. Returns the
    job's state as the killed server stored it, and its record once both nodes exited (asserted 0). The job is
    paced (tmp/pace) until the restarted server closed the round: rank 0 trains on through the kill and the
    restart, as a real job would; after the round the rest of the run goes at full speed."""
    (tmp / "pace").touch()
    # the job's own rendezvous port: on the default 29500, a job elsewhere on the machine holding it made node 0 exit
    # at once ("port 29500 is already in use") and node 1 wait for it until the test's timeout
    master = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    procs = [node(tmp, ctl.address, job, r, [*master, *script]) for r in range(2)]
    try:
        wait_for(lambda: crashed(tmp, procs), 60, "rank 1 to crash", interval=0.005)
        if kill_at != "crash":
            wait_for(lambda: ctl.stored_state(job).split(" ")[0] in kill_at.split() or any(
                p.poll() is not None for p in procs), 20, f"the round stored as {kill_at}", interval=0.002)
        ctl.kill()
        stored = ctl.stored_state(job)
        time.sleep(1.0)
        ctl.start()
        # a job whose round never closes ends paced, failing as before (a node finished while the round was open)
        wait_for(lambda: round_closed(ctl, tmp, job) or any(p.poll() is not None for p in procs), 80,
                 "the restarted server to close the round")
        (tmp / "pace").unlink()
        codes = [p.wait(timeout=80) for p in procs]
        logs = "\n".join(f"--- node{r}\n{(tmp / f'node{r}.log').read_text()}" for r in range(2))
        record = status(ctl.address, job)
        assert codes == [0, 0], f"{job} (stored as {stored}): {codes}\n{logs}\n{ctl.logs()}\n{record}"
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
    assert record.get("state") == "SUCCEEDED", record
    assert record.get("restarts") == 1, record
    assert [r.get("strategiesTried") for r in record.get("rounds", [])] == [["recover"]], record["rounds"]
    return stored, record


def test_a_controller_killed_as_a_rank_crashes_loses_no_round(tmp_path: Path, fault_free: list[np.ndarray]) -> None:
    """Three jobs in sequence against one server: each time rank 1 crashes, the server is SIGKILLed at once and
    restarted 1 s later; every job succeeds, bit-identical, one restart charged, rank 1 restarted once."""
    stored = []
    with server(tmp_path) as ctl:
        for n, kill_at in enumerate(KILL_AT):
            tmp = tmp_path / f"job{n}"
            tmp.mkdir()
            stored.append(run_killing_the_server(ctl, tmp, f"f2-{n}", kill_at, example(tmp, crash=True))[0])
            for rank, want in enumerate(fault_free):
                got = np.load(tmp / "out" / f"rank{rank}.npy")
                assert np.array_equal(got, want), f"job {n}: rank {rank}'s parameters differ from the fault-free run"
            # rank 1 ran twice in all: the crashed process and its one replacement (never replaced again)
            summary = json.loads((tmp / "out" / "rank1.json").read_text())
            assert summary["resumed_from"] > 0, summary
            assert (tmp / "node1.log").read_text().count("replaced rank(s)") == 1, (tmp / "node1.log").read_text()
            wait_for(lambda: leftovers(str(tmp / "ckpt")) == [], 15, "no rank process of the job left")  # noqa: B023
    print("stored at the kill:", stored)  # RECOVERING lasts ~10 ms here: the live test below holds it for seconds
