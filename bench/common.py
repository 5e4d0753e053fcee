"""Shared helpers of the benchmark scripts: timing statistics, tables, JSON results, processes.

Each benchmark is a plain script (`python bench/NAME.py [--quick]`); this module is imported
from the script's own directory, so it is not part of the `taskd` package.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil

from taskd.launcher.spec import free_port  # noqa: F401 (re-exported for the scripts)
from taskd.process.groups import reap_processes
from taskd.process.tree import rank_pids  # noqa: F401 (re-exported for the scripts)

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
RANK_DUMMY = BENCH_DIR / "rank_dummy.py"
TASKD_DRIVER = BENCH_DIR / "run_taskd.py"
TORCHRUN_DRIVER = BENCH_DIR / "run_torchrun.py"


# ----------------------------------------------------------------------------- statistics

def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100.0 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def stats(values: Iterable[float], scale: float = 1.0) -> dict[str, Any]:
    """n, p50, p99, max, mean of `values` multiplied by `scale` (e.g. 1e3 for ms)."""
    vals = [v * scale for v in values]
    if not vals:
        return {"n": 0, "p50": None, "p99": None, "max": None, "mean": None}
    return {"n": len(vals), "p50": percentile(vals, 50), "p99": percentile(vals, 99), "max": max(vals),
            "mean": sum(vals) / len(vals)}


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


# Student's t, 97.5th percentile, by degrees of freedom; a df between two entries takes the lower one's (wider)
_T975 = ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365), (8, 2.306),
         (9, 2.262), (10, 2.228), (12, 2.179), (15, 2.131), (20, 2.086), (25, 2.060), (30, 2.042), (40, 2.021),
         (60, 2.000), (120, 1.980))


def interval95(values: list[float]) -> dict[str, Any]:
    """Mean of `values` (one per repetition, e.g. a configuration's paired cost against the baseline of the same
    repetition) and the half-width of its 95 % confidence interval (Student's t); half is None below 2 values.
    An interval, not a median: it says how far the noise of the repetitions leaves the mean uncertain."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "half": None}
    mean = sum(values) / n
    if n < 2:
        return {"n": n, "mean": mean, "half": None}
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    t = [t for df, t in _T975 if df <= n - 1][-1]
    return {"n": n, "mean": mean, "half": t * sd / n ** 0.5}


def narrow_enough(intervals: Iterable[dict[str, Any]], target: float) -> bool:
    """Every interval's half-width is known and below `target` (the repetitions can stop)."""
    return all(i["half"] is not None and i["half"] < target for i in intervals)


def fmt_interval(i: dict[str, Any], digits: int = 1) -> str:
    """"mean ± half" (or the mean alone with one value, "-" with none)."""
    if i["mean"] is None:
        return "-"
    return f"{i['mean']:.{digits}f}" + ("" if i["half"] is None else f" ± {i['half']:.{digits}f}")


def job_processes(root_parent: int) -> list[psutil.Process]:
    """The processes of the job this process belongs to: the ancestor whose parent is `root_parent` (the benchmark
    that started the job's launcher) and every process under it; [] when no ancestor has that parent."""
    try:
        root = psutil.Process()
        while root.ppid() != root_parent:
            root = root.parent()
            if root is None or root.pid <= 1:
                return []
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def job_cpu_seconds(root_parent: int) -> float | None:
    """CPU seconds (user + system, every thread) used so far by the job this process belongs to: the ancestor
    whose parent is `root_parent` (the benchmark that started the job's launcher) and every process under it,
    ranks and agent alike. None when no ancestor has that parent. A difference of two readings is the job's CPU
    cost of what ran between them, which other processes' load moves far less than wall time."""
    try:
        root = psutil.Process()
        while root.ppid() != root_parent:
            root = root.parent()
            if root is None or root.pid <= 1:
                return None
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                t = proc.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                continue  # gone meanwhile: none of the steady state's processes
        return total
    except psutil.Error:
        return None


# ----------------------------------------------------------------------------- output

def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(headers: list[str], rows: list[list[Any]], digits: int = 2) -> str:
    """A Markdown table (pastes straight into BENCHMARKS.md)."""
    cells = [[fmt(c, digits) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"  # noqa: E731
    out = [line(headers), "| " + " | ".join("-" * w for w in widths) + " |"]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def machine() -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(), "cpu_model": _cpu_model(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(), "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "torch": torch_version(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def torch_version() -> str | None:
    try:
        import importlib.metadata as md

        return md.version("torch")
    except Exception:
        return None


def write_result(name: str, data: dict[str, Any]) -> Path:
    """Write bench/results/NAME.json (or $BENCH_RESULTS_DIR/NAME.json: the tests keep real results intact)."""
    results = Path(os.environ.get("BENCH_RESULTS_DIR") or RESULTS)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)
    print(f"\nresults written to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return path


def header(name: str, args: Any) -> dict[str, Any]:
    return {"benchmark": name, "command": " ".join([sys.executable.rsplit('/', 1)[-1], *sys.argv]),
            "quick": bool(getattr(args, "quick", False)), "started": time.time(), "machine": machine()}


# ----------------------------------------------------------------------------- processes

def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.005) -> Any:
    """Poll until cond() is truthy and return its value; TimeoutError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def bench_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "MINDX_TASK_ID")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def stop_process(proc: subprocess.Popen[Any] | None, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace`; reaps it."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def run_job(cmd: list[str], timeout: float, **popen: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True)``, but past ``timeout`` every process under it is
    ended (taskd.process.groups.reap_processes), a launcher's ranks too: torchrun starts each in a session of its
    own, so a plain run's timeout or a process-group kill leaves them running. Then TimeoutExpired is raised (and
    the same for any exception that stops the wait: the bench's SIGTERM, a ^C)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          **popen) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:  # past the timeout, or the bench itself stopped (SIGTERM, ^C): nothing left running
            try:
                tree = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
            except psutil.NoSuchProcess:
                tree = []
            reap_processes(tree, grace=2.0)
            proc.communicate(timeout=30)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def start_controller(port: int, state: str = ":memory:", log: Path | None = None,
                     extra: list[str] | None = None) -> subprocess.Popen[bytes]:
    """A standalone `taskd server` process (python -m taskd.controller); returns once it accepts calls."""
    cmd = [sys.executable, "-m", "taskd.controller", "--listen", f"127.0.0.1:{port}", "--state", state,
           "--log-level", "WARNING", *(extra or [])]
    out = log.open("ab") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=bench_env(), cwd=ROOT)
    wait_for(lambda: proc.poll() is not None or _accepts(port), 30, "the controller to listen", 0.02)
    if proc.poll() is not None:
        raise RuntimeError(f"controller exited with {proc.returncode}: {cmd}")
    return proc


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def job_events(address: str, job_id: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The controller's event history of one job: [{"time", "kind", "round", "detail"}]."""
    import grpc

    from taskd.proto import taskd_pb2, taskd_pb2_grpc

    with grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 256 * 2**20)]) as ch:
        reply = taskd_pb2_grpc.JobStatusStub(ch).ListJobs(taskd_pb2.JobQuery(jobId=job_id), timeout=timeout)
    if reply.status.code != 0 or not reply.jobs:
        raise RuntimeError(f"ListJobs({job_id}) answered {reply.status.code}: {reply.status.info}")
    return [{"time": e.time, "kind": e.kind, "round": e.round, "detail": json.loads(e.detail or "{}")}
            for e in reply.jobs[0].events]


class JsonlTail:
    """Reads a JSON-lines file as it grows (the drivers' log records, the ranks' start records)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0
        self._partial = b""
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._pos)
                data = fh.read()
        except FileNotFoundError:
            return []
        self._pos += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        new = [json.loads(line) for line in lines if line.strip()]
        self.records.extend(new)
        return new

    def find(self, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        def look() -> dict[str, Any] | None:
            self.poll()
            for rec in reversed(self.records):
                if pred(rec):
                    return rec
            return None
        return wait_for(look, timeout, what, 0.002)


def ranks_alive(records: list[dict[str, Any]], ranks: Iterable[int], after: float) -> dict[int, dict[str, Any]]:
    """The first start record of each rank at or after `after` (from rank_dummy's start file)."""
    found: dict[int, dict[str, Any]] = {}
    wanted = set(ranks)
    for rec in records:
        if rec.get("event") == "start" and rec["rank"] in wanted and rec["t"] >= after and rec["rank"] not in found:
            found[rec["rank"]] = rec
    return found


def torch_missing_message() -> str:
    return ("torch is not installed: skipping the torchrun side "
            "(install it with `pip install torch==2.13.0`, a CPU build)")


def has_torch() -> bool:
    return torch_version() is not None


class EventCollector:
    """Accumulates a job's event history across calls: the controller answers only the last 500 events."""

    def __init__(self, address: str, job_id: str) -> None:
        self.address = address
        self.job_id = job_id
        self._seen: set[tuple[float, str, int, str]] = set()
        self.events: list[dict[str, Any]] = []

    def fetch(self) -> list[dict[str, Any]]:
        for e in job_events(self.address, self.job_id):
            key = (e["time"], e["kind"], e["round"], json.dumps(e["detail"], sort_keys=True))
            if key not in self._seen:
                self._seen.add(key)
                self.events.append(e)
        self.events.sort(key=lambda e: e["time"])
        return self.events
