"""Chaos soak: real jobs on one `taskd server` while ranks, agents and the controller are killed and frozen
and the controller is flooded with hostile calls.

Each job is examples/train_resumable.py (deterministic, checkpoints every K steps) under `taskd run
--server` on loopback, 1 or 2 nodes of 2 ranks each on this machine. A seeded plan injects, one at a
time at random intervals:

- rank_kill: SIGKILL of a rank; rank_stop: SIGSTOP of a rank (a hang: its agent's --heartbeat-timeout sees it);
- agent_kill: SIGKILL of a `taskd run` (its ranks die with it) and nothing started in its place: the node is
  lost and the job fails after --node-rejoin-timeout, as documented;
- node_kill: SIGKILL of a whole node (a `taskd run`'s process group: agent and ranks), then a replacement
  `taskd run --node-rank R` a seeded delay later, or, for a job started with a standby, the standby takes
  it over and a new standby is started (bench/chaos_nodes.py);
- agent_stop: SIGSTOP of a `taskd run` for a few seconds, then SIGCONT;
- controller_kill: SIGKILL of `taskd server`, restarted from its state file on the same port;
- round_controller_kill: SIGKILL of a rank of a job in the first half of its steps, then of `taskd server` at once
  or as soon as its state file holds the round STOPPING, COLLECTING or RECOVERING, restarted 1 s later (issue 31,
  F2): the round must be resumed or run again once, never lost or redone;
- controller_stop: SIGSTOP of `taskd server` for a few seconds, then SIGCONT;
- hostile: a burst of calls from bench/chaos_hostile.py (forgeries without the token, malformed input).

It reports faults injected by kind; jobs correct (every node exit 0, every rank's final parameters
bit-identical to a fault-free run of the example), failed as designed (restart budget spent, or an
agent SIGKILLed with nothing in its place) or failed wrongly; node kills against the controller's
record (each one a node loss replaced by the process the bench started, no round charged more than one
restart); hostile calls by verdict; orphans (a process still alive after its job ended, found in
/proc by a marker in its environment or by its agent's process group); controller crashes (exits the
bench did not cause); lost jobs (listed before a controller restart, missing after).
Every wait is bounded; it talks only to 127.0.0.1.

    python bench/chaos.py [--quick] [--seed N] [--duration S | --jobs N] [--nodes 1|2|1,2] [--standby-share F]
                          [--no-token]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from chaos_hostile import Hostile, Target
from chaos_nodes import NodeLoss, Nodes, node_checks, summarize
from chaos_procs import heartbeating, is_stopped, step, tagged
from common import ROOT, bench_env, free_port, header, rank_pids, table, write_result

from taskd.proto import taskd_pb2, taskd_pb2_grpc

EXAMPLE = ROOT / "examples" / "train_resumable.py"
RANKS_PER_NODE = 2
# weights of the draws after the first round of every kind; an agent SIGKILL with no replacement ends its job,
# so it is rare; a node kill fits only a multi-node job early in its steps, so it is drawn often
KINDS = {"rank_kill": 4.0, "rank_stop": 2.0, "agent_kill": 0.25, "node_kill": 3.0, "agent_stop": 1.0,
         "controller_kill": 1.0, "controller_stop": 1.0, "hostile": 3.0, "round_controller_kill": 1.5}
PLAN_GRACE = 20.0  # seconds the fault window stays open past --duration while a kind of the first plan waits
# when round_controller_kill SIGKILLs the controller: at once after the rank's SIGKILL, or as soon as the state file
# holds the job in this state (polled every 2 ms, for at most 1 s: a phase may be over before it is seen)
ROUND_KILL_AT = ("fault", "STOPPING", "COLLECTING", "RECOVERING")
REJOIN_TIMEOUT = 20.0  # --node-rejoin-timeout: a node killed with no replacement fails its job this long after
SERVER_FLAGS = ["--stop-timeout", "10", "--strategy-timeout", "10", "--recover-timeout", "20",
                "--resume-timeout", "10", "--agent-loss-timeout", "10", "--keepalive-interval", "2",
                "--agent-loss-grace", "2", "--node-rejoin-timeout", f"{REJOIN_TIMEOUT:g}"]
REPLACEMENT_DELAY = (0.5, 3.0)  # seconds from a node kill to its replacement's start (--quick: 0.3-1.0)
NODE_KILL_BEFORE = 0.5  # a node is killed only while every rank is in the first half of its steps: the example's
# ranks are independent, so the survivors train on during the node-loss round, and one that finishes before
# the replacement joined fails the job by design (docs/controller.md), which would say nothing about node loss
ORPHAN_GRACE = 10.0  # after a job's last agent exits, its processes have this long to be gone
CALL_TIMEOUT = 10.0


@dataclass
class Job:
    index: int
    job_id: str
    nodes: int
    work: Path
    agents: list[subprocess.Popen[bytes]]  # every `taskd run` started for the job (replacements and standbys too)
    started: float
    deadline: float
    master: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    nodeset: Nodes = field(default_factory=Nodes)
    standby: bool = False  # started with a standby (and one more after each it used)
    agent_killed: bool = False
    faults: Counter[str] = field(default_factory=Counter)
    interrupted: dict[int, str] = field(default_factory=dict)  # round -> its job's state at a round_controller_kill
    codes: list[int | None] = field(default_factory=list)
    ended: float | None = None
    orphan_check_at: float | None = None
    outcome: str = ""
    detail: str = ""

    def running(self) -> bool:
        return self.ended is None


class Controller:
    """The `taskd server` under test: SIGKILL/SIGSTOP it, restart it from its state file on the same port."""

    def __init__(self, port: int, state: Path, log: Path, token_file: Path | None) -> None:
        self.port, self.state, self.log, self.token_file = port, state, log, token_file
        self.address = f"127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.mode = "down"  # up | stopped | down
        self.crashes: list[dict[str, Any]] = []
        self.restarts = 0
        self.token = token_file.read_text().strip() if token_file else None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "taskd.controller", "--listen", self.address, "--state", str(self.state),
               "--log-level", "INFO", *SERVER_FLAGS]
        if self.token_file:
            cmd += ["--token-file", str(self.token_file)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=bench_env(), cwd=ROOT,
                                         start_new_session=True)
        deadline = time.monotonic() + 30
        while self.list_jobs(timeout=2) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"controller did not come up (exit {self.proc.poll()}); log: {self.log}")
            time.sleep(0.1)
        self.mode = "up"

    def stored_state(self, job_id: str) -> str:
        """The job's state as the state file holds it (read-only; "" when unreadable or absent)."""
        try:
            with contextlib.closing(sqlite3.connect(f"file:{self.state}?mode=ro", uri=True, timeout=1)) as db:
                row = db.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        except sqlite3.Error:
            return ""
        return row[0] if row else ""

    def metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.token}")] if self.token else []

    def list_jobs(self, timeout: float = CALL_TIMEOUT, job_id: str = "") -> list[taskd_pb2.JobRecord] | None:
        """Every job (pages followed), or None when the controller does not answer."""
        jobs: list[taskd_pb2.JobRecord] = []
        token = ""
        try:
            with grpc.insecure_channel(self.address) as ch:
                stub = taskd_pb2_grpc.JobStatusStub(ch)
                while True:
                    reply = stub.ListJobs(taskd_pb2.JobQuery(jobId=job_id, pageSize=200, pageToken=token),
                                          timeout=timeout, metadata=self.metadata())
                    if reply.status.code != 0:
                        return None
                    jobs.extend(reply.jobs)
                    token = reply.nextPageToken
                    if not token:
                        return jobs
        except grpc.RpcError:
            return None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def exited_unasked(self) -> bool:
        """True once when the controller exits without the bench killing it (a crash); the bench restarts it."""
        if self.proc is None or self.mode == "down" or self.proc.poll() is None:
            return False
        tail = self.log.read_bytes()[-3000:].decode(errors="replace")
        self.crashes.append({"time": time.time(), "exit": self.proc.returncode, "log_tail": tail})
        self.mode = "down"
        return True

    def shutdown(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)  # a frozen controller cannot act on SIGTERM
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                return None
        self.mode = "down"
        return self.proc.returncode


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        self.tag = f"chaos-{os.getpid()}-{secrets.token_hex(4)}"
        token_file = None
        if args.token:
            token_file = work / "token"
            token_file.write_text(secrets.token_hex(32) + "\n")
            token_file.chmod(0o600)
        self.token_file = token_file
        self.ctl = Controller(free_port(), work / "controller.sqlite3", work / "controller.log", token_file)
        self.jobs: list[Job] = []
        self.faults: Counter[str] = Counter()
        self.hostile: Counter[tuple[str, str]] = Counter()
        self.hostile_odd: list[dict[str, str]] = []
        self.pending: list[tuple[float, str, Callable[[], None]]] = []
        self.known: set[str] = set()  # jobs the controller listed at least once
        self.lost: list[dict[str, Any]] = []
        self.stalls = 0
        self.orphans: list[dict[str, Any]] = []
        self.stopped_ranks: set[int] = set()
        self.plan = [k for k in KINDS if k != "round_controller_kill"]
        self.rng.shuffle(self.plan)  # every kind once first (so a short run sees each), then weighted draws
        self.plan.append("round_controller_kill")  # added last: the earlier kinds keep each seed's order
        self.reference: dict[int, np.ndarray] = {}
        self.hostile_client: Hostile | None = None
        self.left_dirs: list[dict[str, Any]] = []
        self.closing = False

    def sweep_run_dirs(self) -> None:
        """The launcher's private run directories (taskd-<job>-*, heartbeat files) still in the temp directory
        once the jobs ended: a SIGKILLed `taskd run` cannot remove its own. Recorded, then removed."""
        for job in self.jobs:
            for path in Path(tempfile.gettempdir()).glob(f"taskd-{job.job_id}-*"):
                self.left_dirs.append({"job": job.job_id, "dir": str(path), "agent_killed": job.agent_killed,
                                       "outcome": job.outcome})
                shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------------ setup

    def example_args(self, out: Path, ckpt: Path, sleep: float) -> list[str]:
        return [str(EXAMPLE), "--steps", str(self.args.steps), "--ckpt-every", str(self.args.ckpt_every),
                "--ckpt-dir", str(ckpt), "--out", str(out), "--step-sleep", str(sleep), "--ckpt-timeout", "8"]

    def run_reference(self) -> None:
        """The fault-free run every job is compared with: the same example and arguments (no step sleep, which
        changes no number) under `taskd run` with its embedded controller, one rank per global rank used."""
        ref = self.work / "reference"
        world = max(self.args.nodes) * RANKS_PER_NODE
        cmd = [sys.executable, "-m", "taskd.run", "--nproc-per-node", str(world), "--quiet",
               *self.example_args(ref / "out", ref / "ckpt", 0.0)]
        ref.mkdir()
        with (ref / "console.log").open("wb") as out:
            code = subprocess.run(cmd, env=bench_env(CHAOS_TAG=self.tag), stdout=out, stderr=subprocess.STDOUT,
                                  cwd=ROOT, timeout=180).returncode
        if code != 0:
            raise RuntimeError(f"the fault-free reference run exited {code}: {(ref / 'console.log').read_text()}")
        self.reference = {r: np.load(ref / "out" / f"rank{r}.npy") for r in range(world)}

    # ------------------------------------------------------------------ jobs

    def launch(self) -> Job:
        index = len(self.jobs)
        nodes = self.rng.choice(self.args.nodes)
        job_id = f"chaos-{self.args.seed}-{index:03d}"
        work = self.work / job_id
        work.mkdir()
        env = bench_env(CHAOS_TAG=self.tag, CHAOS_JOB=job_id, TASKD_NODE_REJOIN_TIMEOUT=f"{REJOIN_TIMEOUT:g}")
        if self.token_file:
            env["TASKD_TOKEN_FILE"] = str(self.token_file)
        # each multi-node job its own rendezvous port: node 0 serves a store there, and two jobs on one port collide
        master = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())] if nodes > 1 else []
        now = time.monotonic()
        job = Job(index, job_id, nodes, work, [], now, now + self.args.job_timeout, master=master, env=env,
                  standby=nodes > 1 and self.rng.random() < self.args.standby_share)  # node kills: multi-node
        for node in range(nodes):
            job.nodeset.holders[node] = self.start_node(job, node, f"node{node}")
        if job.standby:
            self.start_standby(job)
        self.jobs.append(job)
        return job

    def start_node(self, job: Job, node: int | None, name: str) -> subprocess.Popen[bytes]:
        """One `taskd run` of the job in a session of its own (its process group is the node): node `node`, or a
        standby (None), its console in `name`.console."""
        where = ["--standby"] if node is None else ["--node-rank", str(node)]
        cmd = [sys.executable, "-m", "taskd.run", "--server", self.ctl.address, "--job-id", job.job_id, *job.master,
               "--nnodes", str(job.nodes), *where, "--nproc-per-node", str(RANKS_PER_NODE),
               "--max-restarts", str(self.args.max_restarts), "--heartbeat-timeout", "5",
               "--monitor-interval", "0.5", "--stop-grace", "2", "--log-dir", str(job.work / "logs"), "--quiet",
               *self.example_args(job.work / "out", job.work / "ckpt", self.args.step_sleep)]
        with (job.work / f"{name}.console").open("wb") as out:
            proc = subprocess.Popen(cmd, env=job.env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                    start_new_session=True)
        job.agents.append(proc)
        return proc

    def start_standby(self, job: Job) -> None:
        name = f"standby{sum(1 for p in job.work.glob('standby*.console'))}"
        proc = self.start_node(job, None, name)
        job.nodeset.standbys[proc.pid] = (proc, job.work / f"{name}.console")

    def running(self) -> list[Job]:
        return [j for j in self.jobs if j.running()]

    def poll_jobs(self, now: float) -> None:
        for job in self.running():
            for _ in job.nodeset.takeovers():  # a standby took a killed node over: the job gets a new spare
                if job.standby:
                    self.later(self.rng.uniform(*REPLACEMENT_DELAY), "start a standby", lambda j=job: self.respare(j))
            codes = [a.poll() for a in job.nodeset.current()]
            if all(c is not None for c in codes) and not job.nodeset.awaiting:
                job.codes, job.ended, job.orphan_check_at = codes, now, now
            elif now > job.deadline:
                job.outcome, job.detail = "stuck", f"not finished after {self.args.job_timeout:.0f}s; SIGKILLed"
                for a in job.agents:
                    if a.poll() is None:
                        a.kill()
                job.codes = [a.wait(10) for a in job.agents]
                job.ended, job.orphan_check_at = now, now
        for job in self.jobs:
            if job.orphan_check_at is None:
                continue
            left = tagged([f"CHAOS_JOB={job.job_id}"], [a.pid for a in job.agents])
            if not left:
                job.orphan_check_at = None
            elif now - job.orphan_check_at > ORPHAN_GRACE:
                self.orphans.extend({"job": job.job_id, "pid": pid, "cmdline": cmd} for pid, cmd in left)
                for pid, _ in left:
                    _kill(pid)
                job.orphan_check_at = None

    # ------------------------------------------------------------------ faults

    def next_kind(self) -> str:
        if self.plan:
            return self.plan[0]
        kinds = list(KINDS)
        return self.rng.choices(kinds, weights=[KINDS[k] for k in kinds])[0]

    def inject(self) -> bool:
        """Inject the plan's next fault; False (the plan waits) when nothing fits it right now."""
        kind = self.next_kind()
        done = getattr(self, f"_{kind}")()
        if done:
            if self.plan:
                self.plan.pop(0)
            self.faults[kind] += 1
        return bool(done)

    def live_ranks(self, job: Job) -> list[tuple[int, int]]:
        """(agent index, rank pid) of the job's running, unfrozen ranks under live, unfrozen agents.

        None once one of its nodes has ended: the example's ranks are independent, so one node can finish
        while another is still catching up after a restart, and a fault then fails the job by design (a
        real job's nodes finish together); that would only say again what docs/controller.md says."""
        holders = list(job.nodeset.holders.values())
        if job.nodeset.awaiting or len(holders) < job.nodes or any(a.poll() is not None for a in holders):
            return []  # one node ended, or one is being replaced (a node-loss round is open)
        out = []
        for i, agent in enumerate(holders):
            if agent.poll() is not None or is_stopped(agent.pid):
                continue
            out.extend((i, pid) for _, pid in sorted(rank_pids(agent.pid).items())
                       if pid not in self.stopped_ranks and not is_stopped(pid))
        return out

    def _pick_rank(self, need_heartbeat: bool) -> tuple[Job, int] | None:
        jobs = self.running()
        self.rng.shuffle(jobs)
        for job in jobs:
            ranks = [pid for _, pid in self.live_ranks(job) if not need_heartbeat or heartbeating(pid)]
            if ranks:
                return job, self.rng.choice(ranks)
        return None

    def _rank_kill(self) -> bool:
        picked = self._pick_rank(need_heartbeat=False)
        if picked:
            _kill(picked[1])
            picked[0].faults["rank_kill"] += 1
        return bool(picked)

    def _rank_stop(self) -> bool:
        picked = self._pick_rank(need_heartbeat=True)
        if picked:
            _signal(picked[1], signal.SIGSTOP)
            self.stopped_ranks.add(picked[1])
            picked[0].faults["rank_stop"] += 1
        return bool(picked)

    def _live_agents(self) -> list[tuple[Job, subprocess.Popen[bytes]]]:
        return [(j, a) for j in self.running() if not j.agent_killed for a in j.nodeset.holders.values()
                if a.poll() is None and not is_stopped(a.pid)]

    def _node_kill(self) -> bool:
        """SIGKILL a whole node of a job in mid-training (every node's ranks running), then have it replaced."""
        jobs = [j for j in self.running() if j.nodes > 1 and not j.agent_killed and self.live_ranks(j)]
        self.rng.shuffle(jobs)
        for job in jobs:
            nodes = [(n, a) for n, a in sorted(job.nodeset.holders.items()) if rank_pids(a.pid)]
            if len(nodes) < job.nodes:
                continue  # a node not up yet: its loss would be one the controller never knew of
            steps = [step(pid) for _, pid in self.live_ranks(job)]
            if len(steps) < job.nodes * RANKS_PER_NODE or any(s is None or s > self.args.steps * NODE_KILL_BEFORE
                                                              for s in steps):
                continue
            node, agent = self.rng.choice(nodes)
            ranks = list(rank_pids(agent.pid).values())
            _signal_group(agent.pid, signal.SIGKILL)  # the agent's session: itself and whatever it started
            for pid in ranks:
                _kill(pid)
            agent.wait(10)
            job.nodeset.killed.add(agent.pid)
            del job.nodeset.holders[node]
            via = "standby" if job.nodeset.standbys else "replacement"
            job.nodeset.losses.append(NodeLoss(node, agent.pid, via))
            job.faults["node_kill"] += 1
            self.faults[f"node_kill/{via}"] += 1
            if via == "replacement":
                job.nodeset.awaiting += 1
                self.later(self.rng.uniform(*self.args.replacement_delay), f"replace node {node} of {job.job_id}",
                           lambda j=job, n=node: self.replace(j, n))
            return True
        return False

    def replace(self, job: Job, node: int) -> None:
        """Start the replacement of a killed node; while the controller is down, try again 0.5 s later."""
        if self.closing:
            return
        if all(a.poll() is not None for a in job.nodeset.holders.values()):
            job.nodeset.awaiting -= 1  # every other node has ended: the job is over, nothing to replace
            return
        if self.ctl.mode != "up":
            self.later(0.5, f"replace node {node} of {job.job_id}", lambda: self.replace(job, node))
            return
        k = sum(1 for loss in job.nodeset.losses if loss.node_rank == node)
        proc = self.start_node(job, node, f"node{node}.r{k}")
        job.nodeset.holders[node] = proc
        job.nodeset.awaiting -= 1
        for loss in job.nodeset.losses:
            if loss.node_rank == node and loss.via == "replacement" and not loss.new_pid:
                loss.new_pid = proc.pid
                break

    def respare(self, job: Job) -> None:
        if job.running() and not job.nodeset.standbys and all(a.poll() is None for a in job.nodeset.holders.values()):
            self.start_standby(job)

    def _agent_kill(self) -> bool:
        # a standby would take the node over; an agent whose ranks all ended may have reported its finish already
        # (the job then succeeds, rightly: seed 1 found one killed in its job-end wait, judged a disagreement)
        agents = [(j, a) for j, a in self._live_agents() if not j.standby and rank_pids(a.pid)]
        if not agents:
            return False
        job, agent = self.rng.choice(agents)
        agent.kill()
        job.agent_killed = True
        job.faults["agent_kill"] += 1
        return True

    def _agent_stop(self) -> bool:
        agents = self._live_agents()
        if not agents:
            return False
        job, agent = self.rng.choice(agents)
        agent.send_signal(signal.SIGSTOP)
        job.faults["agent_stop"] += 1
        self.later(self.rng.uniform(1.0, 5.0), "SIGCONT agent", lambda: _signal(agent.pid, signal.SIGCONT))
        return True

    def _controller_kill(self) -> bool:
        if self.ctl.mode != "up":
            return False
        self.refresh_known()  # what must still be listed after the restart
        before = set(self.known)
        self.ctl.signal(signal.SIGKILL)
        assert self.ctl.proc is not None
        self.ctl.proc.wait(10)
        self.ctl.mode = "down"
        self.later(self.rng.uniform(0.3, 3.0), "restart the controller", lambda: self.restart_controller(before))
        return True

    def _round_controller_kill(self) -> bool:
        """SIGKILL a rank of a running job early in its steps (no round open), then the controller while the round
        that fault opens is in flight; restart it 1 s later. Early: the other node cannot finish during the round
        unless the round stalls (issue 31, F2: a restart during RECOVERING failed 3 jobs of 4 that way)."""
        if self.ctl.mode != "up":
            return False
        jobs = [j for j in self.running() if not j.agent_killed and self.live_ranks(j)]
        self.rng.shuffle(jobs)
        jobs.sort(key=lambda j: -j.nodes)  # a multi-node job first: that is where a stalled round fails a job
        for job in jobs:
            ranks = self.live_ranks(job)
            steps = [step(pid) for _, pid in ranks]
            if len(steps) < job.nodes * RANKS_PER_NODE or any(s is None or s > self.args.steps * NODE_KILL_BEFORE
                                                              for s in steps):
                continue
            rec = self.ctl.list_jobs(job_id=job.job_id)
            if not rec or rec[0].state != "RUNNING":
                continue  # a round already open: this fault would join it
            self.refresh_known()
            before = set(self.known)
            at = self.rng.choice(ROUND_KILL_AT)
            _kill(self.rng.choice(ranks)[1])
            until = time.monotonic() + 1.0
            while at != "fault" and self.ctl.stored_state(job.job_id) != at and time.monotonic() < until:
                time.sleep(0.002)
            self.ctl.signal(signal.SIGKILL)
            assert self.ctl.proc is not None
            self.ctl.proc.wait(10)
            self.ctl.mode = "down"
            number = max((r.round for r in rec[0].rounds), default=0) + 1
            job.interrupted[number] = self.ctl.stored_state(job.job_id)
            job.faults["round_controller_kill"] += 1
            self.later(1.0, "restart the controller", lambda b=before: self.restart_controller(b))
            return True
        return False

    def _controller_stop(self) -> bool:
        if self.ctl.mode != "up":
            return False
        self.ctl.signal(signal.SIGSTOP)
        self.ctl.mode = "stopped"

        def cont() -> None:
            if self.ctl.mode == "stopped":
                self.ctl.signal(signal.SIGCONT)
                self.ctl.mode = "up"
        self.later(self.rng.uniform(1.0, 6.0), "SIGCONT the controller", cont)
        return True

    def _hostile(self) -> bool:
        if self.ctl.mode != "up" or self.hostile_client is None:
            return False
        targets = self.targets()
        self.hostile_client.open()
        for _ in range(self.rng.randint(3, 8)):
            kind = self.rng.choice(self.hostile_client.kinds(bool(targets)))
            target = self.rng.choice(targets) if targets else None
            out = self.hostile_client.send(kind, target)
            self.hostile[(kind, out.verdict)] += 1
            if out.verdict != "refused":
                self.hostile_odd.append({"kind": kind, "verdict": out.verdict, "got": out.got,
                                         "job": target.job_id if target else ""})
        return True

    def targets(self) -> list[Target]:
        """Live jobs' nodes whose agent holds its signal stream right now (per ListJobs)."""
        running = {j.job_id for j in self.running()}
        jobs = self.ctl.list_jobs() or []
        return [Target(j.jobId, j.nodeCount, j.ranksPerNode or RANKS_PER_NODE, a.nodeRank, a.host, a.pid)
                for j in jobs if j.jobId in running and j.state == "RUNNING" for a in j.agents if a.subscribed]

    # ------------------------------------------------------------------ the controller

    def later(self, delay: float, what: str, action: Callable[[], None]) -> None:
        self.pending.append((time.monotonic() + delay, what, action))

    def run_pending(self, everything: bool = False) -> None:
        now = time.monotonic()
        due = [p for p in self.pending if everything or p[0] <= now]
        self.pending = [p for p in self.pending if p not in due]
        for _, _, action in sorted(due, key=lambda p: p[0]):
            action()
        # what an action scheduled (a replacement waiting for the controller to be up) runs on a later turn

    def restart_controller(self, must_list: set[str]) -> None:
        self.ctl.start()
        self.ctl.restarts += 1
        listed = self.ctl.list_jobs()
        names = {j.jobId for j in listed} if listed is not None else set()
        for job_id in sorted(must_list - names):
            self.lost.append({"job": job_id, "when": "after a controller restart", "answered": listed is not None})

    def refresh_known(self) -> None:
        if self.ctl.mode != "up":
            return
        jobs = self.ctl.list_jobs()
        if jobs is None:
            self.stalls += 1
            return
        self.known |= {j.jobId for j in jobs if j.jobId.startswith(f"chaos-{self.args.seed}-")}

    def watch_controller(self) -> None:
        if self.ctl.exited_unasked():
            self.ctl.start()
            self.ctl.restarts += 1

    # ------------------------------------------------------------------ the soak

    def window_open(self, t0: float) -> bool:
        if self.args.jobs is not None:
            return len(self.jobs) < self.args.jobs or bool(self.running())
        elapsed = time.monotonic() - t0
        # a kind of the first plan may wait for a job it fits (a young multi-node job): up to PLAN_GRACE more
        return elapsed < self.args.duration or (bool(self.plan) and elapsed < self.args.duration + PLAN_GRACE)

    def run(self) -> float:
        self.run_reference()
        self.ctl.start()
        self.hostile_client = Hostile(self.ctl.address, self.ctl.token, self.rng)
        t0 = time.monotonic()
        next_fault = t0 + self.rng.uniform(*self.args.interval)
        next_refresh = t0
        try:
            while self.window_open(t0):
                now = time.monotonic()
                self.watch_controller()
                self.run_pending()
                self.poll_jobs(now)
                if len(self.running()) < self.args.concurrency and (self.args.jobs is None
                                                                     or len(self.jobs) < self.args.jobs):
                    self.launch()
                if now >= next_refresh:
                    self.refresh_known()
                    next_refresh = now + 1.0
                if now >= next_fault and self.running():
                    next_fault = now + (self.rng.uniform(*self.args.interval) if self.inject() else 0.5)
                time.sleep(0.05)
            # drain: no more faults; thaw whatever is frozen, let the running jobs end (each has its deadline)
            self.run_pending(everything=True)
            while self.running() or any(j.orphan_check_at is not None for j in self.jobs):
                self.watch_controller()
                self.run_pending()  # a replacement that waited for the controller to be up
                self.poll_jobs(time.monotonic())
                self.refresh_known()
                time.sleep(0.2)
        finally:
            self.closing = True  # no replacement is started now
            self.run_pending(everything=True)
            for job in self.jobs:
                for a in job.agents:
                    if a.poll() is None:
                        a.kill()
                        a.wait(10)
        return time.monotonic() - t0

    # ------------------------------------------------------------------ judging

    def judge(self) -> dict[str, Any]:
        listed = self.ctl.list_jobs(timeout=30)
        records = {j.jobId: j for j in listed or []}
        if listed is not None:
            for job_id in sorted(self.known - set(records)):
                self.lost.append({"job": job_id, "when": "at the end", "answered": True})
        disagreements = []
        nodes = []
        for job in self.jobs:
            rec = records.get(job.job_id)
            if not job.outcome:
                job.outcome, job.detail = self.classify(job, rec)
            if job.nodeset.losses:
                nodes.append(node_checks(job.job_id, job.nodeset, rec, job.outcome == "correct"))
            want = "SUCCEEDED" if job.outcome == "correct" else "FAILED"
            awaiting = job.agent_killed and rec is not None and rec.state == "REJOINING"  # fails after the timeout
            if rec is not None and rec.state != want and job.outcome != "stuck" and not awaiting:
                disagreements.append({"job": job.job_id, "outcome": job.outcome, "controller": rec.state,
                                      "info": rec.info, "nodes": job.nodes,
                                      "nodes_registered": sorted(a.nodeRank for a in rec.agents)})
        return {"listed": listed is not None, "disagreements": disagreements,
                "node_loss": summarize(nodes, self.faults), "interrupted": self.interrupted_rounds(records)}

    def interrupted_rounds(self, records: dict[str, taskd_pb2.JobRecord]) -> list[dict[str, Any]]:
        """Each round a round_controller_kill landed in, as the controller recorded it: `redone` when a strategy
        was chosen twice in it (F2: the restored round was run again and its recover carried out twice)."""
        out = []
        for job in self.jobs:
            rec = records.get(job.job_id)
            rounds = {r.round: r for r in rec.rounds} if rec is not None else {}
            for n, stored in sorted(job.interrupted.items()):
                r = rounds.get(n)
                tried = list(r.strategiesTried) if r is not None else []
                out.append({"job": job.job_id, "round": n, "stored": stored, "recorded": r is not None, "tried": tried,
                            "outcome": r.outcome if r is not None else "", "redone": len(tried) != len(set(tried))})
        return out

    def classify(self, job: Job, rec: taskd_pb2.JobRecord | None) -> tuple[str, str]:
        if all(c == 0 for c in job.codes):
            bad = [r for r in range(job.nodes * RANKS_PER_NODE) if not _same(job.work / "out" / f"rank{r}.npy",
                                                                             self.reference[r])]
            return ("correct", "") if not bad else ("wrong result", f"rank(s) {bad} differ from the fault-free run")
        consoles = " ".join(p.read_text(errors="replace") for p in sorted(job.work.glob("*.console")))
        if job.agent_killed:
            return "failed as designed: agent SIGKILLed", f"exit codes {job.codes}"
        events = " ".join(e.detail for e in rec.events) if rec is not None else ""
        if "restart budget spent" in events or "restart budget of" in consoles:
            return "failed as designed: restart budget spent", f"exit codes {job.codes}"
        # a fault after a node finished, or a node finishing while a round is open (docs/controller.md): both end
        # the job at once, by design ("... had finished: ..." and "... finished while round N was open ...")
        stalled = {int(n) for n in re.findall(r"finished while round (\d+) was open", events + consoles)}
        if cut := sorted(stalled & job.interrupted.keys()):  # picked early: only a stalled round lets a node finish
            return "failed wrongly", f"round(s) {cut} interrupted by a controller kill stalled until a node " \
                                     f"finished; exit codes {job.codes}"
        if "no recovery without them" in events or "no recovery without them" in consoles:
            return "failed as designed: fault after a node finished", f"exit codes {job.codes}"
        tail = consoles[-1500:]
        return "failed wrongly", f"exit codes {job.codes}; controller: {rec.state if rec else 'not listed'} " \
                                 f"{rec.info if rec else ''}; console tail: {tail}"


SUMMARY = re.compile(r"job (?:succeeded|FAILED).*?: \d+ ranks, (\d+) fault\(s\), (\d+) recovery\(ies\)")


def agent_counts(job: Job) -> tuple[int, int]:
    """(faults, recoveries) the job's agents reported in their final summaries (an agent SIGKILLed prints none)."""
    faults = recoveries = 0
    for path in sorted(job.work.glob("*.console")):
        for m in SUMMARY.finditer(path.read_text(errors="replace")):
            faults, recoveries = faults + int(m.group(1)), recoveries + int(m.group(2))
    return faults, recoveries


def _same(path: Path, want: np.ndarray) -> bool:
    try:
        got = np.load(path)
    except (OSError, ValueError):
        return False
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    _signal(pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


OUTCOMES = ("correct", "failed as designed: restart budget spent", "failed as designed: agent SIGKILLed",
            "failed as designed: fault after a node finished", "failed wrongly", "wrong result", "stuck")


def report(soak: Soak, seconds: float, judged: dict[str, Any], shutdown_code: int | None,
           leftovers: list[tuple[int, str]]) -> dict[str, Any]:
    args = soak.args
    outcomes = Counter(j.outcome for j in soak.jobs)
    wrong = outcomes["failed wrongly"] + outcomes["wrong result"] + outcomes["stuck"]
    designed = sum(n for o, n in outcomes.items() if o.startswith("failed as designed"))
    hostile_verdicts = Counter()
    for (_, verdict), n in soak.hostile.items():
        hostile_verdicts[verdict] += n
    seen = [agent_counts(j) for j in soak.jobs]
    orphans = soak.orphans + [{"job": "(end)", "pid": pid, "cmdline": cmd} for pid, cmd in leftovers]
    print(f"Chaos soak: seed {args.seed}, {seconds:.0f} s, {len(soak.jobs)} job(s) of examples/train_resumable.py "
          f"({'/'.join(map(str, args.nodes))} node(s) x {RANKS_PER_NODE} ranks, {args.steps} steps), "
          f"token {'on' if args.token else 'off'}, controller on {soak.ctl.address}")
    print()
    print(table(["fault", "injected"], [[k, soak.faults[k]] for k in KINDS]
                + [["total", sum(soak.faults[k] for k in KINDS)]]))
    print()
    kinds = sorted({k for k, _ in soak.hostile})
    verdicts = ["refused", "refused-otherwise", "accepted", "unanswered"]
    print(table(["hostile call", *verdicts], [[k, *(soak.hostile[(k, v)] for v in verdicts)] for k in kinds]
                + [["total", *(hostile_verdicts[v] for v in verdicts)]]))
    print()
    print(table(["job outcome", "jobs"], [[o, outcomes[o]] for o in OUTCOMES]))
    print()
    print(f"faults injected: {sum(soak.faults[k] for k in KINDS)}")
    nl = judged["node_loss"]
    print(f"node kills: {nl['node_kills']} ({nl['by_replacement']} replaced by a new `taskd run --node-rank R`, "
          f"{nl['by_standby']} taken over by a standby); recorded as node losses: {nl['recorded']}; replaced by the "
          f"process the bench started: {nl['replaced_as_started']}; node-loss rounds: {nl['rounds']}, charged one "
          f"restart: {nl['charged_once']}")
    print(f"rounds charged more than one restart: {sum(len(c['rounds']) for c in nl['charged_more'])}")
    cut = judged["interrupted"]
    where = Counter(c["stored"] or "?" for c in cut)
    print(f"rounds interrupted by a controller kill: {len(cut)} (recorded: {sum(c['recorded'] for c in cut)}, "
          f"recovered: {sum(c['outcome'] == 'recovered' for c in cut)}; the job stored as "
          f"{', '.join(f'{s} {n}' for s, n in sorted(where.items())) or '-'})")
    print(f"interrupted rounds redone: {sum(c['redone'] for c in cut)}")
    print(f"node-loss records wrong: {len(nl['problems'])}")
    print(f"faults the agents saw: {sum(f for f, _ in seen)}, recoveries: {sum(r for _, r in seen)} "
          "(summed over the nodes' final summaries: a recovery of 2 nodes counts twice, a SIGKILLed agent prints "
          "none)")
    print(f"hostile calls: {sum(hostile_verdicts.values())} ({hostile_verdicts['refused']} refused as expected, "
          f"{hostile_verdicts['refused-otherwise']} refused otherwise, {hostile_verdicts['accepted']} accepted, "
          f"{hostile_verdicts['unanswered']} unanswered)")
    print(f"jobs: {len(soak.jobs)} ({outcomes['correct']} correct, {designed} failed as designed, {wrong} failed "
          f"wrongly)")
    print(f"orphans: {len(orphans)}")
    print(f"controller crashes: {len(soak.ctl.crashes)}")
    print(f"controller restarts: {soak.ctl.restarts} (after SIGKILL), unanswered status queries: {soak.stalls}, "
          f"graceful shutdown exit code: {shutdown_code}")
    tracebacks = soak.ctl.log.read_text(errors="replace").count("Traceback") if soak.ctl.log.exists() else 0
    print(f"controller tracebacks in its log: {tracebacks}")
    print(f"lost jobs: {len(soak.lost)}")
    print(f"run directories left in {tempfile.gettempdir()}: {len(soak.left_dirs)} "
          f"(jobs {sorted({d['job'] for d in soak.left_dirs})})")
    print(f"controller/agent state disagreements: {len(judged['disagreements'])}")
    for j in soak.jobs:
        if j.outcome in ("failed wrongly", "wrong result", "stuck"):
            print(f"  {j.job_id}: {j.outcome}: {j.detail[:2000]}")
    for item in soak.lost + orphans + judged["disagreements"] + soak.ctl.crashes + nl["charged_more"] + nl["problems"] \
            + [c for c in judged["interrupted"] if c["redone"]]:
        print(f"  {json.dumps(item)[:1500]}")
    for item in soak.hostile_odd:
        print(f"  hostile: {json.dumps(item)}")
    return {"seconds": seconds, "faults": {k: n for k, n in soak.faults.items() if k in KINDS},
            "fault_total": sum(soak.faults[k] for k in KINDS), "node_loss": nl,
            "agent_faults": sum(f for f, _ in seen), "agent_recoveries": sum(r for _, r in seen),
            "hostile": {f"{k}/{v}": n for (k, v), n in sorted(soak.hostile.items())},
            "hostile_verdicts": dict(hostile_verdicts), "hostile_odd": soak.hostile_odd,
            "outcomes": dict(outcomes), "correct": outcomes["correct"], "failed_as_designed": designed,
            "failed_wrongly": wrong, "orphans": orphans, "controller_crashes": soak.ctl.crashes,
            "controller_restarts": soak.ctl.restarts,
            "controller_tracebacks": tracebacks, "stalls": soak.stalls, "shutdown_code": shutdown_code,
            "lost_jobs": soak.lost, "left_dirs": soak.left_dirs, "disagreements": judged["disagreements"],
            "interrupted_rounds": judged["interrupted"],
            "jobs": [{"job": j.job_id, "nodes": j.nodes, "outcome": j.outcome, "codes": j.codes,
                      "faults": dict(j.faults), "agent_killed": j.agent_killed, "standby": j.standby,
                      "node_losses": [vars(x) for x in j.nodeset.losses], "detail": j.detail[:2000]}
                     for j in soak.jobs]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a ~30 s run for the tests (18 s of faults, then a drain)")
    p.add_argument("--seed", type=int, default=0, help="seeds the fault plan, its targets and the hostile calls")
    p.add_argument("--duration", type=float, default=None, help="seconds to inject faults and start jobs (300)")
    p.add_argument("--jobs", type=int, default=None, help="run this many jobs instead of a fixed duration")
    p.add_argument("--nodes", default="1,2", help="nodes per job: 1, 2 or 1,2 (each job draws one)")
    p.add_argument("--token", action=argparse.BooleanOptionalAction, default=True,
                   help="controller with --token-file, agents with TASKD_TOKEN_FILE (default on; --no-token: "
                        "forgeries are then legitimate calls and are not sent)")
    p.add_argument("--concurrency", type=int, default=2, help="jobs running at once")
    p.add_argument("--standby-share", type=float, default=None,
                   help="the share of multi-node jobs started with a `taskd run --standby` spare, which takes over "
                        "a killed node instead of a replacement (default 0.3; 0 with --quick)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--max-restarts", type=int, default=4, help="each job's restart budget")
    p.add_argument("--job-timeout", type=float, default=240.0, help="a job still running after this is stuck")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, state file)")
    args = p.parse_args(argv)
    try:
        args.nodes = sorted({int(n) for n in args.nodes.split(",") if n})
    except ValueError:
        p.error(f"--nodes must be 1, 2 or 1,2, got {args.nodes!r}")
    if not args.nodes or not set(args.nodes) <= {1, 2}:
        p.error(f"--nodes must be 1, 2 or 1,2, got {args.nodes}")
    if args.duration is not None and args.jobs is not None:
        p.error("give --duration or --jobs, not both")
    if args.quick:
        args.duration = args.duration if args.duration is not None or args.jobs is not None else 18.0
        args.steps, args.job_timeout = 150, 90.0
        args.interval = (0.8, 2.0)
        args.replacement_delay = (0.3, 1.0)
    else:
        args.interval = (1.0, 4.0)
        args.replacement_delay = REPLACEMENT_DELAY
    if args.duration is None and args.jobs is None:
        args.duration = 300.0
    if args.standby_share is None:
        args.standby_share = 0.0 if args.quick else 0.3
    if not 0.0 <= args.standby_share <= 1.0:
        p.error(f"--standby-share must be within 0..1, got {args.standby_share}")
    if (args.duration is not None and args.duration <= 0) or (args.jobs is not None and args.jobs < 1):
        p.error("--duration must be > 0 and --jobs >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = header("chaos", args)
    result.update({"seed": args.seed, "nodes": args.nodes, "token": args.token, "steps": args.steps,
                   "duration": args.duration, "jobs_asked": args.jobs, "ranks_per_node": RANKS_PER_NODE})
    work = Path(tempfile.mkdtemp(prefix="taskd-chaos-"))
    soak = Soak(args, work)
    # SIGTERM (a test's timeout, a CI job cancelled) unwinds through the finally clauses below
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        seconds = soak.run()
        judged = soak.judge()
    except BaseException:
        print(f"chaos soak aborted; work directory kept: {work}", file=sys.stderr)
        raise
    finally:  # also when the soak itself fails: nothing it started may outlive it
        shutdown_code = soak.ctl.shutdown()
        if soak.hostile_client is not None:
            soak.hostile_client.close()
        leftovers = _wait_gone(soak.tag)
        soak.sweep_run_dirs()
    result.update(report(soak, seconds, judged, shutdown_code, leftovers))
    result["work_dir"] = str(work) if args.keep else None
    write_result("chaos", result)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work directory kept: {work}")
    return 0


def _wait_gone(tag: str, timeout: float = ORPHAN_GRACE) -> list[tuple[int, str]]:
    """Processes still carrying the bench's marker after `timeout` s (killed, and returned as orphans)."""
    deadline = time.monotonic() + timeout
    while True:
        left = tagged([f"CHAOS_TAG={tag}"])
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid, _ in left:
        _kill(pid)
    return left


if __name__ == "__main__":
    sys.exit(main())
