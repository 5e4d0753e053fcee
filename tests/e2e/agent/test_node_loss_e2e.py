"""A lost node is survived (issue 17), end to end: one `taskd server`, two `taskd run` nodes on this machine.

examples/train_resumable.py by job-rescheduling (its ranks resume from checkpoints, so the final
parameters are bit-identical to a fault-free run): node 1's `taskd run` is SIGKILLed (its ranks die
with it) and a replacement `taskd run --node-rank 1` starts 2 s later; the same with a standby started
with the job, which takes over by itself; a whole node SIGSTOPped past the loss grace and SIGCONTed
once its replacement runs is fenced. Needs the controller's side of node loss (h3's branch).
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

import numpy as np
import psutil
import pytest
from support import STARTED, free_port, leftovers, port_open, ranks_of, wait_for
from support.run import EXAMPLE, ROOT

STEPS = 150
GRACE = "1"  # --agent-loss-grace: the controller declares a node lost this long after its stream ended
LOSS_TIMEOUT = "4"  # --agent-loss-timeout: ... or after this long without a stream (registered, never subscribed)
PING = "1"  # --agent-ping-interval and --agent-ping-timeout: a SIGSTOPped node's connection closes within ~2 s
JOB_RESCHEDULING = ("--strategies", "job-rescheduling,exit")


def example(tmp: Path, steps: int = STEPS, sleep: float = 0.04, paced: bool = False) -> list[str]:
    """The job's script; `paced`: it sleeps `sleep` per step only while tmp/pace exists (see rescheduled())."""
    pace = ["--sleep-while", str(tmp / "pace")] if paced else []
    if paced:
        (tmp / "pace").touch()
    return [str(EXAMPLE), "--steps", str(steps), "--ckpt-every", "5", "--ckpt-dir", str(tmp / "ckpt"),
            "--out", str(tmp / "out"), "--step-sleep", str(sleep), *pace]


def rescheduled(tmp: Path, survivor: subprocess.Popen[bytes], old: set[int],
                replacement: subprocess.Popen[bytes]) -> None:
    """Wait until the round's job-rescheduling restarted the survivor's ranks (none of `old` left among them) and
    started the replacement's, then stop pacing the job: the slow steps only had to outlast the fault's detection
    and the replacement's start, and the rest of the run (from a checkpoint, every rank restarted) goes at full
    speed. Un-paced earlier, the survivor's old ranks could finish before the round restarts them."""
    def restarted() -> bool:
        now = set(ranks_of(survivor.pid).values())
        return len(now) == 2 and not now & old and len(ranks_of(replacement.pid)) == 2

    wait_for(restarted, 60, "the round to restart node 0's ranks and start the replacement's")
    (tmp / "pace").unlink()


def params(tmp: Path, world: int = 4) -> list[np.ndarray]:
    return [np.load(tmp / "out" / f"rank{r}.npy") for r in range(world)]


def node(args: list[str], log: Path, **extra_env: str) -> subprocess.Popen[bytes]:
    """A `taskd run` in a session of its own, so its process group can be signalled as a node's."""
    env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "MINDX_TASK_ID")} | extra_env
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", *args],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                            start_new_session=True)
    STARTED.append(proc)
    return proc


MASTER_PORTS: dict[str, int] = {}  # job id -> its rendezvous port, the same for every node of the job


def job_args(address: str, job: str, rank: int | None) -> list[str]:
    """A node of `job`. Every node of a job (replacements and standbys too) gets the job's own free rendezvous port:
    on the default 29500, a job elsewhere on the machine holding it made node 0 exit at once ("port 29500 is already
    in use") and the test wait its whole timeout for checkpoints that could never come."""
    where = ["--standby"] if rank is None else ["--node-rank", str(rank)]
    port = MASTER_PORTS.setdefault(job, free_port())
    return ["--nnodes", "2", *where, "--nproc-per-node", "2", "--job-id", job, "--server", address,
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--stop-grace", "2", *JOB_RESCHEDULING]


def status(address: str, job: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", address, "--job", job, "--json"],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)
    jobs = json.loads(out.stdout).get("jobs", []) if out.returncode == 0 else []
    return jobs[0] if jobs else {}


def events(address: str, job: str, kind: str) -> list[dict]:
    return [e for e in status(address, job).get("events", []) if e.get("kind") == kind]


def whole_node(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    agent = psutil.Process(proc.pid)
    return [agent, *agent.children(recursive=True)]


def signal_node(procs: list[psutil.Process], signum: int) -> None:
    for p in procs:
        try:
            p.send_signal(signum)
        except psutil.NoSuchProcess:
            pass


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    tmp = tmp_path_factory.mktemp("node-loss-baseline")
    proc = node(["--nproc-per-node", "4", "--quiet", *example(tmp, sleep=0.0)], tmp / "console.log")
    assert proc.wait(timeout=120) == 0, (tmp / "console.log").read_text()
    return params(tmp)


@contextlib.contextmanager
def node_loss_server(tmp_path: Path, loss_timeout: str = LOSS_TIMEOUT, rejoin_timeout: str = "60") -> Iterator[str]:
    """A `taskd server` on loopback that declares a silent node lost within seconds; its log in server.log."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", address, "--state", ":memory:",
                             "--agent-loss-grace", GRACE, "--agent-loss-timeout", loss_timeout,
                             "--agent-ping-interval", PING, "--agent-ping-timeout", PING,
                             "--node-rejoin-timeout", rejoin_timeout],
                            stdout=(tmp_path / "server.log").open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_for(lambda: port_open(port) or proc.poll() is not None, 30, "taskd server to listen")
        assert proc.poll() is None, (tmp_path / "server.log").read_text()
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    with node_loss_server(tmp_path) as address:
        yield address


def finish(procs: dict[str, subprocess.Popen[bytes]], tmp: Path, timeout: float = 90) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    codes = {}
    for name, proc in procs.items():
        try:
            codes[name] = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running: {(tmp / f'{name}.log').read_text()}") from None
    return codes


def logs(tmp: Path, *names: str) -> str:
    return "\n".join(f"--- {n}\n{(tmp / f'{n}.log').read_text()}" for n in names)


def kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def assert_job_done(tmp: Path, address: str, job: str, fault_free: list[np.ndarray]) -> dict:
    for rank, (got, want) in enumerate(zip(params(tmp), fault_free, strict=True)):
        assert np.array_equal(got, want), f"rank {rank}'s final parameters differ from the fault-free run's"
    wait_for(lambda: leftovers(str(tmp / "ckpt")) == [], 15, "no rank process of the job left")
    record = status(address, job)
    assert record.get("state") == "SUCCEEDED", record
    return record


def test_a_replacement_for_a_sigkilled_node_joins_by_job_rescheduling(tmp_path: Path, server: str,
                                                                        fault_free: list[np.ndarray]) -> None:
    procs = {f"node{r}": node([*job_args(server, "replace", r), *example(tmp_path)], tmp_path / f"node{r}.log")
             for r in range(2)}
    try:
        wait_for(lambda: all((tmp_path / "ckpt" / f"rank{r}").is_dir() for r in range(4)), 60, "every checkpoint")
        old = procs["node1"]
        os.killpg(old.pid, signal.SIGKILL)  # agent and (by PDEATHSIG) its ranks
        assert old.wait(timeout=10) == -signal.SIGKILL
        time.sleep(2)  # the scenario: a replacement started 2 s after the loss
        procs["replacement"] = node([*job_args(server, "replace", 1), *example(tmp_path)],
                                    tmp_path / "replacement.log")
        codes = finish({k: v for k, v in procs.items() if k != "node1"}, tmp_path)
        text = logs(tmp_path, "node0", "replacement")
        assert codes == {"node0": 0, "replacement": 0}, text
        assert "replaces a lost node: its ranks start with the round's strategy" in text, text
        record = assert_job_done(tmp_path, server, "replace", fault_free)
        lost = [e["detail"] for e in record.get("events", []) if e.get("kind") == "node_lost"]
        assert len(lost) == 1 and lost[0].get("node_rank", lost[0].get("node")) == 1, lost  # the contract's {node, ...}
        assert lost[0]["pid"] == old.pid, lost
        assert record.get("restarts") == 1, record  # the node-loss round is charged one restart
    finally:
        kill_all(list(procs.values()))


def test_a_standby_started_with_the_job_takes_over_a_lost_node(tmp_path: Path, server: str,
                                                               fault_free: list[np.ndarray]) -> None:
    procs = {f"node{r}": node([*job_args(server, "standby", r), *example(tmp_path)], tmp_path / f"node{r}.log")
             for r in range(2)}
    procs["standby"] = node([*job_args(server, "standby", None), "--warm-spares", "1", *example(tmp_path)],
                            tmp_path / "standby.log")
    try:
        wait_for(lambda: "waiting for a lost node to take over" in (tmp_path / "standby.log").read_text(), 60,
                 "the standby to join")
        wait_for(lambda: any(a.get("standby") for a in status(server, "standby").get("agents", [])), 30,
                 "taskd status to list the standby")
        wait_for(lambda: all((tmp_path / "ckpt" / f"rank{r}").is_dir() for r in range(4)), 60, "every checkpoint")
        os.killpg(procs["node1"].pid, signal.SIGKILL)
        assert procs["node1"].wait(timeout=10) == -signal.SIGKILL
        # Kubernetes recreates the lost pod with its index: a `taskd run --node-rank 1` finding node 1 held by the
        # standby that replaced it becomes a standby itself (no failed pod for the Job to count) and exits 0
        wait_for(lambda: "replaces a lost node" in (tmp_path / "standby.log").read_text(), 30, "the takeover")
        procs["recreated"] = node([*job_args(server, "standby", 1), *example(tmp_path)], tmp_path / "recreated.log")
        codes = finish({k: v for k, v in procs.items() if k != "node1"}, tmp_path)
        text = logs(tmp_path, "node0", "standby", "recreated")
        assert codes == {"node0": 0, "standby": 0, "recreated": 0}, text
        assert "this standby takes over node 1" in text, text
        recreated = (tmp_path / "recreated.log").read_text()
        assert "node 1 of job standby is held by " in recreated and "joins the job as a standby instead" in recreated
        assert "standby not needed" in recreated and "refused registration" not in recreated, text
        assert recreated.count("joins the job as a standby instead") == 1 and "FAILED" not in recreated, text
        # its stream as a standby ends when it registers as node 1: it resubscribes at once (an INFO line), where it
        # warned "ended; reconnecting" and backed off 0.4-0.5 s before
        assert "ended; reconnecting" not in (tmp_path / "standby.log").read_text(), text
        assert_job_done(tmp_path, server, "standby", fault_free)
    finally:
        kill_all(list(procs.values()))


def test_a_standby_never_needed_exits_0_when_the_job_ends(tmp_path: Path, server: str) -> None:
    procs = {f"node{r}": node([*job_args(server, "spare", r), *example(tmp_path, steps=20)], tmp_path / f"node{r}.log")
             for r in range(2)}
    procs["standby"] = node([*job_args(server, "spare", None), *example(tmp_path, steps=20)],
                            tmp_path / "standby.log")
    try:
        codes = finish(procs, tmp_path)
        text = logs(tmp_path, "node0", "node1", "standby")
        assert codes == {"node0": 0, "node1": 0, "standby": 0}, text
        assert "standby not needed" in (tmp_path / "standby.log").read_text(), text
        assert status(server, "spare").get("state") == "SUCCEEDED"
    finally:
        kill_all(list(procs.values()))


def test_a_sigstopped_node_that_comes_back_is_fenced(tmp_path: Path, server: str,
                                                     fault_free: list[np.ndarray]) -> None:
    # node 0's ranks train on while node 1 is stopped, declared lost and replaced: with 0.04 s steps they
    # finished the 150 before the replacement joined under load (then no round can recover node 1's ranks);
    # 0.2 s steps leave 30 s for up to 20 s of detection and the replacement's start
    slow = example(tmp_path, sleep=0.2, paced=True)
    procs = {f"node{r}": node([*job_args(server, "fence", r), *slow], tmp_path / f"node{r}.log") for r in range(2)}
    try:
        wait_for(lambda: all((tmp_path / "ckpt" / f"rank{r}").is_dir() for r in range(4)), 60, "every checkpoint")
        node0_ranks = set(ranks_of(procs["node0"].pid).values())
        old = procs["node1"]
        frozen = whole_node(old)
        old_ranks = set(ranks_of(old.pid).values())
        assert len(old_ranks) == 2
        signal_node(frozen, signal.SIGSTOP)
        stopped = time.monotonic()
        # its connection answers no PING: closed within ping interval + timeout, then the loss grace
        wait_for(lambda: events(server, "fence", "node_lost"), 20, "the controller to declare node 1 lost")
        print(f"SIGSTOPped node declared lost after {time.monotonic() - stopped:.1f}s")
        procs["replacement"] = node([*job_args(server, "fence", 1), *slow], tmp_path / "replacement.log")
        rescheduled(tmp_path, procs["node0"], node0_ranks, procs["replacement"])
        signal_node(frozen, signal.SIGCONT)
        assert old.wait(timeout=30) == 1, (tmp_path / "node1.log").read_text()
        text1 = (tmp_path / "node1.log").read_text()
        assert "fenced" in text1 and str(procs["replacement"].pid) in text1, text1  # names what replaced it
        wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                 for p in old_ranks), 10, "the fenced node's ranks to stop")
        codes = finish({k: v for k, v in procs.items() if k != "node1"}, tmp_path)
        assert codes == {"node0": 0, "replacement": 0}, logs(tmp_path, "node0", "replacement")
        assert_job_done(tmp_path, server, "fence", fault_free)
    finally:
        kill_all(list(procs.values()))


def test_a_survivor_says_what_its_round_waits_for_while_it_waits(tmp_path: Path, fault_free: list[np.ndarray]) -> None:
    """Issue 31, F10: while the round waited for a lost node's replacement (60 s here, 300 s by default) the
    survivors printed nothing. Node 0 now says, when the wait starts, what it waits for and for how long at most;
    then every rejoin-timeout/10 s (at least 5) while it lasts; and when it ends."""
    with node_loss_server(tmp_path, rejoin_timeout="40") as address:  # a "still waiting" line every 5 s
        slow = example(tmp_path, sleep=0.2, paced=True)  # node 0's ranks train on while the round waits: 30 s
        procs = {f"node{r}": node([*job_args(address, "wait", r), *slow], tmp_path / f"node{r}.log") for r in range(2)}
        try:
            wait_for(lambda: all((tmp_path / "ckpt" / f"rank{r}").is_dir() for r in range(4)), 60, "every checkpoint")
            node0_ranks = set(ranks_of(procs["node0"].pid).values())
            os.killpg(procs["node1"].pid, signal.SIGKILL)
            assert procs["node1"].wait(timeout=10) == -signal.SIGKILL
            survivor = tmp_path / "node0.log"
            wait_for(lambda: "node 1 lost: the round waits for a replacement" in survivor.read_text(), 30,
                     "node 0 to say what it waits for")
            wait_for(lambda: "still waiting for a replacement of node 1" in survivor.read_text(), 15,
                     "node 0 to say it still waits")
            procs["replacement"] = node([*job_args(address, "wait", 1), *slow], tmp_path / "replacement.log")
            rescheduled(tmp_path, procs["node0"], node0_ranks, procs["replacement"])
            codes = finish({k: v for k, v in procs.items() if k != "node1"}, tmp_path)
            assert codes == {"node0": 0, "replacement": 0}, logs(tmp_path, "node0", "replacement")
            text = survivor.read_text()
            assert "(the controller's --node-rejoin-timeout is 40s)" in text, text
            assert "the wait for a replacement of node 1 ended after" in text, text
            assert "waits for a replacement" not in (tmp_path / "replacement.log").read_text()
            assert_job_done(tmp_path, address, "wait", fault_free)
        finally:
            kill_all(list(procs.values()))
