"""Node loss in bench/chaos.py (issue 17): a whole node SIGKILLed, and what takes its place.

A node is one `taskd run --node-rank R` (its own session, so its process group is the node: agent and
ranks). `node_kill` SIGKILLs that group and every rank under it, then either starts a replacement
`taskd run --node-rank R` a seeded delay later (never while the controller is down: it would find no
controller to register with, and a Kubernetes pod or a Slurm step would be restarted anyway), or, for a
job started with a standby, lets the standby take the node over by itself and starts a new standby.

What the soak then checks of each job is the same as for any fault (exit 0 everywhere, bit-identical
results, nothing left behind, not lost), plus the controller's record of the loss (`node_checks`): each
node kill is a node loss of some round, replaced by the process the bench started (or the standby),
and no round is charged more than one restart.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskd.proto import taskd_pb2

RESTARTING = ("recover", "job-rescheduling")
TAKES_OVER = re.compile(r"this standby takes over node (\d+)")


@dataclass
class NodeLoss:
    """One node kill: which process was killed and which took its node (once known)."""

    node_rank: int
    old_pid: int
    via: str  # "replacement" | "standby"
    new_pid: int = 0


@dataclass
class Nodes:
    """A job's `taskd run` processes by role: who holds each node now, the spares waiting, who was killed."""

    holders: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    standbys: dict[int, tuple[subprocess.Popen[bytes], Path]] = field(default_factory=dict)  # pid -> (proc, log)
    killed: set[int] = field(default_factory=set)  # pids the bench SIGKILLed with their node (not the job's end)
    awaiting: int = 0  # replacements the bench will start (their delay not over yet)
    losses: list[NodeLoss] = field(default_factory=list)

    def current(self) -> list[subprocess.Popen[bytes]]:
        """The processes whose exit code is the job's: every holder and spare not killed by the bench."""
        return [*self.holders.values(), *(p for p, _ in self.standbys.values())]

    def takeovers(self) -> list[tuple[int, subprocess.Popen[bytes]]]:
        """Standbys that took a node over since the last call (their log says so): they hold it now."""
        out = []
        for pid, (proc, log) in list(self.standbys.items()):
            try:
                m = TAKES_OVER.search(log.read_text(errors="replace"))
            except OSError:
                continue
            if m:
                n = int(m.group(1))
                del self.standbys[pid]
                self.holders[n] = proc
                for loss in self.losses:
                    if loss.node_rank == n and loss.via == "standby" and not loss.new_pid:
                        loss.new_pid = pid
                out.append((n, proc))
        return out


def charges(rec: taskd_pb2.JobRecord) -> dict[int, int]:
    """Restarts charged per round of this run of the job (since its last reset), from the `strategy_chosen`
    events' running `restarts` count: each round's highest count minus the highest before it."""
    reset = max((e.time for e in rec.events if e.kind == "job_reset"), default=0.0)
    best: dict[int, int] = {}
    for e in rec.events:
        if e.time < reset or e.kind != "strategy_chosen":
            continue
        try:
            restarts = json.loads(e.detail or "{}").get("restarts")
        except ValueError:
            continue
        if isinstance(restarts, int):
            best[e.round] = max(best.get(e.round, 0), restarts)
    out, before = {}, 0
    for rnd in sorted(best):
        out[rnd] = best[rnd] - before
        before = max(before, best[rnd])
    return out


def node_checks(job_id: str, nodes: Nodes, rec: taskd_pb2.JobRecord | None, correct: bool) -> dict[str, Any]:
    """What the controller recorded of the job's node kills, against what the bench did."""
    out: dict[str, Any] = {"job": job_id, "kills": len(nodes.losses), "recorded": 0, "replaced_as_started": 0,
                           "rounds": 0, "charged_once": 0, "charged_more": [], "problems": []}
    if rec is None or not nodes.losses:
        return out
    reset = max((e.time for e in rec.events if e.kind == "job_reset"), default=0.0)
    recorded = [(r, x) for r in rec.rounds if r.startedAt >= reset for x in r.nodeLosses]
    out["recorded"] = len(recorded)
    by_old = {x.oldPid: (r, x) for r, x in recorded}
    charge = charges(rec)
    loss_rounds = {r.round for r, _ in recorded}
    out["rounds"] = len(loss_rounds)
    out["charged_once"] = sum(1 for n in loss_rounds if charge.get(n) == 1)
    out["charged_more"] = sorted(n for n, c in charge.items() if c > 1)
    for loss in nodes.losses:
        hit = by_old.get(loss.old_pid)
        if hit is None:
            if correct:  # a job that ended well must have been through a round for it
                out["problems"].append(f"node {loss.node_rank} (pid {loss.old_pid}) killed, no node loss recorded")
            continue
        _, x = hit
        if x.nodeRank != loss.node_rank:
            out["problems"].append(f"pid {loss.old_pid} recorded as node {x.nodeRank}, killed as {loss.node_rank}")
        if loss.new_pid and x.newPid == loss.new_pid:
            out["replaced_as_started"] += 1
        elif correct:
            out["problems"].append(f"node {loss.node_rank} recorded as replaced by pid {x.newPid}, the bench's "
                                   f"{loss.via} was pid {loss.new_pid or '(none)'}")
    return out


def summarize(checks: list[dict[str, Any]], faults: Counter[str]) -> dict[str, Any]:
    return {"node_kills": sum(c["kills"] for c in checks), "recorded": sum(c["recorded"] for c in checks),
            "replaced_as_started": sum(c["replaced_as_started"] for c in checks),
            "by_replacement": faults["node_kill/replacement"], "by_standby": faults["node_kill/standby"],
            "rounds": sum(c["rounds"] for c in checks), "charged_once": sum(c["charged_once"] for c in checks),
            "charged_more": [{"job": c["job"], "rounds": c["charged_more"]} for c in checks if c["charged_more"]],
            "problems": [{"job": c["job"], "problem": p} for c in checks for p in c["problems"]]}
