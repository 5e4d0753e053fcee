"""A lost node's ranks restore from its buddy's copy of their snapshots (issue 33, item 3), end to end.

One `taskd server` with a token, two `taskd run` nodes each with the job's credential, examples/train_resumable.py
(snapshots every step, disk checkpoints only every 50): once node 1's snapshots are replicated to node 0's agent
(`taskd status` shows it), node 1's whole `taskd run` is SIGKILLed and a replacement started. The replacement
fetches node 1's snapshots from node 0's agent before its ranks start, they restore from memory (a few steps
redone, not the 50 since a checkpoint), and every rank's final parameters equal a fault-free run's. Another job's
credential reads nothing from an agent's snapshot service; the job leaves nothing in /dev/shm.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from support import STARTED, free_port, port_open, wait_for
from support.run import EXAMPLE, ROOT

from taskd.controller.service.auth import job_credential
from taskd.proto import taskd_pb2, taskd_pb2_grpc

STEPS = 600
PLAIN_STEPS = 400
PLAIN = ROOT / "examples" / "torch" / "train_plain.py"
CKPT_EVERY = 50
ADMIN = "buddy-admin-token-0123456789"
JOB = f"buddy{os.getpid()}"  # its own: another run of this file on the machine holds /dev/shm too


def example(tmp: Path, sleep: float = 0.1) -> list[str]:
    """The job's script, `sleep` s a step while tmp/pace exists (`unpace`)."""
    return [str(EXAMPLE), "--steps", str(STEPS), "--ckpt-every", str(CKPT_EVERY), "--ckpt-dir", str(tmp / "ckpt"),
            "--out", str(tmp / "out"), "--step-sleep", str(sleep), "--sleep-while", str(paced(tmp))]


def paced(tmp: Path) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "pace").touch(exist_ok=True)
    return tmp / "pace"


def unpace(tmp: Path, *logs: str) -> None:
    """Once every node in `logs` said its ranks train again after the round, let the rest of the job run at full
    speed: the slow steps only had to outlast the replication, the loss and the replacement's restore."""
    wait_for(lambda: all("training resumed" in (tmp / f"{name}.log").read_text() for name in logs), 120,
             f"{', '.join(logs)} to say training resumed")
    (tmp / "pace").unlink()


def node(args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    environ = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "MINDX_TASK_ID")} | env
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", *args],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=environ, cwd=ROOT,
                            start_new_session=True)
    STARTED.append(proc)
    return proc


def status(address: str, token: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", address, "--job", JOB, "--json",
                          "--token-file", str(token)], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)["jobs"][0]


def copied(node_rank: int) -> int:
    """The newest step of node ``node_rank``'s copy another agent holds in /dev/shm (-1: none)."""
    steps = [int(os.path.basename(p)[1:13]) for p in glob.glob(f"/dev/shm/taskd-snap-{JOB}-*/peer/node{node_rank}/"
                                                                 "rank*/s*.snap")]
    return max(steps, default=-1)


def buddy_address(log: Path, node_rank: int) -> str:
    """The address of node ``node_rank``'s snapshot service, as its buddy's console named it."""
    found = re.findall(rf"copied to node {node_rank}'s agent \((\S+)\)", log.read_text())
    assert found, log.read_text()
    return found[-1]


def round_account(address: str, token: Path) -> dict:
    """The restores the last `round_training_resumed` event collected (node -> from, step, steps_redone), and
    whether `taskd status`'s text view shows node 1's: ({} until the round's last node reported)."""
    done = [e for e in status(address, token).get("events", []) if e.get("kind") == "round_training_resumed"]
    detail = done[-1]["detail"] if done else {}  # --json parses the event's detail
    return (json.loads(detail) if isinstance(detail, str) else detail).get("restored", {})


def status_text(address: str, token: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", address, "--job", JOB,
                          "--token-file", str(token)], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def fetch(address: str, node_rank: int, key: str) -> tuple[grpc.StatusCode | None, int]:
    """A Fetch of node ``node_rank``'s copy from the agent serving ``address``: (error code or None, bytes)."""
    with grpc.insecure_channel(address) as channel:
        stream = taskd_pb2_grpc.SnapshotPeerStub(channel).Fetch(
            taskd_pb2.FetchRequest(jobId=JOB, nodeRank=node_rank), timeout=10,
            metadata=(("authorization", f"Bearer {key}"),))
        try:
            return None, sum(len(c.data) for c in stream)
        except grpc.RpcError as exc:
            return exc.code(), 0


def shm_left() -> list[str]:
    return glob.glob(f"/dev/shm/taskd-snap-{JOB}-*")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """A `taskd server` with an admin token that declares a silent node lost within seconds: (address, the admin
    token's file, the job's credential's file)."""
    admin = tmp_path / "admin.token"
    admin.write_text(ADMIN)
    cred = tmp_path / "job.token"
    cred.write_text(job_credential(ADMIN, JOB))
    port = free_port()
    address = f"127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", address, "--state", ":memory:",
                             "--token-file", str(admin), "--agent-loss-grace", "1", "--agent-loss-timeout", "4",
                             "--agent-ping-interval", "1", "--agent-ping-timeout", "1"],
                            stdout=(tmp_path / "server.log").open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    STARTED.append(proc)
    try:
        wait_for(lambda: port_open(port) or proc.poll() is not None, 30, "taskd server to listen")
        yield address, admin, cred
    finally:
        proc.kill()
        proc.wait(timeout=10)


MASTER_PORTS: dict[str, int] = {}  # server address -> the job's rendezvous port, the same for every node of the job


def job_args(address: str, cred: Path, rank: int | None) -> list[str]:
    """A node of the job; every node of one job (replacements, standbys) gets the job's free rendezvous port, never
    the default 29500 that a parallel job may hold."""
    where = ["--standby"] if rank is None else ["--node-rank", str(rank)]
    port = MASTER_PORTS.setdefault(address, free_port())
    return ["--nnodes", "2", *where, "--nproc-per-node", "2", "--job-id", JOB, "--server", address,
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--token-file", str(cred), "--stop-grace", "2",
            "--strategies", "job-rescheduling,exit"]


def kill_all(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    tmp = tmp_path_factory.mktemp("buddy-baseline")
    proc = node(["--nproc-per-node", "4", "--quiet", *example(tmp, sleep=0.0)], tmp / "console.log")
    assert proc.wait(timeout=120) == 0, (tmp / "console.log").read_text()
    return [np.load(tmp / "out" / f"rank{r}.npy") for r in range(4)]


def test_a_replacement_restores_a_lost_nodes_ranks_from_its_buddys_copy(
        tmp_path: Path, server: tuple[str, Path, Path], fault_free: list[np.ndarray]) -> None:
    address, admin, cred = server
    procs = {f"node{r}": node([*job_args(address, cred, r), *example(tmp_path)], tmp_path / f"node{r}.log")
             for r in range(2)}
    try:
        wait_for(lambda: copied(1) >= 20, 60, "node 1's snapshots copied to node 0 past step 20")
        def shown() -> dict:  # node 1's replication as `taskd status` shows it (from its last report, each second)
            return next((s for s in status(address, admin).get("snapshots", []) if s.get("nodeRank") == 1), {})
        wait_for(lambda: int(shown().get("replicatedStep", -1)) >= 0, 30, "taskd status to show node 1's copy")
        assert shown()["buddyNodeRank"] == 0 and float(shown()["lagSeconds"]) >= 0

        # another job's credential reads nothing; this job's reads node 1's copy (the same call, the right key)
        peer = buddy_address(tmp_path / "node1.log", 0)
        assert fetch(peer, 1, job_credential(ADMIN, "another-job")) == (grpc.StatusCode.UNAUTHENTICATED, 0)
        code, size = fetch(peer, 1, job_credential(ADMIN, JOB))
        assert code is None and size > 0, (code, size)

        assert procs["node1"].poll() is None, "the job ended before its node was lost: give it more steps"
        os.killpg(procs["node1"].pid, signal.SIGKILL)  # the whole node: agent, ranks, its /dev/shm copy
        assert procs["node1"].wait(timeout=10) == -signal.SIGKILL
        reached = {r: os.path.getsize(tmp_path / "out" / f"rank{r}.computed") for r in (2, 3)}
        time.sleep(1)
        procs["replacement"] = node([*job_args(address, cred, 1), *example(tmp_path)], tmp_path / "replacement.log")
        unpace(tmp_path, "node0", "replacement")
        for name in ("node0", "replacement"):
            assert procs[name].wait(timeout=120) == 0, (tmp_path / f"{name}.log").read_text()
        log = (tmp_path / "replacement.log").read_text()
        assert "fetched node 1's snapshots" in log and "its ranks restore from memory" in log, log
        # the replacement's agent says where its ranks restored from, as a survivor's does, and so does the round
        # each rank its own step: ranks that never exchange state drift apart, and each rank's newest is copied
        resumed = re.search(r"training resumed .*", log)
        assert resumed is not None, log
        buddy = r"rank\(s\) ([\d, ]+) restored step \d+ from the buddy's copy \(node 0's agent\)"
        assert {int(r) for ranks in re.findall(buddy, resumed.group(0)) for r in ranks.split(", ")} == {2, 3}, log
        wait_for(lambda: round_account(address, admin).get("1", {}).get("from") == "buddy", 15,
                 "the round's account to name node 1's buddy restore")
        assert 0 <= round_account(address, admin)["1"]["steps_redone"] <= 5, round_account(address, admin)
        assert re.search(r"round \d+: restored node 0 from memory at step \d+.*; node 1 from buddy at step \d+",
                         status_text(address, admin)), status_text(address, admin)
        for rank, (got, want) in enumerate(zip([np.load(tmp_path / "out" / f"rank{r}.npy") for r in range(4)],
                                               fault_free, strict=True)):
            assert np.array_equal(got, want), f"rank {rank}'s final parameters differ from the fault-free run's"
        for rank in (2, 3):
            summary = json.loads((tmp_path / "out" / f"rank{rank}.json").read_text())
            assert summary["restored_from"] == "buddy", summary  # memory: the copy its replacement fetched
            redone = reached[rank] - summary["resumed_from"]
            assert 0 <= redone <= 5, (rank, reached[rank], summary)  # a disk checkpoint is up to 50 steps back
        wait_for(lambda: shm_left() == [], 15, "the job's snapshots gone from /dev/shm")
    finally:
        kill_all(procs)


def plain(tmp: Path, steps: int, sleep: float) -> list[str]:
    """train_plain.py, `sleep` s a step while tmp/pace exists (`unpace`)."""
    return [str(PLAIN), "--steps", str(steps), "--out", str(tmp / "out"), "--ckpt-dir", str(tmp / "ckpt"),
            "--ckpt-every", "100", "--snapshot-every", "1", "--snapshot-keep", "6", "--step-sleep", str(sleep),
            "--sleep-while", str(paced(tmp))]


def test_a_standby_taking_a_lost_node_restores_a_ddp_jobs_cut_from_memory(tmp_path: Path,
                                                                         server: tuple[str, Path, Path]) -> None:
    """examples/torch/train_plain.py (DDP over gloo, scope "job"): every rank restores the newest step all four
    hold, node 1's from the copy the standby fetched from node 0; final parameters equal a fault-free run's."""
    base = tmp_path / "baseline"
    proc = node(["--nproc-per-node", "4", "--nnodes", "1", "--quiet", *plain(base, PLAIN_STEPS, 0.0)],
                tmp_path / "baseline.log")
    assert proc.wait(timeout=180) == 0, (tmp_path / "baseline.log").read_text()
    address, admin, cred = server
    procs = {f"node{r}": node([*job_args(address, cred, r), *plain(tmp_path, PLAIN_STEPS, 0.05)],
                              tmp_path / f"node{r}.log") for r in range(2)}
    procs["standby"] = node([*job_args(address, cred, None), *plain(tmp_path, PLAIN_STEPS, 0.05)],
                            tmp_path / "standby.log")
    try:
        wait_for(lambda: copied(1) >= 20, 90, "node 1's snapshots copied to node 0 past step 20")
        assert procs["node1"].poll() is None, "the job ended before its node was lost: give it more steps"
        os.killpg(procs["node1"].pid, signal.SIGKILL)
        assert procs["node1"].wait(timeout=10) == -signal.SIGKILL
        reached = os.path.getsize(tmp_path / "out" / "rank2.computed")
        unpace(tmp_path, "node0", "standby")
        for name in ("node0", "standby"):
            assert procs[name].wait(timeout=180) == 0, (tmp_path / f"{name}.log").read_text()
        log = (tmp_path / "standby.log").read_text()
        assert "this standby takes over node 1" in log and "fetched node 1's snapshots" in log, log
        assert re.search(r"training resumed .*; rank\(s\) 2, 3 restored step \d+ from the buddy's copy", log), log
        wait_for(lambda: len(round_account(address, admin)) == 2, 15, "the round's account to name both nodes")
        account = round_account(address, admin)
        assert [account[n]["from"] for n in ("0", "1")] == ["memory", "buddy"], account
        assert account["0"]["step"] == account["1"]["step"], account  # one cut
        survivor = (tmp_path / "node0.log").read_text()  # its account: where its restarted ranks restored from
        assert re.search(r"training resumed .*; rank\(s\) 0, 1 restored step \d+ from this node's memory", survivor), \
            survivor
        summaries = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(4)]
        assert [s["restored_from"] for s in summaries] == ["memory", "memory", "buddy", "buddy"], summaries
        assert len({s["resumed_from"] for s in summaries}) == 1, summaries  # one cut
        assert 0 <= reached - summaries[2]["resumed_from"] <= 6, (reached, summaries)  # disk: back to 0 or 100
        for r in range(4):
            got, want = torch.load(tmp_path / "out" / f"rank{r}.pt"), torch.load(base / "out" / f"rank{r}.pt")
            assert all(torch.equal(got[k], want[k]) for k in want), f"rank {r}'s parameters differ"
        wait_for(lambda: shm_left() == [], 15, "the job's snapshots gone from /dev/shm")
    finally:
        kill_all(procs)


def test_both_copies_lost_falls_back_to_disk_saying_so(tmp_path: Path, server: tuple[str, Path, Path]) -> None:
    """Both nodes of a 2-node job, each the other's buddy, SIGKILLed at once: no copy of either survives, so each
    replacement says so in one line and every rank restores its disk checkpoint, bit-identical all the same.
    train_plain.py (DDP: its ranks publish in step, so each node's copy keeps up), 120 steps 0.05 s apart,
    checkpoints every 20, killed once both copies are past step 25."""
    base = tmp_path / "baseline"
    short = ["--steps", "120", "--ckpt-every", "20"]  # the last of an option wins
    proc = node(["--nproc-per-node", "4", "--nnodes", "1", "--quiet", *plain(base, 120, 0.0), *short],
                tmp_path / "baseline.log")
    assert proc.wait(timeout=180) == 0, (tmp_path / "baseline.log").read_text()
    address, _admin, cred = server
    procs = {f"node{r}": node([*job_args(address, cred, r), *plain(tmp_path, 120, 0.05), *short],
                              tmp_path / f"node{r}.log") for r in range(2)}
    try:
        wait_for(lambda: min(copied(0), copied(1)) >= 25, 90, "each node's snapshots copied to the other")
        assert all(p.poll() is None for p in procs.values()), "the job ended before its nodes were lost"
        for name in ("node0", "node1"):  # both at once: each held the other's copy
            os.killpg(procs[name].pid, signal.SIGKILL)
        for name in ("node0", "node1"):
            assert procs[name].wait(timeout=10) == -signal.SIGKILL
        # a replacement that registers before its node is declared lost finds no agent connected: a rerun
        wait_for(lambda: (tmp_path / "server.log").read_text().count("node_lost {") >= 2, 30,
                 "the controller to declare both nodes lost")
        for r in range(2):
            procs[f"replacement{r}"] = node([*job_args(address, cred, r), *plain(tmp_path, 120, 0.0), *short],
                                            tmp_path / f"replacement{r}.log")
        for r in range(2):
            assert procs[f"replacement{r}"].wait(timeout=120) == 0, (tmp_path / f"replacement{r}.log").read_text()
            log = (tmp_path / f"replacement{r}.log").read_text()
            # the controller names no holder, or one whose report is still fresh: its agent refuses the connection
            assert re.search(rf"(no buddy copy of node {r}'s snapshots survives \(no agent holds a copy of it\)|"
                             rf"node {r}'s snapshots could not be "
                             rf"fetched from node {1 - r}'s agent \(UNAVAILABLE: [^\n]*\)): its ranks fall back to "
                             "their disk checkpoints", log), log
            # each rank's own line says what happened (its node's copy lost with its buddy's), not a guess
            assert re.search(rf"rank {2 * r}: no snapshot in memory to restore \(node {r} was lost with its "
                             r"snapshots, and [^\n]*\): falling back to", log), log
        for r in range(4):
            summary = json.loads((tmp_path / "out" / f"rank{r}.json").read_text())
            assert summary["restored_from"] == "disk" and 20 <= summary["resumed_from"] < 120, summary
            got, want = torch.load(tmp_path / "out" / f"rank{r}.pt"), torch.load(base / "out" / f"rank{r}.pt")
            assert all(torch.equal(got[k], want[k]) for k in want), f"rank {r}'s parameters differ"
        wait_for(lambda: shm_left() == [], 15, "the job's snapshots gone from /dev/shm")
    finally:
        kill_all(procs)
