"""Controller scale: N simulated agents of one job on one `taskd server` process.

For each N: start `python -m taskd.controller` (SQLite state file, stop timeout 1 h so a round stays
open), start P processes of bench/sim_agents.py (grpc.aio clients, one connection per agent unless
--per-channel says otherwise), then measure
- server RSS per agent: (RSS with all N subscribed - RSS before any agent) / N;
- stopTrain fan-out: a ReportProcessFault for a new rank (the first opens the round, the next ones
  merge into it and each re-broadcasts stopTrain) to every agent having it: p50/p99/max over agents;
- ReportProcessFault calls/s: all agents report the round's fault again (idempotent, answered
  "already in round") with bounded concurrency per process;
- the reconnect storm: SIGTERM the controller, start a new one on the same port and state file; every
  agent reconnects with jittered backoff. The controller, which restored the job mid-round (RESUMING),
  records `round_resumed` when every agent is subscribed again: that minus the new process's spawn
  is the time to resubscribe all. Refused attempts are counted by the agents.

    python bench/controller_scale.py [--quick] [--sizes 100,1000,4000,10000] [--procs 4] [--per-channel 1]

`--scenario many-jobs-fault`: N one-agent jobs on one server (`--procs` client processes, one
connection per agent); once every agent is subscribed, every job reports a fault at the same moment
and every agent answers its round as taskd's agent does (bench/sim_agents.py --one-job-each). Per
job: its fault report sent -> its changeStrategy received, p50/p99/max; the first report sent -> the
last changeStrategy received; the controller's CPU seconds and RSS over that phase.

    python bench/controller_scale.py --scenario many-jobs-fault --sizes 1000,10000 --procs 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import psutil
from common import (
    BENCH_DIR,
    ROOT,
    bench_env,
    free_port,
    header,
    job_events,
    start_controller,
    stats,
    stop_process,
    table,
    wait_for,
    write_result,
)

from taskd.proto import recover_pb2, recover_pb2_grpc

SERVER_FLAGS = ["--stop-timeout", "3600", "--strategy-timeout", "3600", "--recover-timeout", "3600",
                "--settle-window", "0"]


class Sims:
    """The P simulated-agent processes, driven through their stdin/stdout."""

    def __init__(self, address: str, job: str, n: int, procs: int, per_channel: int, work: Path,
                 one_job_each: bool = False) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        per = -(-n // procs)
        for first in range(0, n, per):
            count = min(per, n - first)
            cmd = [sys.executable, str(BENCH_DIR / "sim_agents.py"), "--address", address, "--job", job,
                   "--first", str(first), "--count", str(count), "--nodes", str(n), "--per-channel", str(per_channel)]
            if one_job_each:
                cmd.append("--one-job-each")
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=(work / f"sim-{first}.log").open("w"), text=True,
                                               env=bench_env(), cwd=ROOT))

    def ask(self, cmd: dict[str, Any], timeout: float = 300.0) -> list[dict[str, Any]]:
        line = json.dumps({**cmd, "timeout": timeout}) + "\n"
        for p in self.procs:
            p.stdin.write(line)
            p.stdin.flush()
        answers = []
        for p in self.procs:
            out = p.stdout.readline()
            if not out:
                raise RuntimeError(f"simulated agents (pid {p.pid}) exited with {p.poll()}")
            answers.append(json.loads(out))
        return answers

    def close(self) -> None:
        for p in self.procs:
            try:
                p.stdin.write('{"cmd": "quit"}\n')
                p.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def report_fault(address: str, job: str, rank: int) -> float:
    with grpc.insecure_channel(address) as ch:
        stub = recover_pb2_grpc.RecoverStub(ch)
        req = recover_pb2.ProcessFaultRequest(jobId=job, nodeRank=rank, detail="bench probe",
                                              faultRanks=[recover_pb2.FaultRank(rankId=str(rank), faultType="1")])
        grpc.channel_ready_future(ch).result(timeout=30)
        t0 = time.time()
        st = stub.ReportProcessFault(req, timeout=60)
    if st.code != 0:
        raise RuntimeError(f"ReportProcessFault answered {st.code}: {st.info}")
    return t0


def one_size(n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    port = free_port()
    address = f"127.0.0.1:{port}"
    job = f"bench-scale-{n}"
    state = str(work / f"state-{n}.sqlite3")
    res: dict[str, Any] = {"n": n, "procs": args.procs, "per_channel": args.per_channel}
    server = start_controller(port, state=state, log=work / f"controller-{n}.log", extra=SERVER_FLAGS)
    sims = None
    try:
        proc = psutil.Process(server.pid)
        rss0 = proc.memory_info().rss
        t0 = time.time()
        sims = Sims(address, job, n, args.procs, args.per_channel, work)
        ready = sims.ask({"cmd": "ready"}, timeout=args.timeout)
        res["subscribe_all_s"] = time.time() - t0
        res["subscribed"] = sum(a["ready"] for a in ready)
        res["refused_at_start"] = dict(sum((Counter(a["refused"]) for a in ready), Counter()))
        if res["subscribed"] < n:
            res["error"] = f"only {res['subscribed']} of {n} agents subscribed within {args.timeout}s"
            return res
        time.sleep(1.0)
        rss1 = proc.memory_info().rss
        res["server_rss_mib"] = rss1 / 2**20
        res["rss_per_agent_kib"] = (rss1 - rss0) / n / 1024
        # fan-out: each probe reports a new rank; the first opens the round, the others merge and re-broadcast
        lat: list[float] = []
        per_probe = []
        for k in range(1, args.probes + 1):
            time.sleep(0.5)
            t_report = report_fault(address, job, (k * 7919) % n)
            got = sims.ask({"cmd": "wait", "count": k}, timeout=args.timeout)
            times = [t - t_report for a in got for t in a["times"]]
            per_probe.append(stats(times, 1e3))
            lat.extend(times)
            if len(times) < n:
                res["error"] = f"probe {k}: only {len(times)} of {n} agents got stopTrain"
                break
        res["fanout_ms"] = stats(lat, 1e3)
        res["fanout_per_probe_ms"] = per_probe
        # ReportProcessFault throughput: the round's first fault reported again by every agent
        calls = max(args.min_calls, n)
        answers = sims.ask({"cmd": "report", "calls": -(-calls // len(sims.procs)), "concurrency": args.concurrency,
                            "distinct": False}, timeout=args.timeout)
        codes = sum((Counter(a["codes"]) for a in answers), Counter())
        span = max(a["t1"] for a in answers) - min(a["t0"] for a in answers)
        res["report_calls"] = sum(codes.values())
        res["report_codes"] = dict(codes)
        res["report_calls_per_s"] = res["report_calls"] / span if span > 0 else None
        if not args.no_storm:
            res["storm"] = storm(server, port, state, n, sims, args, work)
            server = res["storm"].pop("_server")
            try:
                resumed = [e for e in job_events(address, job, timeout=120) if e["kind"] == "round_resumed"]
            except Exception as exc:  # noqa: BLE001 - recorded, not fatal
                resumed, res["storm"]["history_error"] = [], str(exc)
            if resumed:
                res["storm"]["all_resubscribed_s"] = resumed[-1]["time"] - res["storm"]["restart_spawned_at"]
    finally:
        if sims is not None:
            sims.close()
        stop_process(server, grace=30)
    return res


def many_jobs_fault(n: int, args: argparse.Namespace, work: Path, server_kind: str | None = None) -> dict[str, Any]:
    """N one-agent jobs, every one faulting at once: how long each waits for its changeStrategy."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    res: dict[str, Any] = {"n": n, "procs": args.procs, "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    extra = [*SERVER_FLAGS, "--max-jobs", str(max(n, 10000)), *args.server_args.split()]
    if (server_kind or args.server) == "null":  # the floor: the same wire and clients, no controller behind them
        res["server"] = "null"
        server = _null_controller(port, work / f"controller-jobs-{n}.log")
    else:
        server = start_controller(port, state=str(work / f"jobs-{n}.sqlite3"), log=work / f"controller-jobs-{n}.log",
                                  extra=extra)
    sims = None
    try:
        proc = psutil.Process(server.pid)
        t0 = time.time()
        sims = Sims(address, "bench-jobs", n, args.procs, 1, work, one_job_each=True)
        ready = sims.ask({"cmd": "ready"}, timeout=args.timeout)
        res["subscribe_all_s"] = time.time() - t0
        res["subscribed"] = sum(a["ready"] for a in ready)
        if res["subscribed"] < n:
            res["error"] = f"only {res['subscribed']} of {n} agents subscribed within {args.timeout}s"
            return res
        time.sleep(1.0)
        spy = _py_spy(server.pid, args.py_spy)
        clients = [psutil.Process(p.pid) for p in sims.procs]
        cpu0, rss0 = sum(proc.cpu_times()[:2]), proc.memory_info().rss
        client_cpu0 = sum(sum(c.cpu_times()[:2]) for c in clients)
        faulted = sims.ask({"cmd": "fault"}, timeout=args.timeout)
        res["fault_codes"] = dict(sum((Counter(a["codes"]) for a in faulted), Counter()))
        got = sims.ask({"cmd": "recovered"}, timeout=args.timeout)
        cpu1, rss1 = sum(proc.cpu_times()[:2]), proc.memory_info().rss
        client_cpu1 = sum(sum(c.cpu_times()[:2]) for c in clients)
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
            spy.wait(60)
        lat = [t for a in got for t in a["latency"]]
        res["changed"] = len(lat)
        res["fault_to_change_ms"] = stats(lat, 1e3)
        first = min(t for a in got for t in a["fault_sent"])
        res["first_fault_to_last_change_s"] = max(t for a in got for t in a["changed_at"]) - first
        res["strategies"] = dict(sum((Counter(a["strategies"]) for a in got), Counter()))
        res["status_codes"] = dict(sum((Counter(a["status_codes"]) for a in got), Counter()))
        res["refused"] = dict(sum((Counter(a["refused"]) for a in got), Counter()))
        res["controller_cpu_s"] = cpu1 - cpu0
        res["clients_cpu_s"] = client_cpu1 - client_cpu0
        res["controller_rss_mib"] = rss1 / 2**20
        res["controller_rss_growth_mib"] = (rss1 - rss0) / 2**20
        if len(lat) < n or res["status_codes"] != {"0": n}:
            res["error"] = f"{len(lat)} of {n} jobs got changeStrategy; recover status answers {res['status_codes']}"
    finally:
        if sims is not None:
            sims.close()
        stop_process(server, grace=30)
        if "error" in res:  # the controller's log (WARNING and above) says why, e.g. connections it closed
            kept = write_result(f"controller_scale_jobs_{n}_log", {"log": (work / f"controller-jobs-{n}.log")
                                                                  .read_text(errors="replace")[-200_000:]})
            res["controller_log"] = str(kept)
    return res


def limit(n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """taskd's many-jobs-fault p99 as a ratio to the null server's, pair by pair in one run, then the fan-out
    to n agents of one job: the ratio is what the shared machine's load moves least (both sides share it)."""
    res: dict[str, Any] = {"n": n, "pairs": []}
    for rep in range(args.reps):
        order = ("taskd", "null") if rep % 2 == 0 else ("null", "taskd")  # alternate: neither always runs first
        pair = {kind: many_jobs_fault(n, args, work, kind) for kind in order}
        p99 = {kind: pair[kind].get("fault_to_change_ms", {}).get("p99") for kind in order}
        pair["ratio_p99"] = p99["taskd"] / p99["null"] if p99["taskd"] and p99["null"] else None
        res["pairs"].append(pair)
        print(f"N={n} pair {rep + 1}: taskd p99 {p99['taskd']} ms, null p99 {p99['null']} ms", file=sys.stderr)
    ratios = [p["ratio_p99"] for p in res["pairs"] if p["ratio_p99"] is not None]
    cpu = [p["taskd"]["controller_cpu_s"] / p["null"]["controller_cpu_s"] for p in res["pairs"]
           if p["taskd"].get("controller_cpu_s") and p["null"].get("controller_cpu_s")]
    res["ratio_p99"] = _spread(ratios)
    res["ratio_server_cpu"] = _spread(cpu)  # the server's CPU for the round: what the load moves least
    if args.fanout_procs > 0:
        fan = argparse.Namespace(**{**vars(args), "procs": args.fanout_procs, "no_storm": True})
        res["fanout"] = one_size(n, fan, work)
    return res


def print_limit(result: dict[str, Any]) -> None:
    rows = []
    for r in result["runs"]:
        for i, pair in enumerate(r["pairs"], 1):
            for kind in ("taskd", "null"):
                f = pair[kind]
                rows.append([r["n"], i, kind, f["loadavg_at_start"][0], f.get("subscribe_all_s"),
                             _s(f, "p50"), _s(f, "p99"), f.get("controller_cpu_s"), f.get("clients_cpu_s"),
                             pair["ratio_p99"] if kind == "taskd" else None, f.get("error", "")])
    print(f"Controller against its limit: N one-agent jobs faulting at once on taskd's server and on the null "
          f"server (the same wire, nothing behind it), alternating, {result['procs']} client processes, same 2 cores")
    print(table(["N jobs", "pair", "server", "load", "subscribe all s", "fault->changeStrategy p50 s", "p99 s",
                 "server CPU s", "clients CPU s", "p99 taskd/null", "error"], rows, 2))
    for r in result["runs"]:
        q, fan = r["ratio_p99"], r.get("fanout")
        c = r["ratio_server_cpu"]
        print(f"\nN={r['n']}: taskd's p99 / the null server's: median {_x(q['median'])} over {q['n']} pair(s) "
              f"({', '.join(_x(v) for v in q['values'])}; goal <= 1.5x); the server's CPU for the round, "
              f"taskd's / the null's: median {_x(c['median'])} ({', '.join(_x(v) for v in c['values'])})")
        if fan is None:
            continue
        f = fan.get("fanout_ms", {})
        print(f"N={r['n']}: stopTrain fan-out to {r['n']} agents of one job ({fan['procs']} client processes): "
              f"p50 {_ms(f.get('p50'))}, p99 {_ms(f.get('p99'))}, max {_ms(f.get('max'))} {fan.get('error', '')}")


def _spread(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "values": values, "median": statistics.median(values) if values else None}


def _s(run: dict[str, Any], key: str) -> float | None:
    ms = run.get("fault_to_change_ms", {}).get(key)
    return None if ms is None else ms / 1e3


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _null_controller(port: int, log: Path) -> subprocess.Popen[bytes]:
    """bench/null_controller.py on `port` (the Recover wire with no controller behind it), once it accepts."""
    proc = subprocess.Popen([sys.executable, str(BENCH_DIR / "null_controller.py"), "--listen", f"127.0.0.1:{port}"],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, env=bench_env(), cwd=ROOT)
    wait_for(lambda: proc.poll() is not None or _listening(port), 30, "the null controller to listen", 0.02)
    if proc.poll() is not None:
        raise RuntimeError(f"null controller exited with {proc.returncode}")
    return proc


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _py_spy(pid: int, out: str | None) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the controller (collapsed stacks in `out`) from now until SIGINT."""
    if not out:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    # --nonblocking: py-spy's default pauses the process for every sample (at 10,000 jobs that tripled the times)
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "100", "--nonblocking",
                             "--output", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def print_many_jobs(result: dict[str, Any]) -> None:
    rows = []
    for r in result["runs"]:
        f = r.get("fault_to_change_ms", {})
        rows.append([r["n"], r.get("subscribe_all_s"), f.get("p50"), f.get("p99"), f.get("max"),
                     r.get("first_fault_to_last_change_s"), r.get("controller_cpu_s"), r.get("clients_cpu_s"),
                     r.get("controller_rss_mib"),
                     ",".join(f"{k}:{v}" for k, v in sorted(r.get("strategies", {}).items())),
                     r.get("error", "")])
    server = "the null controller (no taskd logic)" if result.get("server") == "null" else "one taskd server"
    print(f"Controller scale: N one-agent jobs on {server}, all faulting at once ({result['procs']} client "
          "processes on the same 2 cores as the server)")
    print(table(["N jobs", "subscribe all s", "fault->changeStrategy p50 ms", "p99 ms", "max ms",
                 "first fault -> last changeStrategy s", "controller CPU s", "clients CPU s", "controller RSS MiB",
                 "strategies",
                 "error"], rows, 1))


def storm(server: subprocess.Popen[bytes], port: int, state: str, n: int, sims: Sims, args: argparse.Namespace,
          work: Path) -> dict[str, Any]:
    t_stop = time.time()
    stop_process(server, grace=30)
    stopped = time.time()
    spawned = time.time()
    new = start_controller(port, state=state, log=work / f"controller-{n}.log", extra=SERVER_FLAGS)
    got = sims.ask({"cmd": "resubscribed", "generation": 2}, timeout=args.timeout)
    times = [t for a in got for t in a["times"]]
    refused = sum((Counter(a["refused"]) for a in got), Counter())
    before = Counter()  # refusals seen at start were already reported separately
    lost = n - len(times)
    return {"_server": new, "stop_s": stopped - t_stop, "restart_spawned_at": spawned,
            "resubscribed": len(times), "lost": lost,
            "last_agent_stream_s": (max(times) - spawned) if times else None,
            "first_message_s": stats([t - spawned for t in times]),
            "refused_total": dict(refused - before)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny run to check the script works")
    p.add_argument("--sizes", default="100,1000,4000,10000", help="agent counts N")
    p.add_argument("--procs", type=int, default=4, help="processes running the simulated agents")
    p.add_argument("--per-channel", type=int, default=1, help="agents sharing one gRPC connection")
    p.add_argument("--probes", type=int, default=5, help="stopTrain fan-outs measured per N")
    p.add_argument("--min-calls", type=int, default=2000, help="ReportProcessFault calls measured (at least N)")
    p.add_argument("--concurrency", type=int, default=64, help="calls in flight per process")
    p.add_argument("--timeout", type=float, default=600.0, help="per phase")
    p.add_argument("--no-storm", action="store_true", help="skip the controller restart")
    p.add_argument("--scenario", choices=("one-job", "many-jobs-fault", "limit"), default="one-job",
                   help="one-job: N agents of one job (fan-out, calls/s, restart); many-jobs-fault: N one-agent "
                        "jobs faulting at once; limit: many-jobs-fault on taskd and on the null server, "
                        "alternating --reps times, their p99 ratio, then one-job's fan-out (no restart)")
    p.add_argument("--reps", type=int, default=1, help="limit: taskd/null pairs")
    p.add_argument("--fanout-procs", type=int, default=4,
                   help="limit: client processes for the fan-out (0: no fan-out)")
    p.add_argument("--server", choices=("taskd", "null"), default="taskd",
                   help="many-jobs-fault: `null` runs bench/null_controller.py instead (the same wire with no "
                        "controller behind it: what gRPC and the clients alone cost)")
    p.add_argument("--server-args", default="", help="many-jobs-fault: more `taskd server` flags, e.g. "
                                                         "\"--keepalive-interval 3600\"")
    p.add_argument("--py-spy", metavar="PATH", help="many-jobs-fault: profile the controller over the faults with "
                                                        "py-spy (collapsed stacks to PATH)")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.quick:
        sizes, args.procs, args.probes, args.min_calls = [50], 2, 2, 200
        if args.scenario in ("many-jobs-fault", "limit"):
            sizes, args.procs, args.fanout_procs = [20], 1, min(args.fanout_procs, 1)
    result = header("controller_scale", args)
    result["sizes"] = sizes
    result["procs"] = args.procs
    result["server"] = args.server
    result["server_args"] = args.server_args
    result["runs"] = []
    measure = {"many-jobs-fault": many_jobs_fault, "limit": limit}.get(args.scenario, one_size)
    with tempfile.TemporaryDirectory(prefix="taskd-bench-scale-") as tmp:
        for n in sizes:
            t = time.time()
            run = measure(n, args, Path(tmp))
            run["elapsed_s"] = time.time() - t
            result["runs"].append(run)
            print(f"N={n}: done in {run['elapsed_s']:.0f}s{' - ' + run['error'] if 'error' in run else ''}",
                  file=sys.stderr)
    if args.scenario == "limit":
        print_limit(result)
        write_result("controller_scale", result)
        return 0
    if args.scenario == "many-jobs-fault":
        print_many_jobs(result)
        write_result("controller_scale", result)
        return 0
    rows = []
    for r in result["runs"]:
        f = r.get("fanout_ms", {})
        s = r.get("storm", {})
        rows.append([r["n"], r.get("subscribe_all_s"), r.get("rss_per_agent_kib"), f.get("p50"), f.get("p99"),
                     f.get("max"), r.get("report_calls_per_s"), s.get("all_resubscribed_s"),
                     s.get("last_agent_stream_s"), sum(s.get("refused_total", {}).values()) if s else None,
                     s.get("lost")])
    ok = [r["n"] for r in result["runs"] if r.get("fanout_ms", {}).get("p99") is not None
          and r["fanout_ms"]["p99"] < 1000 and "error" not in r]
    result["largest_n_with_fanout_p99_under_1s"] = max(ok) if ok else None
    print(f"Controller scale: one taskd server, N simulated agents of one job ({args.procs} client processes, "
          f"{args.per_channel} agent(s) per connection, same 2 cores)")
    print(table(["N", "subscribe all s", "RSS KiB/agent", "fan-out p50 ms", "fan-out p99 ms", "fan-out max ms",
                 "ReportProcessFault/s", "restart: all resubscribed s", "last stream s", "refused", "lost"],
                rows, 1))
    print(f"\nlargest N with stopTrain fan-out p99 under 1 s: {result['largest_n_with_fanout_p99_under_1s']}")
    write_result("controller_scale", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
