"""One tenant cannot hold the connection budget (issue 31, F3), against a real `taskd server` on loopback.

A holder of job `evil`'s credential (the job does not exist) opens 230 connections, one authenticated call on
each, and keeps them idle; the server has `--max-connections 200`. Before, all 200 slots stayed held until
`--idle-timeout` and every other client got UNAVAILABLE. Now the credential keeps at most its share (a
quarter of --max-connections: 50), and job `good`'s two nodes (real `taskd run`s) connect, recover a crashed rank
and succeed meanwhile; `taskd status` with good's credential answers too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import psutil
from support import STARTED, free_port, master_args, port_open, secret_file, wait_for

from taskd.controller.service.auth import job_credential
from taskd.proto import taskd_pb2, taskd_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]
ADMIN = "admin-token-for-tests-0123456789abcdef"
BUDGET, ATTACK, SHARE = 200, 230, 50

CRASH_ONCE = """\
import os, sys, time
from pathlib import Path
rank, out = os.environ["RANK"], Path(sys.argv[1])
if rank == "1":
    if not (out / "crashed-1").exists():
        (out / "crashed-1").write_text("x")
        sys.exit(3)
    (out / "done-1").write_text("x")
deadline = time.monotonic() + 60  # every rank stays until rank 1 ran again: no node ends while the round is open
while not (out / "done-1").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("rank", rank, "ok")
"""


def established(pid: int, port: int, local: bool) -> int:
    """Established TCP connections of process `pid` whose local (server side) or remote port is `port`."""
    conns = psutil.Process(pid).net_connections(kind="tcp")
    return sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED
               and ((c.laddr and c.laddr.port == port) if local else (c.raddr and c.raddr.port == port)))


def test_one_credentials_idle_connections_leave_room_for_another_jobs_agents_and_status(tmp_path: Path) -> None:
    token = secret_file(tmp_path / "token", ADMIN)
    good = secret_file(tmp_path / "good.cred", job_credential(ADMIN, "good"))
    port = free_port()
    log = tmp_path / "server.log"
    server = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", f"127.0.0.1:{port}",
                               "--state", str(tmp_path / "state.sqlite3"), "--token-file", str(token),
                               "--max-connections", str(BUDGET)],
                              stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    STARTED.append(server)
    held: list[grpc.Channel] = []
    try:
        wait_for(lambda: port_open(port), 30, "taskd server to listen")
        md = (("authorization", f"Bearer {job_credential(ADMIN, 'evil')}"),)
        answered = 0
        for _ in range(ATTACK):
            ch = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
            held.append(ch)
            try:
                taskd_pb2_grpc.JobStatusStub(ch).ListJobs(taskd_pb2.JobQuery(jobId="evil"), timeout=5, metadata=md)
                answered += 1
            except grpc.RpcError:
                pass
        assert answered >= BUDGET  # each connection proved the credential once; now they sit idle
        time.sleep(2)  # two scans of the connection watch

        script = tmp_path / "rank.py"
        script.write_text(CRASH_ONCE)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKD_TOKEN", "MINDX_"))}
        env["TASKD_TOKEN_FILE"] = str(good)
        master = master_args()
        nodes = [subprocess.Popen([sys.executable, "-m", "taskd.run", "--server", f"127.0.0.1:{port}", "--job-id",
                                   "good", "--nnodes", "2", "--node-rank", str(r), "--nproc-per-node", "2", *master,
                                   str(script),
                                   str(tmp_path)], stdout=subprocess.DEVNULL, env=env, cwd=ROOT,
                                  stderr=(tmp_path / f"node{r}.log").open("wb")) for r in range(2)]
        STARTED.extend(nodes)
        for r, node in enumerate(nodes):
            err = tmp_path / f"node{r}.log"
            assert node.wait(timeout=90) == 0, err.read_text()[-3000:]
            text = err.read_text()
            assert "job succeeded" in text
            # through the controller: before, each agent's Init timed out 3 times and it ran "degraded (local
            # restarts only)", and `taskd status` could not connect at all
            assert "unreachable" not in text and "degraded" not in text, text[-3000:]
        assert (tmp_path / "crashed-1").exists()
        status = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", f"127.0.0.1:{port}",
                                 "--job", "good", "--timeout", "10"], capture_output=True, text=True, timeout=60,
                                env=env, cwd=ROOT)
        assert status.returncode == 0, status.stderr
        assert "job good: SUCCEEDED" in status.stdout and "restarts 1/" in status.stdout, status.stdout
        # evil holds no more than its share (its connections stay open, idle), nor does the server hold more
        assert established(os.getpid(), port, local=False) <= SHARE
        assert established(server.pid, port, local=True) <= SHARE
    finally:
        for ch in held:
            ch.close()
        server.terminate()
        server.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert "idle connection(s) of job 'evil''s credential" in text and "--max-connections-per-credential" in text
    assert "Traceback" not in text
