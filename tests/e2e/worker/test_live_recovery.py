"""Live recovery of a real DDP job (torch, gloo): the test plays the agent's part of the protocol.

It hosts the rendezvous store with taskd.rendezvous, starts examples/torch/train_ddp.py ranks with
the environment a launcher gives them, kills a rank, writes the control file and starts the
replacement with TASKD_GENERATION, exactly as docs/worker.md "Live recovery protocol" says an
agent does. Every run is compared with a fault-free run: final.pt must be bit-identical.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support import STARTED, wait_for  # noqa: E402

from taskd.rendezvous import StoreHost  # noqa: E402
from taskd.worker import CheckpointManager  # noqa: E402
from taskd.worker.env import Var  # noqa: E402
from taskd.worker.heartbeat_file import HeartbeatFile  # noqa: E402
from taskd.worker.live import ErrorKind, Phase, read_rank_status, write_control  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "torch" / "train_ddp.py"
WORLD = 3
STEPS = 30
SMALL = ["--hidden", "64", "--layers", "2", "--steps", str(STEPS), "--ckpt-every", "10", "--step-sleep", "0.05",
         "--pg-timeout", "30"]
TIMEOUT = 90.0


class Agent:
    """The agent's side for one node: store, heartbeat files, control file, rank processes."""

    def __init__(self, tmp: Path, extra: list[str] | None = None) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.out = tmp / "out"
        self.args = [*SMALL, "--ckpt-dir", str(tmp / "ckpt"), "--out", str(self.out), *(extra or [])]
        self.control = tmp / "control.json"
        self.store = StoreHost.start("127.0.0.1", 0, timeout=60)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.incarnations = 0

    def hb_path(self, rank: int) -> Path:
        return self.tmp / f"rank_{rank}.hb"

    def start(self, rank: int, generation: int = 0, join_after: int | None = None) -> subprocess.Popen[bytes]:
        HeartbeatFile(self.hb_path(rank)).create()
        env = dict(os.environ)
        env.update(self.store.env())
        env.update({Var.RANK: str(rank), Var.LOCAL_RANK: str(rank), Var.WORLD_SIZE: str(WORLD),
                    Var.LOCAL_WORLD_SIZE: str(WORLD), Var.TASKD_HEARTBEAT_FILE: str(self.hb_path(rank)),
                    Var.TASKD_CONTROL_FILE: str(self.control), Var.TASKD_GENERATION: str(generation),
                    Var.TASKD_REJOIN_TIMEOUT: "60", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
        if join_after is not None:  # a prepared replacement: started before its generation is named
            env[Var.TASKD_JOIN_AFTER] = str(join_after)
        self.incarnations += 1
        log = open(self.tmp / f"rank{rank}.{self.incarnations}.log", "wb")  # noqa: SIM115 - closed with the test
        proc = subprocess.Popen([sys.executable, "-u", str(EXAMPLE), *self.args], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        STARTED.append(proc)
        self.procs[rank] = proc
        return proc

    def start_all(self) -> dict[int, int]:
        for r in range(WORLD):
            self.start(r)
        return {r: p.pid for r, p in self.procs.items()}

    def status(self, rank: int):  # noqa: ANN201
        return read_rank_status(self.hb_path(rank))

    def wait_step(self, rank: int, step: int) -> None:
        wait_for(lambda: (self.status(rank).heartbeat.step or -1) >= step, TIMEOUT, f"rank {rank} past step {step}")

    def kill(self, rank: int) -> None:
        proc = self.procs[rank]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def finish(self) -> dict:
        for rank, proc in self.procs.items():
            try:
                code = proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {rank} did not finish; logs: {self.logs()}")
            assert code == 0, f"rank {rank} exited with {code}; logs: {self.logs()}"
        self.store.close()
        return json.loads((self.out / "summary.json").read_text())

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("rank*.log")))

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        self.store.close()


@pytest.fixture
def agent(tmp_path):
    agents: list[Agent] = []

    def make(extra: list[str] | None = None) -> Agent:
        agents.append(Agent(tmp_path / f"job{len(agents)}", extra))
        return agents[-1]

    yield make
    for a in agents:
        a.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """final.pt of a fault-free live run with the same arguments."""
    job = Agent(tmp_path_factory.mktemp("reference"))
    try:
        job.start_all()
        summary = job.finish()
    finally:
        job.close()
    assert summary["recomputed"] == {str(r): 0 for r in range(WORLD)}
    return torch.load(job.out / "final.pt")


def assert_identical(final: dict, reference: dict) -> None:
    assert final.keys() == reference.keys()
    for key in final:
        assert torch.equal(final[key], reference[key]), f"{key} differs by {(final[key] - reference[key]).abs().max()}"


@pytest.mark.parametrize("victim", [2])  # rank 0 is test_live_e2e.py's, through taskd run
def test_sigkill_of_a_rank_is_recovered_in_place_bit_identically(agent, reference, victim):
    job = agent()
    pids = job.start_all()
    job.wait_step(victim, 8)
    job.kill(victim)
    # prepared, as taskd run's agent does with a warm spare: started at once, told its generation only later
    job.start(victim, generation=0, join_after=0)
    wait_for(lambda: job.status(victim).declared, TIMEOUT, "the prepared replacement to declare itself")
    assert job.status(victim).phase == Phase.REJOINING and job.status(victim).generation is None  # waiting
    write_control(job.control, generation=1, action="rejoin", timeout=60)
    summary = job.finish()

    survivors = [r for r in range(WORLD) if r != victim]
    assert {r: summary["ranks"][str(r)]["pid"] for r in survivors} == {r: pids[r] for r in survivors}
    assert_identical(torch.load(job.out / "final.pt"), reference)
    assert all(summary["recomputed"][str(r)] == 0 for r in survivors), summary["recomputed"]
    assert summary["recomputed"][str(victim)] <= 1, summary["recomputed"]
    assert summary["generation"] == 1
    for r in survivors:
        recoveries = summary["ranks"][str(r)]["recoveries"]
        assert [e["generation"] for e in recoveries] == [1]
        assert recoveries[0]["wrappers_freed"] is True  # the old DDP wrapper did not outlive the rebuild
        # a survivor learns of the loss from a failed collective, or first from the control file at a step boundary
        assert recoveries[0]["error"] in (ErrorKind.PEER_LOST.name, None)
    assert summary["ranks"][str(victim)]["recoveries"] == []  # the replacement joined, it did not recover
    for r in range(WORLD):
        status = job.status(r)
        assert status.can_rejoin and status.generation == 1 and status.phase == Phase.COMPLETE  # loop ran out


@pytest.mark.parametrize("where", ["before backward", "after backward"])
def test_retryable_error_is_retried_in_place_with_no_process_restart(agent, reference, where):
    # before backward the raising rank drains every gradient bucket its peers reduce; after it, none is owed
    job = agent(["--retryable-error-at-step", "10", "--fault-rank", "1",
                 *(["--retryable-after-backward"] if where == "after backward" else [])])
    pids = job.start_all()
    wait_for(lambda: job.status(1).errors > 0, TIMEOUT, "rank 1 to report its retryable error")
    status = job.status(1)
    assert status.error_kind == ErrorKind.RETRYABLE and status.error_step == 10
    write_control(job.control, generation=1, action="retry", timeout=60)
    summary = job.finish()

    assert {r: summary["ranks"][str(r)]["pid"] for r in range(WORLD)} == pids
    assert job.incarnations == WORLD
    assert_identical(torch.load(job.out / "final.pt"), reference)
    assert summary["recomputed"] == {str(r): 0 for r in range(WORLD)}
    assert all(summary["ranks"][str(r)]["recoveries"][0]["action"] == "retry" for r in range(WORLD))
    assert all(summary["ranks"][str(r)]["recoveries"][0].get("in_place") for r in range(WORLD))  # drained, not rebuilt


def test_example_runs_unchanged_under_torchrun(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKD_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
         *SMALL, "--steps", "12", "--ckpt-async", "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["computed"] == {"0": 12, "1": 12}
    assert summary["generation"] == 0 and summary["ranks"]["0"]["recoveries"] == []
    final = torch.load(out / "final.pt")
    assert set(final) == {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}
    for rank in (0, 1):  # step 10's checkpoint, saved in the background (--ckpt-async), is on disk and whole
        ckpt = CheckpointManager(tmp_path / "ckpt" / f"rank{rank}")
        assert ckpt.latest_step() == 10
        assert set(ckpt.load(10)["model"]) == set(final)
