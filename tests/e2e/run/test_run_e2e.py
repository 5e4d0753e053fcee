"""`taskd run` end to end: real ranks, real signals, the embedded (or a real) controller."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import STARTED, free_port, leftovers, port_open, ranks_of, wait_for
from support.run import EXAMPLE, ROOT, taskd_run


def example_args(tmp: Path, steps: int = 80, sleep: float = 0.04) -> list[str]:
    return [str(EXAMPLE), "--steps", str(steps), "--ckpt-every", "10", "--ckpt-dir", str(tmp / "ckpt"),
            "--out", str(tmp / "out"), "--step-sleep", str(sleep)]


def has_checkpoint(tmp: Path, rank: int) -> bool:
    d = tmp / "ckpt" / f"rank{rank}"
    return d.is_dir() and any(d.iterdir())


def params(tmp: Path, world: int) -> list[np.ndarray]:
    return [np.load(tmp / "out" / f"rank{r}.npy") for r in range(world)]


def summary(tmp: Path, rank: int) -> dict:
    return json.loads((tmp / "out" / f"rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    """A fault-free 4-rank run: what every recovered run must reproduce bit for bit."""
    tmp = tmp_path_factory.mktemp("baseline")
    proc = taskd_run(["--nproc-per-node", "4", "--quiet", *example_args(tmp, sleep=0.0)], tmp / "console.log")
    assert proc.wait(timeout=120) == 0, (tmp / "console.log").read_text()
    return params(tmp, 4)


def assert_resumed_after_restart(text: str, victim: int, resumed_from: int | None = None) -> float:
    """The restart line does not claim recovery; "training resumed" names a step of the new incarnation,
    and the summary's "spent recovering" is that fault -> resumed time, not the restart's."""
    restart = re.search(rf"replaced rank\(s\) \[{victim}\] with ([\w-]+)[^\n]* in ([0-9.]+)s", text)
    resumed = re.search(rf"training resumed ([0-9.]+)s after the fault \(([\w-]+); [^\n]*rank {victim} at step "
                        r"(\d+)(?:, step (\d+) before the fault)?", text)
    assert restart and resumed, text
    assert "recovered" not in text, text
    assert text.index(restart.group(0)) < text.index(resumed.group(0))
    restart_s, resumed_s = float(restart.group(2)), float(resumed.group(1))
    assert resumed_s > restart_s, text
    spent = re.search(r"1 recovery\(ies\), ([0-9.]+)s spent recovering", text)
    assert spent and float(spent.group(1)) == pytest.approx(resumed_s, abs=0.006), text  # printed as .2f vs .3f
    assert re.search(rf"  {restart.group(1)} of rank\(s\) \[{victim}\](?: \(degraded: no controller\))?: "
                     rf"{resumed.group(1)}s from the fault to training resumed", text), text
    assert len(re.findall("training resumed [0-9.]+s after the fault", text)) == 1, text
    if resumed_from is not None:  # the heartbeat read is one of the replacement's own steps, past its checkpoint
        step, before = int(resumed.group(3)), resumed.group(4)
        assert step > resumed_from and before is not None and int(before) >= resumed_from, text
    return resumed_s


def kill_rank_mid_run(proc: subprocess.Popen[bytes], tmp: Path, victim: int, world: int) -> dict[int, int]:
    wait_for(lambda: has_checkpoint(tmp, victim), 60, f"rank {victim}'s first checkpoint")
    pids = wait_for(lambda: (r := ranks_of(proc.pid)) and len(r) == world and r, 30, "every rank running")
    os.kill(pids[victim], signal.SIGKILL)
    return pids


@pytest.mark.parametrize("spares", [0, 1])
def test_recover_restarts_only_the_killed_rank(tmp_path: Path, baseline: list[np.ndarray], spares: int) -> None:
    console = tmp_path / "console.log"
    proc = taskd_run(["--nproc-per-node", "4", "--log-dir", str(tmp_path / "logs"), "--warm-spares", str(spares),
                      *example_args(tmp_path)], console)
    kill_rank_mid_run(proc, tmp_path, victim=2, world=4)
    assert proc.wait(timeout=120) == 0, console.read_text()
    text = console.read_text()
    assert "fault: rank 2" in text and "killed by SIGKILL" in text
    assert_resumed_after_restart(text, victim=2, resumed_from=summary(tmp_path, 2)["resumed_from"])
    for rank, (got, want) in enumerate(zip(params(tmp_path, 4), baseline, strict=True)):
        assert np.array_equal(got, want), f"rank {rank} parameters differ from the fault-free run"
    restarts = {r: summary(tmp_path, r)["restart_count"] for r in range(4)}
    assert restarts == {0: 0, 1: 0, 2: 1, 3: 0}, "only rank 2 may be restarted"
    headers = {r: (tmp_path / "logs" / f"rank_{r}.log").read_text().count("==== taskd: rank") for r in range(4)}
    assert headers == {0: 1, 1: 1, 2: 2, 3: 1}, "logs are appended across restarts, one header per incarnation"


def test_job_rescheduling_restarts_every_rank(tmp_path: Path, baseline: list[np.ndarray]) -> None:
    console = tmp_path / "console.log"
    proc = taskd_run(["--nproc-per-node", "4", "--strategies", "job-rescheduling,exit", *example_args(tmp_path)],
                     console)
    kill_rank_mid_run(proc, tmp_path, victim=2, world=4)
    assert proc.wait(timeout=120) == 0, console.read_text()
    text = console.read_text()
    assert "replaced rank(s) [2] with job-rescheduling (every rank restarted)" in text
    assert_resumed_after_restart(text, victim=2, resumed_from=summary(tmp_path, 2)["resumed_from"])
    for rank, (got, want) in enumerate(zip(params(tmp_path, 4), baseline, strict=True)):
        assert np.array_equal(got, want), f"rank {rank} parameters differ from the fault-free run"
    assert {summary(tmp_path, r)["restart_count"] for r in range(4)} == {1}


def test_rank_crashing_at_every_start_exhausts_the_budget(tmp_path: Path) -> None:
    marker = f"always-crash-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / f"{marker}.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    print('Traceback (most recent call last):\\nRuntimeError: rank 1 cannot start', flush=True)\n"
        "    sys.exit(3)\n"
        "time.sleep(60)\n")
    console = tmp_path / "console.log"
    proc = taskd_run(["--nproc-per-node", "2", "--max-restarts", "2", "--stop-grace", "1", str(script)], console)
    code = proc.wait(timeout=120)
    text = console.read_text()
    assert code == 3, text
    assert "first failure: rank 1" in text
    assert "RuntimeError: rank 1 cannot start" in text.split("first failure:")[-1], "the failing rank's log tail"
    assert leftovers(marker) == []


def test_sigterm_to_taskd_run_stops_everything_within_grace(tmp_path: Path) -> None:
    marker = f"sleeper-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / f"{marker}.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)\n")
    console = tmp_path / "console.log"
    proc = taskd_run(["--nproc-per-node", "3", "--stop-grace", "2", str(script)], console)
    wait_for(lambda: len(ranks_of(proc.pid)) == 3, 60, "3 ranks running")
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    code = proc.wait(timeout=30)
    assert code == 128 + signal.SIGTERM, console.read_text()
    # ranks ignore SIGTERM, so this also proves the SIGKILL after the grace period
    assert time.monotonic() - started < 2 + 10
    assert leftovers(marker) == []


def test_sigkill_to_taskd_run_takes_its_ranks_along(tmp_path: Path) -> None:
    marker = f"orphan-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / f"{marker}.py"
    script.write_text("import time\ntime.sleep(120)\n")
    proc = taskd_run(["--nproc-per-node", "2", str(script)], tmp_path / "console.log")
    wait_for(lambda: len(ranks_of(proc.pid)) == 2, 60, "2 ranks running")
    assert len(leftovers(marker)) == 3  # the agent (its argv names the script) and 2 ranks
    proc.kill()
    proc.wait(timeout=10)
    wait_for(lambda: leftovers(marker) == [], 10, "ranks to die with their agent")


def test_non_python_executable(tmp_path: Path) -> None:
    console = tmp_path / "console.log"
    proc = taskd_run(["--nproc-per-node", "2", "sh", "-c", 'echo "hello from $RANK of $WORLD_SIZE"'], console)
    assert proc.wait(timeout=60) == 0, console.read_text()
    text = console.read_text()
    assert "hello from 0 of 2" in text and "hello from 1 of 2" in text


def test_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    script = tmp_path / "ok.py"
    script.write_text("import time; time.sleep(30)\n")  # would run (and fail the test by its wait) if let through
    for args, env, needle in [
        (["--strategies", "recover,teleport", str(script)], {}, "teleport"),
        (["--nproc-per-node", "0", str(script)], {}, "--nproc-per-node must be >= 1"),
        ([str(tmp_path / "missing.py")], {}, "no such file"),
        (["--server", "bad:host:1", str(script)], {}, "--server: bad controller address 'bad:host:1'"),
        ([str(script)], {"MINDX_SERVER_IP": "a b"}, "MINDX_SERVER_IP: bad controller address"),
        (["--heartbeat-timeout", "0", str(script)], {}, "--heartbeat-timeout must be > 0"),
        (["--monitor-interval", "-1", str(script)], {}, "--monitor-interval must be > 0"),
        (["--log-dir", str(script / "logs"), str(script)], {}, "--log-dir: cannot create"),
        (["--master-port", "70000", str(script)], {}, "--master-port must be in [0, 65535]"),
    ]:
        out = subprocess.run([sys.executable, "-m", "taskd.run", *args], capture_output=True, text=True,
                             timeout=20, cwd=ROOT, env={**os.environ, **env})
        assert out.returncode == 2 and needle in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr


@contextlib.contextmanager
def taskd_server(tmp: Path) -> Iterator[int]:
    """A real `taskd server` on a free port (its log in tmp/server.log); yields the port."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", f"127.0.0.1:{port}",
                               "--state", ":memory:"], stdout=(tmp / "server.log").open("wb"),
                              stderr=subprocess.STDOUT, cwd=ROOT)
    STARTED.append(server)
    try:
        wait_for(lambda: port_open(port), 30, "taskd server to listen")
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_two_nodes_share_one_controller(tmp_path: Path, baseline: list[np.ndarray]) -> None:
    with taskd_server(tmp_path) as port:
        nodes = [
            taskd_run(["--nnodes", "2", "--node-rank", str(r), "--nproc-per-node", "2", "--job-id", "two-nodes",
                       "--server", f"127.0.0.1:{port}", *example_args(tmp_path)], tmp_path / f"node{r}.log")
            for r in range(2)
        ]
        # every rank running (and so declared rejoinable: recover is offered only then); node 0 starts later,
        # after the rendezvous store it hosts
        wait_for(lambda: has_checkpoint(tmp_path, 3) and has_checkpoint(tmp_path, 0), 60, "ranks 0 and 3's checkpoints")
        pids = wait_for(lambda: (r := ranks_of(nodes[1].pid)) and len(r) == 2 and r, 30, "node 1's ranks")
        assert set(pids) == {2, 3}, "global ranks of node 1 are 2 and 3"
        os.kill(pids[3], signal.SIGKILL)
        for r, node in enumerate(nodes):
            assert node.wait(timeout=120) == 0, (tmp_path / f"node{r}.log").read_text()
        assert_resumed_after_restart((tmp_path / "node1.log").read_text(), victim=3,
                                     resumed_from=summary(tmp_path, 3)["resumed_from"])
        assert "not watched here: no rank of this node was restarted" in (tmp_path / "node0.log").read_text()
        restarts = {r: summary(tmp_path, r)["restart_count"] for r in range(4)}
        assert restarts == {0: 0, 1: 0, 2: 0, 3: 1}, "recover leaves node 0's ranks (and rank 2) untouched"
        for rank, (got, want) in enumerate(zip(params(tmp_path, 4), baseline, strict=True)):
            assert np.array_equal(got, want), f"rank {rank} differs"
        status = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", f"127.0.0.1:{port}",
                                 "--job", "two-nodes", "--json"], capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        job = json.loads(status.stdout)["jobs"][0]
        assert job["state"] == "SUCCEEDED" and len(job["agents"]) == 2
        # each agent told the controller when its ranks trained again: node 1 saw its restarted rank's first
        # step, node 0 had nothing restarted to watch; the round's figure is node 1's, after the round's end
        told = {e["detail"]["node_rank"]: e["detail"]["unseen"] for e in job["events"]
                if e["kind"] == "training_resumed"}
        assert told == {0: True, 1: False}, job["events"]
        (rnd,) = job["rounds"]
        assert rnd["secondsToTrainingResumed"] > rnd["durationSeconds"] > 0, rnd


LATE_FAULT = """
import os, sys, time
rank, go, up = int(os.environ["RANK"]), sys.argv[1], sys.argv[1] + ".up"
deadline = time.time() + 120
if rank == 2:
    open(up, "w").close()  # node 1 is in the job (its agent subscribed before starting ranks)
while rank < 2 and not os.path.exists(up) and time.time() < deadline:
    time.sleep(0.05)
if rank < 2:
    sys.exit(0)  # node 0's ranks are done, node 1's still run
while rank == 3 and not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.05)
if rank == 3:
    sys.exit(1)  # fails once node 0 has left
time.sleep(120)
"""


def test_a_fault_after_another_node_finished_fails_the_job_at_once(tmp_path: Path) -> None:
    script, go = tmp_path / "late_fault.py", tmp_path / "go"
    script.write_text(LATE_FAULT)
    with taskd_server(tmp_path) as port:
        nodes = [
            taskd_run(["--nnodes", "2", "--node-rank", str(r), "--nproc-per-node", "2", "--job-id", "late-fault",
                       "--server", f"127.0.0.1:{port}", str(script), str(go)], tmp_path / f"node{r}.log")
            for r in range(2)
        ]
        assert nodes[0].wait(timeout=60) == 0, (tmp_path / "node0.log").read_text()
        go.touch()
        # the server's stop timeout is 60 s: waiting for node 0 would outlast this wait
        assert nodes[1].wait(timeout=45) != 0, (tmp_path / "node1.log").read_text()
        text = (tmp_path / "node1.log").read_text()
        assert "rank(s) 3 failed after node(s) 0 had finished" in text, text
        assert "replaced rank" not in text and "training resumed" not in text
        assert leftovers(str(script)) == []



def test_unreachable_controller_degrades_to_local_restarts(tmp_path: Path, baseline: list[np.ndarray]) -> None:
    console = tmp_path / "console.log"
    args = ["--nproc-per-node", "4", "--server", f"127.0.0.1:{free_port()}", *example_args(tmp_path)]
    proc = taskd_run(args, console, env={"TASKD_CONTROLLER_TIMEOUT": "2"})
    kill_rank_mid_run(proc, tmp_path, victim=1, world=4)
    assert proc.wait(timeout=120) == 0, console.read_text()
    text = console.read_text()
    assert "degraded" in text
    assert_resumed_after_restart(text, victim=1, resumed_from=summary(tmp_path, 1)["resumed_from"])
    for rank, (got, want) in enumerate(zip(params(tmp_path, 4), baseline, strict=True)):
        assert np.array_equal(got, want), f"rank {rank} differs"


PROGRAM = """import os, sys, time
from taskd import worker
out, declare = sys.argv[1], sys.argv[2] == "declare"
if declare:
    worker.declare_rejoinable()
marker = os.path.join(out, "crashed")
for step in range(20):
    worker.heartbeat(step)
    if worker.rank() == 1 and step == 5 and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    time.sleep(0.05)
"""


@pytest.mark.parametrize("entry", ["module", "no-python"])
@pytest.mark.parametrize("declare", ["declare", "silent"])
def test_recover_needs_a_declaration_whatever_the_entrypoint(tmp_path: Path, entry: str, declare: str) -> None:
    """`-m module` and `--no-python` ranks are judged like a .py script's: recover only if every rank declared it
    (an undeclared DDP job's replacement would otherwise wait forever for peers that never re-form); a script
    that declared nothing gets no line about it."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "prog.py").write_text(PROGRAM)
    program = tmp_path / "prog"
    program.write_text(f"#!{sys.executable}\n{PROGRAM}")
    program.chmod(0o755)
    (tmp_path / "out").mkdir()
    argv = ["-m", "pkg.prog"] if entry == "module" else ["--no-python", str(program)]
    console = tmp_path / "console.log"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = taskd_run(["--nproc-per-node", "2", *argv, str(tmp_path / "out"), declare], console, env)
    assert proc.wait(timeout=120) == 0, console.read_text()
    text = console.read_text()
    if declare == "declare":
        assert "strategy: recover for rank(s) [1]" in text, text
        assert "recover not offered" not in text
    else:
        assert "strategy: job-rescheduling for rank(s) [1]" in text, text
        # a script that declared nothing at all is told nothing about live recovery (issue 32, F10)
        assert "recover not offered" not in text and "strategy: recover" not in text, text


def run_two_ranks(tmp_path: Path, source: str, *args: str) -> str:
    """A 2-rank `taskd run` of `source` (its first argument the output directory); its console, once it exited 0."""
    script = tmp_path / "ranks.py"
    script.write_text(source)
    (tmp_path / "out").mkdir()
    console = tmp_path / "console.log"
    proc = taskd_run(["--nproc-per-node", "2", str(script), str(tmp_path / "out"), *args], console)
    assert proc.wait(timeout=120) == 0, console.read_text()
    return console.read_text()


SILENT = """import os, sys, time
from taskd import worker
out, declare = sys.argv[1], sys.argv[2] == "declare"
if declare:
    worker.declare_rejoinable()
marker = os.path.join(out, "crashed")
if worker.rank() == 1 and not os.path.exists(marker):
    time.sleep(0.3)
    open(marker, "w").close()
    os._exit(3)
time.sleep(1.0)
"""


@pytest.mark.parametrize("declare", ["declare", "silent"])
def test_ranks_sending_no_heartbeats_never_claim_training_resumed(tmp_path: Path, declare: str) -> None:
    """Ranks that report no steps cannot say they resumed: the summary says so and counts only fault -> restart."""
    text = run_two_ranks(tmp_path, SILENT, declare)
    strategy = "recover" if declare == "declare" else "job-rescheduling"
    restart = re.search(rf"replaced rank\(s\) \[1\] with {strategy}[^\n]* in ([0-9.]+)s", text)
    assert restart, text
    assert "training resumed" not in text and "spent recovering" not in text and "recovered" not in text, text
    why = "training's resumption not reported: the ranks send no heartbeat steps"
    found = re.search(rf"1 recovery\(ies\) \({why}\), ([0-9.]+)s from fault to ", text)
    assert found and float(found.group(1)) == pytest.approx(float(restart.group(1)), abs=0.006), text
    assert re.search(rf"  {strategy} of rank\(s\) \[1\]: [0-9.]+s from the fault to [^;\n]*; {why}", text), text


UNSEEN = """import os, sys, time
from taskd import worker
out, mode = sys.argv[1], sys.argv[2]
worker.declare_rejoinable()
crashes = len([f for f in os.listdir(out) if f.startswith("crash")])
if worker.rank() == 1 and crashes == 1:  # the replacement of the first crash
    time.sleep(0.3)
    if mode == "twice":
        open(os.path.join(out, "crash2"), "w").close()
        os._exit(3)  # a second fault before it reported any step
    sys.exit(0)  # "ends": it finishes without a heartbeat
for step in range(30):
    worker.heartbeat(step)
    if worker.rank() == 1 and step == 5 and crashes == 0:
        open(os.path.join(out, "crash1"), "w").close()
        os._exit(3)
    time.sleep(0.05)
"""


@pytest.mark.parametrize("mode", ["ends", "twice"])
def test_a_resumption_not_seen_is_not_reported_as_resumed(tmp_path: Path, mode: str) -> None:
    """A replacement that reports no step before the job ends, or before the next fault, is not "resumed":
    that restart's time is not counted as spent recovering."""
    text = run_two_ranks(tmp_path, UNSEEN, mode)
    restarts = [float(s) for s in re.findall(r"replaced rank\(s\) \[1\] with [^\n]* in ([0-9.]+)s", text)]
    if mode == "ends":
        assert len(restarts) == 1 and "training resumed" not in text and "spent recovering" not in text, text
        found = re.search(r"1 recovery\(ies\) \(training's resumption not seen before the job ended\), ([0-9.]+)s "
                          r"from fault to rank\(s\) replaced", text)
        assert found and float(found.group(1)) == pytest.approx(restarts[0], abs=0.006), text
    else:
        # the second fault's round (recover, or job-rescheduling if the controller escalates) resumes
        resumed = re.findall(r"training resumed ([0-9.]+)s after the fault \([\w-]+; [^\n]*rank 1 at step", text)
        assert len(restarts) == 2 and len(resumed) == 1, text
        found = re.search(r"2 recovery\(ies\), ([0-9.]+)s spent recovering in 1, ([0-9.]+)s from fault to rank\(s\) "
                          r"replaced in 1 \(training's resumption not seen before the next fault\)", text)
        assert "recover of rank(s) [1]: " in text and "; training's resumption not seen before the next fault" in text
        assert found, text
        assert float(found.group(1)) == pytest.approx(float(resumed[0]), abs=0.006), text
        assert float(found.group(2)) == pytest.approx(restarts[0], abs=0.006), text
