"""From this machine to a cluster, on paper: each system's goodput at Meta's published fault rates.

Goodput is the time a job would take without faults over the time it takes with them. With faults at a mean
time to failure M (seconds, the whole job's), a fault costing L seconds of the job's progress and a steady-state
cost o (the share of every fault-free step spent being recoverable: a vote, a snapshot, a checkpoint, a quorum),
a job that makes U seconds of progress takes W = U / (1 - o) + (W / M) L, so

    goodput = (1 - o) (1 - L / M)        (L < M; 0 past it: the job never gets anywhere)

Per system, L = detection + pause + redone work, each from named inputs (INPUTS): measured on this machine (the
BENCHMARKS.md section is named) or assumed (the source or the reasoning is named). Disk checkpoints are taken at
Young's interval I = sqrt(2 C M) for a checkpoint that stalls training C seconds: their steady-state cost is C / I
and a fault redoes I / 2 on average. A quarter of faults (assumed) are hangs, found by taskd's heartbeat timeout,
by torchft's own timeout, and by torchrun only at the collectives' timeout.

    python bench/goodput_projection.py [--set NAME=VALUE ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Input:
    """One named input of the model: its value, unit, and where it comes from."""

    value: float
    unit: str
    source: str  # "measured: <BENCHMARKS.md section>, <what>" or "assumed: <source or reasoning>"


SCALES = {1024: 7.9 * 3600.0, 16384: 1.8 * 3600.0}
"""GPUs -> the job's mean time to failure, s: Meta's published figures (7.9 h at 1,024 GPUs, 1.8 h at 16,384)."""

INPUTS: dict[str, Input] = {
    # measured here
    "kill_detect_s": Input(0.076, "s", "measured: Side by side with the peers, 4 ranks: kill -> the agent's fault "
                                       "record, p50 (torchrun's agent acts on the same waitpid)"),
    "fanout_10k_s": Input(2.10, "s", "measured: Controller scale, stopTrain fan-out p99 to 10,000 agents of one "
                                      "job, the worst of 3 runs (0.91-2.10 s; the shared cores decide)"),
    "torchft_recovery_s": Input(6.34, "s", "measured: Side by side with the peers, torchft Manager.allreduce, 8 "
                                            "ranks: kill -> resumed p50 (5.53 s at 4 ranks), its 5 s timeout "
                                            "included"),
    "heartbeat_timeout_s": Input(5.0, "s", "measured: Goodput under a fault rate, taskd --heartbeat-timeout 5 found "
                                            "the hangs there (a setting: a hang costs it in full)"),
    # assumed: the cluster and the job
    "gpus_per_node": Input(8, "GPUs", "assumed: one agent per 8-GPU node (H100/H200 nodes)"),
    "step_s": Input(6.0, "s", "assumed: Llama 3 405B's 16 M-token batches at ~400 TFLOPS a GPU on 16,384 GPUs: "
                               "6 N D / (GPUs x FLOPS) ~ 6 s; the same step time at 1,024 GPUs (a smaller model)"),
    "state_gb_1024": Input(1.1, "GB", "assumed: a 70 B model, 16 bytes a parameter (bf16 weights, fp32 master and "
                                       "two Adam moments), sharded over 1,024 GPUs"),
    "state_gb_16384": Input(0.4, "GB", "assumed: Llama 3 405B, 16 bytes a parameter, sharded over 16,384 GPUs"),
    "net_gbps": Input(25.0, "GB/s", "assumed: the hand-over from a peer over one 400 Gb/s NIC a GPU at half its "
                                     "line rate"),
    "pcie_gbps": Input(25.0, "GB/s", "assumed: a snapshot's device -> host copy (pinned memory, PCIe 5 at half "
                                      "rate)"),
    "disk_write_gbps": Input(2.0, "GB/s", "assumed: a node's share of a parallel file system's write bandwidth "
                                           "(~1 TB/s for 512 nodes)"),
    "disk_read_gbps": Input(4.0, "GB/s", "assumed: a node's share of its read bandwidth (reads are faster)"),
    "restart_1024_s": Input(120.0, "s", "assumed: a whole-job restart at 1,024 GPUs (new processes, imports, store "
                                         "rendezvous, NCCL init); 8.95 s here for 4 ranks with torchrun (Side by "
                                         "side with the peers), which grows with the world"),
    "restart_16384_s": Input(300.0, "s", "assumed: the same at 16,384 GPUs"),
    "regroup_1024_s": Input(5.0, "s", "assumed: live recovery's new NCCL communicator at 1,024 GPUs (gloo re-forms "
                                       "in 0.22 s at 4 and 8 ranks here, Side by side with the peers: kill -> "
                                       "survivors rejoined; NCCL init of a large world takes seconds)"),
    "regroup_16384_s": Input(20.0, "s", "assumed: the same at 16,384 GPUs"),
    "hang_share": Input(0.25, "", "assumed: the share of faults that are hangs (bench/goodput.py's draw)"),
    "collective_timeout_s": Input(600.0, "s", "assumed: torch's default NCCL process-group timeout (10 min): how "
                                               "torchrun finds a hang"),
    "live_overhead": Input(0.005, "", "assumed: LiveGroup's per-step vote (a one-element allreduce, ~ms) on a 6 s "
                                       "step; on 2 CPU cores it is inside the noise (Steady-state cost of "
                                       "LiveGroup: -3.8 % to +13.5 % over runs)"),
    "torchft_overhead": Input(0.02, "", "assumed: torchft's quorum per step (a lighthouse round trip) on a 6 s step; "
                                         "Clockwork measured far more on short steps (930 min vs 405 min)"),
    "snapshot_every": Input(1, "steps", "assumed: taskd snapshots every step (as in Goodput under a fault rate)"),
    "controller_broadcasts": Input(3, "", "assumed: a round's broadcasts (stopTrain, globalFault, changeStrategy), "
                                          "each to every agent of the job"),
}


def young_interval(stall_s: float, mttf_s: float) -> float:
    """Young's checkpoint interval: the one that minimises stall plus expected redone work."""
    return math.sqrt(2.0 * stall_s * mttf_s)


def goodput(lost_per_fault_s: float, overhead: float, mttf_s: float) -> float:
    """(1 - overhead) (1 - L / M), 0 when a fault costs the MTTF or more."""
    return max(0.0, (1.0 - overhead) * (1.0 - lost_per_fault_s / mttf_s))


def fanout_s(agents: float, v: dict[str, float]) -> float:
    """One broadcast to `agents` agents: the 10,000-agent p99 scaled linearly (1,000 -> 4,000 -> 10,000 agents
    grew about linearly in Controller scale)."""
    return v["fanout_10k_s"] * agents / 10_000.0


@dataclass(frozen=True)
class Projection:
    """One system at one scale: the seconds a fault costs, split, its steady-state cost and goodput."""

    system: str
    gpus: int
    mttf_s: float
    detect_s: float
    pause_s: float
    redone_s: float
    overhead: float
    interval_s: float | None  # disk checkpoints: Young's interval

    @property
    def lost_s(self) -> float:
        return self.detect_s + self.pause_s + self.redone_s

    @property
    def goodput(self) -> float:
        return goodput(self.lost_s, self.overhead, self.mttf_s)


def _detect(v: dict[str, float], hang_s: float) -> float:
    """Expected detection: a kill's, or for the hang share the time a hang takes to be found."""
    return (1.0 - v["hang_share"]) * v["kill_detect_s"] + v["hang_share"] * hang_s


def project(gpus: int, mttf_s: float, v: dict[str, float]) -> list[Projection]:
    """Every system at `gpus` GPUs and a job MTTF of `mttf_s` seconds, from the inputs' values `v`."""
    state_gb, restart, regroup = v[f"state_gb_{gpus}"], v[f"restart_{gpus}_s"], v[f"regroup_{gpus}_s"]
    agents = gpus / v["gpus_per_node"]
    rounds = v["controller_broadcasts"] * fanout_s(agents, v)
    stall = state_gb * v["gpus_per_node"] / v["disk_write_gbps"]  # a node writes its GPUs' state
    load = state_gb * v["gpus_per_node"] / v["disk_read_gbps"]
    interval = young_interval(stall, mttf_s)
    snap_copy = state_gb / v["pcie_gbps"]
    k = v["snapshot_every"]
    hb = v["heartbeat_timeout_s"]
    rows = [
        Projection("taskd live", gpus, mttf_s, _detect(v, hb), rounds + regroup + state_gb / v["net_gbps"],
                   v["step_s"], v["live_overhead"], None),
        Projection("taskd snapshots", gpus, mttf_s, _detect(v, hb), rounds + restart + snap_copy,
                   (k + 1) / 2.0 * v["step_s"], snap_copy / (k * v["step_s"]), None),
        Projection("taskd job-rescheduling (disk)", gpus, mttf_s, _detect(v, hb), rounds + restart + load,
                   interval / 2.0, stall / interval, interval),
        Projection("torchrun + disk checkpoints", gpus, mttf_s, _detect(v, v["collective_timeout_s"]),
                   restart + load, interval / 2.0, stall / interval, interval),
        # its measured recovery holds its detection (its own timeout, kills and hangs alike); its survivors go on
        # without the failed replica group's step, so nothing is redone; its group re-forms as LiveGroup's does
        Projection("torchft (live)", gpus, mttf_s, 0.0,
                   v["torchft_recovery_s"] + regroup + state_gb / v["net_gbps"], 0.0, v["torchft_overhead"], None),
    ]
    return rows


def values(overrides: dict[str, float] | None = None) -> dict[str, float]:
    """The inputs' values, with `overrides` (ValueError naming an unknown input: nothing else changes)."""
    v = {name: i.value for name, i in INPUTS.items()}
    for name, value in (overrides or {}).items():
        if name not in v:
            raise ValueError(f"no input named {name!r}; inputs: {', '.join(sorted(v))}")
        v[name] = float(value)
    return v


def _parse_set(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        try:
            out[name] = float(text)
        except ValueError:
            raise SystemExit(f"--set {item!r}: give NAME=NUMBER") from None
        if not sep:
            raise SystemExit(f"--set {item!r}: give NAME=NUMBER")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override one input")
    p.add_argument("--json", action="store_true", help="the projections as JSON")
    args = p.parse_args()
    try:
        v = values(_parse_set(args.set))
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    rows = [r for gpus, mttf in SCALES.items() for r in project(gpus, mttf, v)]
    if args.json:
        out: list[dict[str, Any]] = [{**r.__dict__, "lost_s": r.lost_s, "goodput": r.goodput} for r in rows]
        print(json.dumps(out, indent=2))
        return 0
    print("| GPUs | MTTF h | system | detection s | pause s | redone s | lost per fault s | steady-state cost % "
          "| disk interval s | goodput % |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        interval = f"{r.interval_s:.0f}" if r.interval_s is not None else "-"
        print(f"| {r.gpus:,} | {r.mttf_s / 3600:.1f} | {r.system} | {r.detect_s:.2f} | {r.pause_s:.2f} | "
              f"{r.redone_s:.1f} | {r.lost_s:.1f} | {100 * r.overhead:.2f} | {interval} | {100 * r.goodput:.2f} |")
    print("\ninputs (measured here, or assumed):")
    for name, i in INPUTS.items():
        print(f"- {name} = {v[name]:g} {i.unit}: {i.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
