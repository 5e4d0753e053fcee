"""bench/goodput.py's plan: the goal run's settings (--goal) and a duration estimate printed before a run starts.

Why: the goal run is one quiet run of ~25 minutes that must be sized before it starts (a torchrun goodput below
80 %, several faults per system, the fault-free runs repeated) without trying it first. The estimate is a model,
not a measurement: a fault-free job of S steps takes STARTUP_S + S x step_s, and a fault costs each system the
seconds in PER_FAULT (the quiet run of 2026-12-04 22:16 UTC, BENCHMARKS.md: fault → every rank past its next
step 0.50 s for taskd live, 2.74 s for torchft, 6.2 s for a whole-job restart from memory, ~7 s for torchrun's)
plus its redone steps and, for a hang, the timeout that finds it. Faults arrive every --mtbf s of wall time, so a
job that loses c s a fault takes F / (1 - c / mtbf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from taskd.agent.watches.culprit import STOP_LOOK, STOPPED_AFTER

STARTUP_S = 4.0  # launch to the first step, 4 ranks, quiet (from 200 steps taking 48-56 s at ~0.25 s a step)
STEP_S = 0.22  # one step at 4 ranks, 9 M parameters, quiet (the goal run of 2026-12-05 03:46: 0.22-0.23 s)

# The goal run (issue 36), ~26 min by the estimate: 4 ranks, 480 steps (~2 min fault-free); a fault every 40 s on
# average (gaps 20-60 s), a quarter of them hangs (SIGSTOP); taskd's --heartbeat-timeout and torchft's timeout
# both 5 s (taskd's agent finds a *stopped* rank sooner, by its process state: once its looks every STOP_LOOK s
# have seen it stopped for STOPPED_AFTER s), torchrun finds a hang by the 30 s collective timeout; disk
# checkpoints every 10 steps (~Young's interval here); two fault-free runs per system, one before and one after
# its run with faults. Seed 6 by a rule:
# the first seed whose schedule gives every system both a hang and a kill before a fault-free job would end
# (STARTUP_S + 480 x STEP_S) and that the estimate expects to take torchrun below 80 %. (Seed 3, the first by
# torchrun alone, put its hang at 111 s, after three of the four jobs of the run of 2026-12-05 03:46 had ended.)
# Its faults: hang rank 2 at 39 s, kill rank 2 at 72 s, kill rank 0 at 119 s, hang rank 3 at 153 s, ...
GOAL: dict[str, Any] = {
    "ranks": 4, "steps": 480, "mtbf": 40.0, "hang_share": 0.25, "seed": 6, "heartbeat_timeout": 5.0,
    "torchft_timeout": 5, "pg_timeout": 30.0, "ckpt_every": 10, "snapshot_every": 1, "baseline_runs": 2,
    "run_timeout": 270.0, "arrivals": "uniform", "systems": "taskd live,taskd +,torchrun,torchft",
}


@dataclass(frozen=True)
class FaultCost:
    """What one fault costs a system in the estimate: the recovery (s), steps redone per fault (as a share of the
    checkpoint interval: 0.5 redoes half of it on average), and the setting that times a hang's detection."""
    recover_s: float
    redone_of: str  # "ckpt_every", "snapshot_every" or "" (nothing redone)
    detect: str  # the args attribute whose seconds find a hang
    hang_stalls: bool = False  # a hung (stopped) rank is never replaced: the job waits until --run-timeout


PER_FAULT: dict[str, FaultCost] = {  # by label prefix, the first that matches
    "taskd live": FaultCost(0.5, "", "heartbeat_timeout"),
    "taskd +": FaultCost(6.2, "snapshot_every", "heartbeat_timeout"),
    "taskd job-rescheduling": FaultCost(6.2, "ckpt_every", "heartbeat_timeout"),
    "torchrun": FaultCost(7.0, "ckpt_every", "pg_timeout"),
    # bench/run_torchft.py's quorum needs every replica and nothing replaces a stopped one (seen 2026-12-05: a
    # SIGSTOPped replica held the job until --run-timeout)
    "torchft": FaultCost(2.7, "", "torchft_timeout", hang_stalls=True),
    # a guess, not measured quiet: torch elastic's restart of every rank as torchrun's, from the agent's memory;
    # 33 s was seen at load 12 (2026-12-05, bench/goodput_dlrover.py's first runs), where taskd's took 17-65 s
    "DLRover": FaultCost(7.0, "snapshot_every", "pg_timeout"),
}
MONITOR_S = 0.5  # a hang found by taskd's agent waits on average half its 1 s sweep beyond the timeout


def fault_cost(label: str, kind: str, settings: dict[str, Any], step_s: float = STEP_S) -> float | None:
    """The estimate's seconds one fault of `kind` ("kill" or "hang") costs `label`, None if the label is unknown."""
    cost = next((c for prefix, c in PER_FAULT.items() if label.startswith(prefix)), None)
    if cost is None:
        return None
    if kind == "hang" and cost.hang_stalls:
        return math.inf
    redone = (settings[cost.redone_of] - 1) / 2 * step_s if cost.redone_of else 0.0
    detect = float(settings[cost.detect])
    if cost.detect == "heartbeat_timeout":  # a SIGSTOPped rank is seen by its state, looked at every STOP_LOOK s
        detect = min(detect + MONITOR_S, STOPPED_AFTER + STOP_LOOK / 2)
    return cost.recover_s + redone + (detect if kind == "hang" else 0.0)


def estimate(labels: list[str], settings: dict[str, Any], schedule: list[tuple[float, str]],
             step_s: float = STEP_S) -> dict[str, Any]:
    """Per system, under the run's own seeded `schedule` of (seconds after launch, kind): fault-free seconds, seconds
    with faults (each fault due before the job would end adds its cost; at most --run-timeout), the faults it
    meets and its goodput; and the whole run's seconds (--baseline-runs fault-free runs and one with faults per
    system)."""
    free = STARTUP_S + settings["steps"] * step_s
    rows = {}
    for label in labels:
        faulted, met = free, 0
        for at, kind in schedule:
            c = fault_cost(label, kind, settings, step_s)
            if at >= faulted or faulted >= settings["run_timeout"] or c is None:
                break
            faulted, met = faulted + c, met + 1
        faulted = min(faulted, settings["run_timeout"])
        rows[label] = {"fault_free_s": free, "with_faults_s": faulted, "faults": met, "goodput": free / faulted,
                       "known": fault_cost(label, "kill", settings, step_s) is not None,
                       "stalls": faulted == settings["run_timeout"]}
    total = sum(settings["baseline_runs"] * r["fault_free_s"] + r["with_faults_s"] for r in rows.values())
    return {"systems": rows, "total_s": total, "step_s": step_s}


def estimate_lines(est: dict[str, Any], baseline_runs: int, job: str = "train_ddp.py") -> list[str]:
    """The estimate as printed; `job` names the job whose step time it assumes (the DDP job's by default)."""
    size = "4 ranks, 9 M parameters, quiet" if job == "train_ddp.py" else f"{job} at 4 ranks, loaded"
    lines = [f"estimate (a model, not a measurement: {est['step_s']} s a step as {size}; "
             f"{STARTUP_S:g} s to start; the per-fault costs of the quiet run of 2026-12-04): "
             f"{est['total_s'] / 60:.0f} min in all"]
    for label, r in est["systems"].items():
        costs = "" if r["known"] else " (its per-fault cost is unknown: counted as none)"
        lines.append(f"  {label}: {baseline_runs} x {r['fault_free_s']:.0f} s fault-free + {r['with_faults_s']:.0f} s "
                     f"with {r['faults']} faults: goodput ~{100 * r['goodput']:.0f} %{costs}"
                     + (" (stopped at --run-timeout: a hang stalls it)" if r["stalls"] else ""))
    return lines
