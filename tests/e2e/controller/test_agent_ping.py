"""The server's HTTP/2 PINGs declare a SIGSTOPped agent lost (tests/e2e/agent/test_node_loss_e2e.py), and never
a merely busy one: an agent process whose Python holds the GIL answers them anyway (gRPC's own threads do)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from support import STARTED, wait_for
from support.scripted_agent import ScriptedAgent

from taskd.controller.service.server import ControllerConfig, EmbeddedController

AGENT = """
import os, socket, sys, threading, time
from taskd.client import RecoverClient
from taskd.client.credentials import ClientCredentials
from taskd.proto import recover_pb2
info = recover_pb2.ClientInfo(jobId=sys.argv[2], role="agent", nodeRank=1, nodeCount=2, ranksPerNode=1,
                              host=socket.gethostname(), pid=os.getpid())
client = RecoverClient(info, sys.argv[1], credentials=ClientCredentials())
assert client.init_clusterd() and client.register().code == 0
threading.Thread(target=client.start_subscribe, daemon=True).start()
while not client.connected:
    time.sleep(0.01)
sys.setswitchinterval(60.0)  # the loop below keeps the GIL: no other Python thread of this process runs
print("busy", flush=True)
x = 0
for i in range(10**9):
    x += i
"""


def test_an_agent_whose_python_is_busy_is_not_declared_lost() -> None:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", agent_ping_interval=0.5,
                           agent_ping_timeout=0.5, agent_loss_grace=0.3)
    with EmbeddedController(cfg) as ctl:
        node0 = ScriptedAgent(ctl.address, "busy", node_rank=0, node_count=2).join()
        proc = subprocess.Popen([sys.executable, "-c", AGENT, ctl.address, "busy"], stdout=subprocess.PIPE)
        STARTED.append(proc)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"busy"
            time.sleep(3.0)  # six PING intervals with its Python busy (nothing to await: nothing must happen)
            kinds = [e.kind for e in node0.list_jobs("busy").jobs[0].events]
            assert "agent_unsubscribed" not in kinds and "node_lost" not in kinds, kinds
            os.kill(proc.pid, signal.SIGSTOP)  # the same process stopped: now it is lost (the test can fail)
            wait_for(lambda: "node_lost" in [e.kind for e in node0.list_jobs("busy").jobs[0].events], 10,
                     "the stopped agent to be declared lost")
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            node0.close()
