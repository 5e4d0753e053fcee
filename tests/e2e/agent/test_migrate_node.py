"""`taskd migrate --node 1` of a 2-node DDP LiveGroup job (examples/torch/train_ddp.py, one rank per node, gloo, CPU)
to a standby agent, against a real `taskd server --token-file` on loopback (issue 34, item 4).

Refused first, each with its reason, exit 1 and nothing changed: no standby waits, node 0 (its agent hosts the
rendezvous store), a wrong token. Then a standby whose rank is SIGKILLed while it starts node 1's ranks: called off
(exit 1, the reason named), the job runs as it was, and the standby waits again (still a healthy spare). Then `taskd
migrate --node 1` with the job's own credential moves node 1 to that same standby: rank 1's old process is gone and
node 1's old agent exits 0 (no fault, no round, no 409 on its way out, its summary says its node moved), rank 0
keeps its pid, no step is redone or skipped, the final parameters are bit-identical to a fault-free run of the same
job on one node, the pause is shown by the CLI, in the job's events and on the console, and nothing of the job is
left running. Last, the drain hooks: SIGUSR1 to node 0's agent is refused (node 0 runs on); the drain file
(`--drain-file`) of node 1's agent (the standby that took it), touched, moves node 1 on to a second standby the same
way, and is removed once acted on.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support import ROOT, STARTED, free_port, leftovers, secret_file, wait_for  # noqa: E402
from support.restartable import server  # noqa: E402
from test_migrate import events, progress  # noqa: E402

pytestmark = pytest.mark.torch

EXAMPLE = ROOT / "examples" / "torch" / "train_ddp.py"
STEPS = 600  # paced while the test acts (0.2 s a step: 120 s of room), then at full speed
ADMIN = "migrate-node-test-admin-token-0123456789"
JOB = f"mignode{os.getpid()}"  # its own names (/dev/shm): another run may share the host


def script(tmp: Path, name: str, paced: bool) -> list[str]:
    """The job's script, paced (0.2 s a step) while `tmp`/`name`.pace exists: the test acts meanwhile."""
    if paced:
        (tmp / f"{name}.pace").touch()
    return [str(EXAMPLE), "--hidden", "32", "--layers", "2", "--inputs", "32", "--batch", "8", "--steps", str(STEPS),
            "--ckpt-every", "0", "--step-sleep", "0.2", "--sleep-while", str(tmp / f"{name}.pace"),
            "--pg-timeout", "30", "--ckpt-dir", str(tmp / name / "ckpt"), "--out", str(tmp / name / "out"),
            "--progress-dir", str(tmp / name / "progress")]


def agent(tmp: Path, log: str, args: list[str]) -> subprocess.Popen[bytes]:
    """A `taskd run` in a session of its own (its process group is the node), its console in `tmp`/`log`.log."""
    env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "MINDX_TASK_ID")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--stop-grace", "2",
                             *args], stdout=(tmp / f"{log}.log").open("wb"), stderr=subprocess.STDOUT, env=env,
                            cwd=ROOT, start_new_session=True)
    STARTED.append(proc)
    return proc


def migrate_call(address: str, node: int, token: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "TASKD_TOKEN_FILE")}
    return subprocess.Popen([sys.executable, "-m", "taskd", "migrate", "--server", address, "--job", JOB, "--node",
                             str(node), "--token-file", str(token), "--timeout", "150"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def migrate(address: str, node: int, token: Path) -> subprocess.CompletedProcess[str]:
    call = migrate_call(address, node, token)
    out, err = call.communicate(timeout=200)
    return subprocess.CompletedProcess(call.args, call.returncode, out, err)


def ended(proc: subprocess.Popen[bytes], tmp: Path, log: str, timeout: float = 180) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{log} did not end:\n{(tmp / f'{log}.log').read_text()[-6000:]}")


def console(tmp: Path, *names: str) -> str:
    return "\n".join(f"--- {n}\n{(tmp / f'{n}.log').read_text()}" for n in names)


def test_migrate_node_1_of_a_live_ddp_job_to_a_standby(tmp_path: Path) -> None:
    admin = secret_file(tmp_path / "admin.token", ADMIN + "\n")
    wrong = secret_file(tmp_path / "wrong.token", "not-the-token\n")
    with server(tmp_path, ("--token-file", str(admin))) as srv:
        common = ["--server", srv.address, "--token-file", str(admin)]
        ref = agent(tmp_path, "ref", [*common, "--nproc-per-node", "2", "--job-id", f"{JOB}ref",
                                      *script(tmp_path, "ref", False)])
        job = ["--nnodes", "2", "--nproc-per-node", "1", "--job-id", JOB, *common, "--master-addr", "127.0.0.1",
               "--master-port", str(free_port())]
        nodes = {n: agent(tmp_path, f"node{n}", [*job, "--node-rank", str(n), *script(tmp_path, "mig", True)])
                 for n in (0, 1)}
        credential = secret_file(tmp_path / "job.cred", subprocess.run(
            [sys.executable, "-m", "taskd", "token", "--job", JOB, "--token-file", str(admin)],
            capture_output=True, text=True, timeout=30, cwd=ROOT, check=True).stdout)
        wait_for(lambda: all(len(progress(tmp_path, "mig", r)) >= 3 for r in (0, 1)), 120, "both ranks to train")
        pids = {r: progress(tmp_path, "mig", r)[0][1] for r in (0, 1)}

        refused = migrate(srv.address, 1, admin)
        assert refused.returncode == 1 and f"no standby agent waits for job {JOB}" in refused.stderr, refused
        refused = migrate(srv.address, 0, admin)
        assert refused.returncode == 1 and "hosts the job's rendezvous store" in refused.stderr, refused
        refused = migrate(srv.address, 1, wrong)
        assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr, refused
        os.kill(nodes[0].pid, signal.SIGUSR1)  # the drain hook, refused the same way: node 0 runs on
        wait_for(lambda: "drain of node 0 not done" in (tmp_path / "node0.log").read_text(), 60, "the drain's answer")

        # a standby whose rank dies while it starts node 1's ranks: called off, the job runs as it was, and the
        # standby, a healthy spare still, waits again
        drain_file = tmp_path / "spare.drain"
        spare = agent(tmp_path, "spare", [*job, "--standby", "--drain-file", str(drain_file),
                                          *script(tmp_path, "mig", True)])
        wait_for(lambda: f"standby for job {JOB}: waiting" in (tmp_path / "spare.log").read_text(), 90, "a standby")
        call = migrate_call(srv.address, 1, credential)
        started = wait_for(lambda: re.search(r"this standby starts node 1's ranks \(rank:pid 1:(\d+)\)",
                                             (tmp_path / "spare.log").read_text()), 60, "the standby to start a rank")
        os.kill(int(started.group(1)), signal.SIGKILL)
        out, err = call.communicate(timeout=200)
        assert call.returncode == 1 and "called off: the successor could not take node 1" in err, (out, err)
        wait_for(lambda: "this standby waits again" in (tmp_path / "spare.log").read_text(), 60, "the standby again")
        assert spare.poll() is None, console(tmp_path, "spare")

        # the same standby: node 1 moves
        moved = migrate(srv.address, 1, credential)
        assert moved.returncode == 0, f"{moved}\n{console(tmp_path, 'node0', 'node1', 'spare')[-8000:]}"
        shown = re.search(rf"migrated node 1 of job {JOB} \(agent pid {nodes[1].pid} -> {spare.pid}\) at step (\d+): "
                          r"training paused (\d+\.\d+)s", moved.stdout)
        assert shown, moved.stdout
        print(moved.stdout.strip())
        assert ended(nodes[1], tmp_path, "node1", 60) == 0, console(tmp_path, "node1")  # ended cleanly, not a fault

        # the drain file of node 1's agent (the standby that took it), touched: node 1 moves on to the next standby
        last = agent(tmp_path, "last", [*job, "--standby", *script(tmp_path, "mig", True)])
        wait_for(lambda: f"standby for job {JOB}: waiting" in (tmp_path / "last.log").read_text(), 90, "a standby")
        drain_file.touch()
        assert ended(spare, tmp_path, "spare", 150) == 0, console(tmp_path, "node0", "spare", "last")
        (tmp_path / "mig.pace").unlink()
        assert ended(nodes[0], tmp_path, "node0") == 0, console(tmp_path, "node0", "last")
        assert ended(last, tmp_path, "last") == 0, console(tmp_path, "node0", "last")
        assert ended(ref, tmp_path, "ref") == 0, console(tmp_path, "ref")
        found = events(srv.address, JOB, admin)
        record = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", srv.address, "--job", JOB,
                                 "--token-file", str(admin)], capture_output=True, text=True, timeout=30, cwd=ROOT)

    text = console(tmp_path, "node0", "node1", "spare", "last")
    done, drained = [e for e in found["migrated"] if e.get("node_rank") == 1]
    assert drained["old_pid"] == spare.pid and drained["pid"] == last.pid and drained["step"] > done["step"], drained
    assert f"drain (file {drain_file}): asking the controller to move node 1's ranks" in text, text
    assert not drain_file.exists(), "the drain file was not taken"
    assert done["old_pid"] == nodes[1].pid and done["pid"] == spare.pid and done["pause_seconds"] > 0, done
    assert done["step"] == int(shown.group(1)) and abs(done["pause_seconds"] - float(shown.group(2))) < 0.001, done
    assert [f["reason"] for f in found["migration_failed"]] and not found.get("round_started"), found  # no round
    assert "training paused" in (tmp_path / "node0.log").read_text(), text  # the console says it too
    for old in ("node1", "spare"):  # node 1's old agents say what happened to their node, and no 409 on the way
        said = (tmp_path / f"{old}.log").read_text()
        assert "runs on its successor; this agent ends" in said, text
        assert re.search(r"node 1 migrated to a standby agent \(node migration \S+\): this agent ended cleanly",
                         said), said
        assert "given to two agents" not in said and "job succeeded" not in said, said
    after_call_off = (tmp_path / "spare.log").read_text().split("this standby waits again")[1]
    assert "fault:" not in console(tmp_path, "node0", "node1", "last") + after_call_off, text  # but the killed one
    for r in (0, 1):
        steps = progress(tmp_path, "mig", r)
        assert [s for s, _ in steps] == list(range(STEPS)), f"rank {r} redid or skipped steps\n{text[-6000:]}"
    assert {p for _, p in progress(tmp_path, "mig", 0)} == {pids[0]}, "rank 0 changed its process"
    moved_pids = [p for _, p in progress(tmp_path, "mig", 1)]
    assert moved_pids[0] == pids[1] and len(set(moved_pids)) == 3, moved_pids  # node 1's, the spare's, the last's
    reference = torch.load(tmp_path / "ref" / "out" / "final.pt")
    final = torch.load(tmp_path / "mig" / "out" / "final.pt")
    assert reference.keys() == final.keys()
    for key in reference:
        assert torch.equal(reference[key], final[key]), f"{key} differs from the fault-free run"
    assert record.returncode == 0 and "migrat" in record.stdout, record
    assert not leftovers(str(tmp_path / "mig" / "out")), "a process of the job is left"
    assert not [p for p in os.listdir("/dev/shm") if JOB in p], "a shared-memory segment of the job is left"
