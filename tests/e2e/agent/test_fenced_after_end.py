"""A fenced node that comes back after its job ended stays out (issue 31, F1), end to end.

One `taskd server --token-file` on loopback, two `taskd run` nodes with the job's own credential
(`taskd token --job`). Node 1's whole `taskd run` (agent and ranks) is SIGSTOPped until the controller
declares it lost; a replacement `taskd run --node-rank 1` takes over and the job SUCCEEDS; only then is
the old node SIGCONTed. Its agent must exit non-zero within seconds, its ranks must write nothing more
(every file under the checkpoint and output directories keeps its size and mtime), `taskd status --json`
must still name the replacement as node 1's agent, and the finished job's record must not be reset.
Both workloads: examples/train_resumable.py (a checkpoint job, job-rescheduling) and
examples/torch/train_ddp.py (a live job: the survivors' ranks stay, the replacement's join their group).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support import free_port, port_open, ranks_of, secret_file, wait_for
from test_node_loss_e2e import (
    GRACE,
    JOB_RESCHEDULING,
    LOSS_TIMEOUT,
    PING,
    example,
    kill_all,
    logs,
    node,
    rescheduled,
    signal_node,
    whole_node,
)
from test_node_loss_live import ddp_args

ROOT = Path(__file__).resolve().parents[3]
ADMIN = "an-admin-token-for-the-fence-tests-0123456789"
BACK_WITHIN = 10.0  # seconds from SIGCONT to the old agent's exit ("within seconds")


@contextlib.contextmanager
def guarded_server(tmp: Path) -> Iterator[tuple[str, Path]]:
    """A `taskd server --token-file` with the node-loss tests' short loss settings and a state file; yields its
    address and the admin token's file."""
    admin = secret_file(tmp / "admin.token", ADMIN + "\n")
    port = free_port()
    address = f"127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", address,
                             "--state", str(tmp / "state.sqlite3"), "--token-file", str(admin),
                             "--agent-loss-grace", GRACE, "--agent-loss-timeout", LOSS_TIMEOUT,
                             "--agent-ping-interval", PING, "--agent-ping-timeout", PING,
                             "--node-rejoin-timeout", "60"],
                            stdout=(tmp / "server.log").open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_for(lambda: port_open(port) or proc.poll() is not None, 30, "taskd server to listen")
        assert proc.poll() is None, (tmp / "server.log").read_text()
        yield address, admin
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def job_credential(tmp: Path, admin: Path, job: str) -> Path:
    out = subprocess.run([sys.executable, "-m", "taskd", "token", "--job", job, "--token-file", str(admin)],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    cred = secret_file(tmp / f"{job}.cred", out.stdout)
    return cred


def status(address: str, job: str, cred: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDX_")} | {"TASKD_TOKEN_FILE": str(cred)}
    out = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", address, "--job", job, "--json"],
                         capture_output=True, text=True, timeout=30, cwd=ROOT, env=env)
    jobs = json.loads(out.stdout).get("jobs", []) if out.returncode == 0 else []
    return jobs[0] if jobs else {}


def files(*dirs: Path) -> dict[str, tuple[int, int]]:
    """Every file under `dirs`: (size, mtime in ns)."""
    found = {}
    for d in dirs:
        for path in d.rglob("*"):
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                found[str(path.relative_to(d.parent))] = (st.st_size, st.st_mtime_ns)
    return found


def alive(pids: list[int]) -> list[int]:
    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    return [p for p in pids if running(p)]


def fenced_after_the_end(tmp: Path, job: str, workload: list[str], started: object, extra: list[str],
                         paced: bool = False) -> None:
    """The scenario; `started()` says node 1's ranks have taken enough steps (checkpoints) to be SIGSTOPped.
    `paced`: the workload sleeps per step while tmp/pace exists; it is removed once the round restarted node 0's
    ranks and started the replacement's (test_node_loss_e2e.rescheduled)."""
    with guarded_server(tmp) as (address, admin):
        cred = job_credential(tmp, admin, job)
        env = {"TASKD_TOKEN_FILE": str(cred), "OMP_NUM_THREADS": "1"}

        def args(rank: int) -> list[str]:
            return ["--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "2", "--job-id", job,
                    "--server", address, "--stop-grace", "2", *extra, *workload]

        procs = {f"node{r}": node(args(r), tmp / f"node{r}.log", **env) for r in range(2)}
        try:
            # a node that exits before the fault (its store's port taken, a bad flag) fails the test at once, with why
            wait_for(lambda: started() or any(p.poll() is not None for p in procs.values()), 90,  # type: ignore
                     "node 1's ranks' first steps")
            assert all(p.poll() is None for p in procs.values()), logs(tmp, "node0", "node1")
            node0_ranks = set(ranks_of(procs["node0"].pid).values())
            old = procs["node1"]
            frozen = whole_node(old)
            old_pids = [p.pid for p in frozen]
            assert len(old_pids) >= 3, old_pids  # the agent and its 2 ranks
            signal_node(frozen, signal.SIGSTOP)
            stopped = time.monotonic()
            wait_for(lambda: any(e.get("kind") == "node_lost" for e in status(address, job, cred).get("events", [])),
                     30, "the controller to declare node 1 lost")
            print(f"node 1 SIGSTOPped, declared lost {time.monotonic() - stopped:.1f}s later")
            procs["replacement"] = node(args(1), tmp / "replacement.log", **env)
            if paced:
                rescheduled(tmp, procs["node0"], node0_ranks, procs["replacement"])
            for name in ("node0", "replacement"):
                try:
                    code = procs[name].wait(timeout=120)
                except subprocess.TimeoutExpired:
                    raise AssertionError(logs(tmp, "node0", "replacement")) from None
                assert code == 0, logs(tmp, "node0", "replacement")
            record = status(address, job, cred)
            assert record.get("state") == "SUCCEEDED", record
            new_pid = procs["replacement"].pid
            before = files(tmp / "ckpt", tmp / "out")
            assert before, "the job wrote no checkpoint or output"
            ended_events = len(record.get("events", []))

            signal_node(frozen, signal.SIGCONT)  # the old node comes back after the job's end
            back = time.monotonic()
            try:
                code = old.wait(timeout=BACK_WITHIN)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"the fenced agent still runs {BACK_WITHIN:.0f}s after SIGCONT:\n"
                                     + logs(tmp, "node1")) from None
            took = time.monotonic() - back
            print(f"the fenced agent exited {code} {took:.2f}s after SIGCONT")
            text = (tmp / "node1.log").read_text()
            assert code != 0 and "fenced" in text and str(new_pid) in text, text  # names what replaced it
            assert "node FENCED" in text and "job FAILED" not in text and "job succeeded" not in text, text
            wait_for(lambda: alive(old_pids) == [], 10, "the fenced node's ranks to stop")
            time.sleep(1.0)  # anything a surviving writer had in flight would show by now
            after = files(tmp / "ckpt", tmp / "out")
            changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
            assert changed == [], f"written after the job had ended: {changed}\n{text}"

            record = status(address, job, cred)
            assert record.get("state") == "SUCCEEDED", record
            (agent,) = [a for a in record.get("agents", []) if a.get("nodeRank", 0) == 1]
            assert agent.get("pid") == new_pid, agent  # the replacement still holds node 1
            kinds = [e.get("kind") for e in record.get("events", [])]
            assert "job_reset" not in kinds and len(kinds) >= ended_events, kinds  # the record was not reset
            assert "job_succeeded" in kinds, kinds
            assert "fenced" in (tmp / "server.log").read_text()  # the controller said why it refused
        finally:
            kill_all(list(procs.values()))


def test_a_fenced_node_of_a_checkpoint_job_back_after_the_end_exits_non_zero_and_writes_nothing(
        tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    # its own rendezvous port, as the live job's: on the default 29500 another job on the machine made node 0 exit
    master = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    fenced_after_the_end(tmp_path, "fence-ckpt", example(tmp_path, steps=300, paced=True),
                         lambda: all((ckpt / f"rank{r}").is_dir() and any((ckpt / f"rank{r}").iterdir())
                                     for r in range(4)), [*JOB_RESCHEDULING, *master], paced=True)


@pytest.mark.torch
def test_a_fenced_node_of_a_live_job_back_after_the_end_exits_non_zero_and_writes_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "out"

    def computed(rank: int) -> int:
        path = out / f"rank{rank}.computed"
        return path.stat().st_size if path.exists() else 0

    master = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    fenced_after_the_end(tmp_path, "fence-live", ddp_args(tmp_path), lambda: all(computed(r) >= 6 for r in range(4)),
                         master)
