"""Peers that never authenticate, at the scale of issue 19's probes, against a `taskd server` with a token.

Two phases, each against a fresh server (loopback only; the attackers bind 127.0.0.2-127.0.0.N so that
the per-IP limits, applied to loopback with --limit-loopback, see them as other hosts):

- slowloris (N3): C connections x S streams to /Recover/Init, each declaring a 4 MB message, sending
  what the windows allow and then one byte per stream every --trickle seconds, with no token;
- idle (N2): I HTTP/2 connections from one address (--idle-sources) that send the preface and SETTINGS and
  never call, against --max-connections B (with --reconnect, each comes back at once when closed).

Throughout each, a legitimate client (gRPC, the token, 127.0.0.1) makes one Init per second on a new
connection; the bench prints the server's RSS (baseline, peak, after the attackers left), how many of
the legitimate calls succeeded and their slowest latency, and the refusal lines the server logged.

    python bench/hostile.py [--quick] [--connections 300] [--streams 70] [--idle 400] [--budget 300]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import header, start_controller, stop_process, table, write_result  # noqa: E402
from h2probe import RawConnection, hwm_bytes, pump_all, rss_bytes  # noqa: E402

from taskd.proto import recover_pb2, recover_pb2_grpc  # noqa: E402

MB = 2**20
TOKEN = "bench-hostile-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def legit(port: int, job: str) -> tuple[bool, float, str]:
    t0 = time.monotonic()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            st = recover_pb2_grpc.RecoverStub(ch).Init(recover_pb2.ClientInfo(jobId=job, nodeCount=1, ranksPerNode=1),
                                                       timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),))
        return st.code == 0, time.monotonic() - t0, f"status {st.code}"
    except grpc.RpcError as exc:
        return False, time.monotonic() - t0, f"{exc.code().name}: {exc.details()}"


def source(i: int) -> str:
    return f"127.0.{2 + i // 250}.{2 + i % 250}"


def open_conn(port: int, i: int) -> RawConnection | None:
    try:
        return RawConnection.open("127.0.0.1", port, source=source(i), timeout=5)
    except OSError:
        return None


def phase(name: str, work: Path, flags: list[str], attack: Any, seconds: float) -> dict[str, Any]:
    port = free_port()
    log = work / f"{name}.log"
    token = work / "token"
    server = start_controller(port, log=log, extra=["--token-file", str(token), "--limit-loopback",
                                                    "--log-level", "INFO", *flags])
    try:
        assert legit(port, "warm")[0]
        base = rss_bytes(server.pid)
        calls: list[tuple[bool, float, str]] = []
        conns: list[RawConnection] = []
        stats = attack(port, conns, seconds, lambda: calls.append(legit(port, f"{name}-{len(calls)}")))
        peak = hwm_bytes(server.pid)
        during = rss_bytes(server.pid)
        for c in conns:
            c.close()
        time.sleep(5)
        after = rss_bytes(server.pid)
    finally:
        stop_process(server)
    text = log.read_text(errors="replace")
    refusals = [line for line in text.splitlines() if "refused" in line or "closed " in line]
    return {"phase": name, "flags": flags, "rss_base_mb": base / MB, "rss_peak_mb": peak / MB,
            "rss_end_of_attack_mb": during / MB, "rss_5s_after_mb": after / MB,
            "legit_ok": sum(ok for ok, _, _ in calls), "legit_calls": len(calls),
            "legit_slowest_s": max((t for _, t, _ in calls), default=None),
            "legit_failures": sorted({why for ok, _, why in calls if not ok})[:5],
            "refusal_log_lines": len(refusals), "refusal_examples": refusals[:4],
            "tracebacks": text.count("Traceback"), **stats}


def slowloris(conns_n: int, streams: int, trickle: float):  # noqa: ANN201
    def attack(port: int, conns: list[RawConnection], seconds: float, tick: Any) -> dict[str, Any]:
        conns += [c for i in range(conns_n) if (c := open_conn(port, i % 8)) is not None]
        pump_all(conns, 0.5)
        for c in conns:
            for _ in range(streams):
                c.call("/Recover/Init", 4 * MB)
            c.fill()
        end, next_trickle, reopened = time.monotonic() + seconds, time.monotonic() + trickle, 0
        while time.monotonic() < end:
            tick()
            pump_all(conns, 1.0)
            for i, c in enumerate(conns):  # a closed connection comes back and declares its messages again
                if c.closed:
                    n = open_conn(port, i % 8)
                    if n is not None:
                        conns[i] = n
                        reopened += 1
                        for _ in range(streams):
                            n.call("/Recover/Init", 4 * MB)
                        n.fill()
            if time.monotonic() >= next_trickle:
                next_trickle += trickle
                for c in conns:
                    c.fill()
                    c.trickle()
        return {"connections": conns_n, "streams_per_connection": streams,
                "declared_gb": conns_n * streams * 4 * MB / 2**30,
                "sent_mb": sum(c.sent_data for c in conns) / MB, "reconnects": reopened}
    return attack


def idle(count: int, sources: int, reconnect: bool):  # noqa: ANN201
    def attack(port: int, conns: list[RawConnection], seconds: float, tick: Any) -> dict[str, Any]:
        conns += [c for i in range(count) if (c := open_conn(port, i % sources)) is not None]
        end, reopened, closed_seen, refused_at_accept = time.monotonic() + seconds, 0, 0, 0
        while time.monotonic() < end:
            tick()
            pump_all(conns, 1.0)
            for i, c in enumerate(conns):
                if c.closed and c.sock.fileno() >= 0:
                    closed_seen += 1
                    c.close()
                    if not reconnect:
                        continue
                    n = open_conn(port, i % sources)
                    if n is None:
                        refused_at_accept += 1
                    else:
                        conns[i] = n
                        reopened += 1
        return {"idle_connections": count, "sources": sources, "reconnecting": reconnect,
                "closed_by_server": closed_seen, "reconnects": reopened}
    return attack


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="30 x 70 streams, 120 idle connections, 8 s each")
    p.add_argument("--connections", type=int, default=300)
    p.add_argument("--streams", type=int, default=70)
    p.add_argument("--trickle", type=float, default=5.0)
    p.add_argument("--idle", type=int, default=400)
    p.add_argument("--budget", type=int, default=300, help="--max-connections of the idle phase")
    p.add_argument("--idle-sources", type=int, default=1, help="addresses the idle connections come from")
    p.add_argument("--reconnect", action="store_true",
                   help="idle attackers reconnect at once when closed (not bounded: see RELIABILITY.md)")
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args()
    if args.quick:
        args.connections, args.idle, args.budget, args.seconds, args.trickle = 30, 120, 100, 8.0, 2.0
    out = header("hostile", args)
    with tempfile.TemporaryDirectory(prefix="taskd-hostile-") as tmp:
        work = Path(tmp)
        (work / "token").write_text(TOKEN)
        (work / "token").chmod(0o600)
        out["phases"] = [
            phase("slowloris", work, [], slowloris(args.connections, args.streams, args.trickle), args.seconds),
            phase("idle", work, ["--max-connections", str(args.budget)],
                  idle(args.idle, args.idle_sources, args.reconnect), args.seconds),
        ]
    rows = [[r["phase"], f"{r['rss_base_mb']:.0f}", f"{r['rss_peak_mb']:.0f}", f"{r['rss_end_of_attack_mb']:.0f}",
             f"{r['rss_5s_after_mb']:.0f}", f"{r['legit_ok']}/{r['legit_calls']}", r["legit_slowest_s"],
             r["refusal_log_lines"], r["tracebacks"]] for r in out["phases"]]
    print(table(["phase", "RSS base MB", "peak MB", "end of attack MB", "5 s after MB", "legit Init ok",
                 "slowest legit s", "refusal log lines", "tracebacks"], rows))
    for r in out["phases"]:
        print(f"{r['phase']}: " + ", ".join(f"{k}={v}" for k, v in r.items() if k not in (
            "phase", "refusal_examples", "flags")))
        for line in r["refusal_examples"]:
            print("   ", line[:200])
    write_result("hostile", out)


if __name__ == "__main__":
    main()
