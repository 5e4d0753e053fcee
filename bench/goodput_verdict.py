"""bench/goodput.py's arithmetic: each system's row from its runs, and verdicts that decline within the noise.

Why a module of its own: a goal of "loses <= 3 %" is a difference of a few seconds between two runs of a job that
takes minutes, and the same job's fault-free runs on this machine differ by as much (47.9-55.9 s for 200 steps
in one quiet run). So each system runs fault-free more than once (--baseline-runs), its fault-free time is their
mean, and its *spread* is their range (max - min). Two runs can agree by luck, so the spread a verdict uses is at
least the median spread of every system in the same run (the machine's noise, not the system's). A verdict
("met", "missed") is given only when the goal's margin exceeds that spread; otherwise it says "cannot tell" and
by how much the margin falls short of the spread. With one fault-free run per system there is no spread and no
verdict.

Goals (issue 36): taskd's best configuration keeps goodput >= 97 % and loses <= half the time of the best peer
measured in the same run; the run counts as the goal run only where torchrun's goodput is below 80 %.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

GOAL_GOODPUT = 0.97  # taskd's best configuration loses at most ~3 % of the fault-free time
GOAL_PEER_SHARE = 0.5  # ... and at most half of the best peer's lost time
QUALIFY_GOODPUT = 0.80  # the run is the goal run only where torchrun's goodput is below this


@dataclass(frozen=True)
class Judgement:
    """A goal's verdict: `margin` (s) is how far the measurement is on the goal's side (negative: the wrong side),
    `spread` (s) the noise it is judged against (None: not measured)."""
    verdict: str  # "met", "missed" or "cannot tell"
    margin: float
    spread: float | None

    def says(self) -> str:
        if self.verdict == "met":
            return f"met by {self.margin:.1f} s, beyond the {self.spread:.1f} s spread"
        if self.verdict == "missed":
            return f"missed by {-self.margin:.1f} s, beyond the {self.spread:.1f} s spread"
        if self.spread is None:
            return (f"cannot tell: margin {self.margin:+.1f} s, but one fault-free run per system measures no spread "
                    "(--baseline-runs 2 or more)")
        return (f"cannot tell: margin {self.margin:+.1f} s is within the {self.spread:.1f} s spread "
                f"(short by {self.spread - abs(self.margin):.1f} s)")


def judge(margin: float, spread: float | None) -> Judgement:
    """'met' when the margin exceeds the spread, 'missed' when it falls below minus the spread, else 'cannot tell'."""
    if spread is not None and margin > spread:
        return Judgement("met", margin, spread)
    if spread is not None and margin < -spread:
        return Judgement("missed", margin, spread)
    return Judgement("cannot tell", margin, spread)


def spread(values: list[float]) -> float | None:
    """The range of a system's fault-free times; None below two runs."""
    return max(values) - min(values) if len(values) >= 2 else None


def noise_floor(spreads: list[float | None]) -> float | None:
    """The median of the systems' measured spreads (None when none is measured)."""
    known = [s for s in spreads if s is not None]
    return statistics.median(known) if known else None


def effective_spread(own: float | None, floor: float | None) -> float | None:
    """The spread a system's verdicts use: its own, at least the run's noise floor."""
    known = [s for s in (own, floor) if s is not None]
    return max(known) if known else None


def row(label: str, peer: bool, refs: list[dict[str, Any]], run: dict[str, Any], run_timeout: float) -> dict[str, Any]:
    """A system's row from its fault-free runs `refs` and its run with faults. The fault-free time is the mean of
    the refs that finished (None if any did not: a failed reference is not noise). A run with faults stopped at
    --run-timeout gives bounds ("bound": with_faults_s and lost_s are lower bounds, goodput an upper one)."""
    times = [r.get("seconds") for r in refs]
    ok_refs = bool(refs) and all(r["ok"] for r in refs)
    free = statistics.fmean(times) if ok_refs else None  # type: ignore[arg-type]
    faulted = run.get("seconds") if run["ok"] else None
    bound = faulted is None and "did not end within --run-timeout" in run.get("error", "")
    if bound:
        faulted = run.get("stopped_at_s", run_timeout)
    fired = run["faults"]
    lost = None if free is None or faulted is None else faulted - free
    resumed = [f["resumed_s"] for f in fired if f.get("resumed_s") is not None]
    return {"system": label, "peer": peer, "fault_free_s": free, "fault_free_runs_s": times if ok_refs else None,
            "fault_free_spread_s": spread(times) if ok_refs else None, "with_faults_s": faulted,
            "bound": bound, "goodput": _ratio(free, faulted), "faults": len(fired),
            "kills": sum(1 for f in fired if f["kind"] == "kill"),
            "hangs": sum(1 for f in fired if f["kind"] == "hang"),
            "lost_s": lost, "lost_per_fault_s": _ratio(lost, len(fired)) if fired else None,
            "fault_to_resumed_s": {"n": len(resumed), "p50": statistics.median(resumed) if resumed else None,
                                   "max": max(resumed, default=None)},
            "fault_to_resumed_sum_s": sum(resumed) if resumed else None,
            "detected_sum_s": sum(f["detected_s"] for f in fired) if fired and all("detected_s" in f for f in fired)
            else None,  # measured where the agent logs each fault (taskd's systems)
            "unresumed": len(fired) - len(resumed), "redone_steps": None if "redone" not in run else
            sum(run["redone"].values()), "bit_identical": run.get("bit_identical"), "leftovers": run.get("leftovers"),
            "samples_never_processed": run.get("samples_never_processed"),  # counted where the job can (HSDP)
            "residue": run.get("residue"),  # named objects its launcher left on the node (the bench removed them)
            "ok": bool(free is not None and faulted is not None and not bound)}


def goal_goodput(best: dict[str, Any]) -> Judgement:
    """goodput >= 97 %: the margin is the time the job may still lose, F / 0.97 - W; the fault-free time F moves
    it by spread / 0.97."""
    u = best["spread_s"]
    return judge(best["fault_free_s"] / GOAL_GOODPUT - best["with_faults_s"], None if u is None else u / GOAL_GOODPUT)


def goal_peer(best: dict[str, Any], peer: dict[str, Any]) -> Judgement:
    """lost <= half the best peer's lost: margin 0.5 x L_peer - L_taskd; each loss moves by its own spread."""
    u = None if best["spread_s"] is None or peer["spread_s"] is None else \
        best["spread_s"] + GOAL_PEER_SHARE * peer["spread_s"]
    return judge(GOAL_PEER_SHARE * peer["lost_s"] - best["lost_s"], u)


def qualifies(torchrun: dict[str, Any]) -> Judgement:
    """torchrun's goodput < 80 %: margin W - F / 0.8 (positive: below 80 %); F moves it by spread / 0.8."""
    u = torchrun["spread_s"]
    return judge(torchrun["with_faults_s"] - torchrun["fault_free_s"] / QUALIFY_GOODPUT,
                 None if u is None else u / QUALIFY_GOODPUT)


def goodput_text(r: dict[str, Any]) -> str:
    """'97.9 % ± 1.1' (the spread over the time with faults, in points), or the bare figure without a spread."""
    if r["goodput"] is None:
        return "-"
    g = f"{'< ' if r['bound'] else ''}{100 * r['goodput']:.1f} %"
    return g if r.get("spread_s") is None else f"{g} ± {100 * r['spread_s'] / r['with_faults_s']:.1f}"


def breakdown(r: dict[str, Any], steps: int, ranks: int, detect_s: float, fastest: dict[str, Any] | None) -> str:
    """Where a system's lost seconds went: detection (measured where the agent logs each fault, else each hang x
    the timeout that finds it: configured, not measured), redone steps (steps redone per rank x the fault-free
    time per step), the rest of fault -> every rank past its next step (the pause), the time outside the
    recoveries, and the steady-state cost against the fastest fault-free system of the run (which its own
    goodput does not charge)."""
    step_s = r["fault_free_s"] / steps
    in_recovery = r["fault_to_resumed_sum_s"] or 0.0
    measured = r.get("detected_sum_s")
    detection = r["hangs"] * detect_s if measured is None else measured
    redone = (r["redone_steps"] or 0) / ranks * step_s
    pause = in_recovery - detection - redone
    how = (f"~{detection:.1f} s ({r['hangs']} hangs x {detect_s:g} s timeout: configured, not measured)"
           if measured is None else f"{detection:.1f} s (measured: each fault → the agent's fault record)")
    spread_s = "no spread measured" if r.get("spread_s") is None else f"± {r['spread_s']:.1f} s"
    text = (f"{r['system']}: lost {'> ' if r['bound'] else ''}{r['lost_s']:.1f} s ({spread_s}) over {r['faults']} "
            f"faults ({r['kills']} kills, {r['hangs']} hangs) = detection {how} + redone steps {redone:.1f} s "
            f"({r['redone_steps'] or 0} steps / {ranks} ranks x {step_s:.3f} s) + pause {pause:.1f} s "
            f"(the rest of fault → every rank past its next step: {in_recovery:.1f} s in all) + outside recoveries "
            f"{r['lost_s'] - in_recovery:.1f} s (slower steps after them, noise)")
    if r["unresumed"]:
        text += (f"; {r['unresumed']} of its faults never saw every rank past its next step (the job stalled there"
                 + (" until --run-timeout)" if r["bound"] else ")"))
    if fastest is not None and fastest is not r:
        text += (f"; steady-state cost {r['fault_free_s'] - fastest['fault_free_s']:+.1f} s against the fastest "
                 f"fault-free ({fastest['system']}, not in its goodput)")
    return text


def compare(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sets each row's spread_s, goodput_vs_fastest and lost_over_best_peer; returns the run's verdict: taskd's best,
    the best peer, the judgements of the three goal lines (None where a row is missing) and the noise floor."""
    floor = noise_floor([r["fault_free_spread_s"] for r in rows])
    for r in rows:
        r["spread_s"] = effective_spread(r["fault_free_spread_s"], floor)
    done = [r for r in rows if r["fault_free_s"]]
    fastest = min(done, key=lambda r: r["fault_free_s"], default=None)
    peers = [r for r in rows if r["peer"] and r["lost_s"] is not None]
    best_peer = min(peers, key=lambda r: r["lost_s"], default=None)  # a bounded peer by its lower bound
    for r in rows:
        r["goodput_vs_fastest"] = _ratio(fastest["fault_free_s"] if fastest else None, r["with_faults_s"])
        both_bounds = best_peer is not None and best_peer["bound"] and r["bound"] and r is not best_peer
        r["lost_over_best_peer"] = _ratio(r["lost_s"], best_peer["lost_s"]) \
            if best_peer and best_peer["lost_s"] > 0 and not both_bounds else None  # no ratio to a loss of <= 0
    ours = [r for r in rows if not r["peer"] and r["goodput"] is not None and not r["bound"]]
    best = max(ours, key=lambda r: r["goodput"], default=None)
    torchrun = next((r for r in rows if r["system"].startswith("torchrun") and r["lost_s"] is not None), None)
    return {"floor_s": floor, "fastest": fastest, "best": best, "best_peer": best_peer, "torchrun": torchrun,
            "goodput": goal_goodput(best) if best else None,
            "peer": goal_peer(best, best_peer) if best and best_peer and best_peer["lost_s"] else None,
            "qualifies": qualifies(torchrun) if torchrun else None}


def verdict_lines(v: dict[str, Any]) -> list[str]:
    """The goal lines, each with its verdict (or why none)."""
    best, peer, tr = v["best"], v["best_peer"], v["torchrun"]
    if best is None:
        return ["no taskd system completed its runs: no verdict"]
    g = v["goodput"]
    lines = [f"goal, taskd's best ({best['system']}) keeps goodput >= {GOAL_GOODPUT:.0%}: {goodput_text(best)} "
             f"(lost {best['lost_s']:.1f} s of {best['fault_free_s']:.1f} s; may lose "
             f"{best['fault_free_s'] / GOAL_GOODPUT - best['fault_free_s']:.1f} s): {g.says()}"]
    if peer is None or v["peer"] is None:
        lines.append("goal, taskd's best loses <= half the best peer's time: no peer completed its runs")
    else:
        j, bounded = v["peer"], peer["bound"]
        said = j.says() if not (bounded and j.verdict != "met") else \
            f"not established: the peer's loss is a lower bound ({j.says()})"
        lines.append(f"goal, taskd's best loses <= half the best peer's time: {best['lost_s']:.1f} s against "
                     f"{peer['system']}'s {'> ' if bounded else ''}{peer['lost_s']:.1f} s "
                     f"(half: {GOAL_PEER_SHARE * peer['lost_s']:.1f} s): {said}")
    if tr is None:
        lines.append("goal run? no torchrun row: the run cannot count as the goal run "
                     f"(torchrun < {QUALIFY_GOODPUT:.0%})")
    else:
        q = v["qualifies"]
        word = {"met": "yes, the run qualifies", "missed": "no, the run does not qualify"}.get(q.verdict, "")
        if tr["bound"] and q.verdict == "missed":
            word = "cannot tell: its run was stopped at --run-timeout"
        lines.append(f"goal run? torchrun's goodput must be below {QUALIFY_GOODPUT:.0%}: {goodput_text(tr)}: "
                     + (f"{word} ({q.says()})" if word else q.says()))
    return lines


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b
