"""Node 0 holds MASTER_PORT for the job's life (issue 21, D6 and D8): real sockets, a real rank process."""

from __future__ import annotations

import glob
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import wait_for

from taskd.launcher import STATUS_OK, LocalLauncher, WorkerSpec, command_for
from taskd.launcher.ports import MasterPortBusy

ROOT = Path(__file__).resolve().parents[3]
# rank 0 serves MASTER_PORT as TCPStore does (SO_REUSEADDR, listen), then says whether that worked
SERVE = textwrap.dedent("""
    import os, socket, sys
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("", int(os.environ["MASTER_PORT"])))
    s.listen()
    open(sys.argv[1], "w").write("served")
""")


def _plain_bind(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_the_port_node_0_picked_is_its_own_until_it_closes_and_rank_0_can_serve_it(tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    launcher = LocalLauncher(WorkerSpec(command_for(str(script), [str(tmp_path / "out")]), nproc_per_node=1,
                                        job_id="port-hold"))
    try:
        port = launcher.spec.master_port
        assert port > 0
        assert not _plain_bind(port), "another process could take the picked port before rank 0 binds it"
        launcher.start_all_worker()
        wait_for(lambda: launcher.monitor([0])[0]["status"] == STATUS_OK, 30, "rank 0 to serve MASTER_PORT")
        assert (tmp_path / "out").read_text() == "served"
        assert not _plain_bind(port)  # still held between rank generations
    finally:
        launcher.close(grace=0.5)
    assert _plain_bind(port), "the port stayed held after the launcher closed"


def test_a_given_port_something_listens_on_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        areas = set(glob.glob("/dev/shm/taskd-snap-busy-*"))
        with pytest.raises(MasterPortBusy, match=f"port {port} is already in use"):
            LocalLauncher(WorkerSpec(command_for("x.py"), nproc_per_node=1, master_port=port, job_id="busy"))
        assert set(glob.glob("/dev/shm/taskd-snap-busy-*")) == areas, "its snapshot directory was left behind"
        # the same through `taskd run`, for a plain script (not only live ones): exit 2, nothing started
        out = tmp_path / "ran"
        script = tmp_path / "plain.py"
        script.write_text(f"open({str(out)!r}, 'w').write('ran')\n")
        proc = subprocess.run([sys.executable, "-m", "taskd", "run", "--master-port", str(port), str(script)],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert f"port {port} is already in use" in proc.stderr and "--master-port" in proc.stderr
    assert not out.exists() and "Traceback" not in proc.stderr
