"""The embedded controller takes calls only from its own agent: a per-run token, handed over in-process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import pytest
from support import STARTED, wait_for

from taskd.controller.service.server import EmbeddedController
from taskd.proto import taskd_pb2, taskd_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]


def _list_jobs(address: str, token: str | None = None) -> taskd_pb2.JobList:
    with grpc.insecure_channel(address) as channel:
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        return taskd_pb2_grpc.JobStatusStub(channel).ListJobs(taskd_pb2.JobQuery(), timeout=5, metadata=metadata)


def test_for_agent_makes_a_fresh_token_and_refuses_calls_without_it() -> None:
    first, second = EmbeddedController.for_agent(3), EmbeddedController.for_agent(3)
    assert first.token and second.token and first.token != second.token
    assert first.token not in repr(first.config)
    address = first.start()
    try:
        with pytest.raises(grpc.RpcError) as err:
            _list_jobs(address)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            _list_jobs(address, token=second.token)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert _list_jobs(address, token=first.token).status.code == 0
    finally:
        first.stop()


def test_taskd_run_embedded_controller_refuses_other_local_users(tmp_path: Path) -> None:
    """The console shows the controller's port; a local process that reads it still cannot list or change jobs,
    and the token is in no rank's environment nor in the agent's argv."""
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys, time
        with open(os.path.join(sys.argv[1], f"env{os.environ['RANK']}.json"), "w") as fh:
            json.dump(dict(os.environ), fh)
        time.sleep(30)
    """))
    log = tmp_path / "console.log"
    env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "TASKD_TOKEN_FILE")}
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--nproc-per-node", "2", str(script), str(tmp_path)],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    STARTED.append(proc)
    try:
        match = wait_for(lambda: re.search(r"controller (127\.0\.0\.1:\d+) \(embedded\)", log.read_text()),
                         what="the controller's address on the console")
        wait_for(lambda: (tmp_path / "env1.json").exists() and (tmp_path / "env0.json").exists(),
                 what="both ranks' environments")
        with pytest.raises(grpc.RpcError) as err:
            _list_jobs(match.group(1))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "TASKD_TOKEN_FILE" in err.value.details() or "token" in err.value.details().lower()
        rank_env = (tmp_path / "env0.json").read_text() + (tmp_path / "env1.json").read_text()
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
        for text in (rank_env, cmdline, log.read_text()):
            assert "Bearer" not in text and "TASKD_TOKEN" not in text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
