"""msrun spawns ranks with `preexec_fn` while taskd's gRPC threads run in its process (issue 18, minor).

Importing `taskd.client` must switch gRPC's fork handlers off (else about one child in seven dies
between fork and exec: docs/mindspore.md) without leaving GRPC_ENABLE_FORK_SUPPORT in the environment
the children inherit. Measured here as msrun does it: a gRPC server thread and a streaming client
busy in the process, 150 `Popen(preexec_fn=os.setsid)` children, each printing its environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent('''
    import os, subprocess, threading, time
    import taskd.client  # what the msrun plugin imports first
    import grpc
    from concurrent import futures
    from taskd.proto import recover_pb2, recover_pb2_grpc

    class Servicer(recover_pb2_grpc.RecoverServicer):
        def SubscribeProcessManageSignal(self, request, context):
            while context.is_active():
                yield recover_pb2.ProcessManageSignal(uuid="x", signalType="keep-alive")
                time.sleep(0.001)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    recover_pb2_grpc.add_RecoverServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    first = threading.Event()

    def client():
        stub = recover_pb2_grpc.RecoverStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        for _ in stub.SubscribeProcessManageSignal(recover_pb2.ClientInfo(jobId="j")):
            first.set()

    threading.Thread(target=client, daemon=True).start()
    assert first.wait(30), "the stream never delivered"
    crashed = leaked = 0
    for _ in range(150):
        child = subprocess.Popen(["/usr/bin/env"], preexec_fn=os.setsid, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL)
        out, _ = child.communicate(timeout=30)
        crashed += child.returncode != 0
        leaked += b"GRPC_ENABLE_FORK_SUPPORT" in out
    print(crashed, leaked, flush=True)
    os._exit(0)
''')


def test_children_spawned_with_preexec_fn_neither_crash_nor_inherit_the_fork_switch() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    crashed, leaked = (int(n) for n in out.stdout.split())
    assert leaked == 0, f"{leaked} of 150 children inherited GRPC_ENABLE_FORK_SUPPORT"
    assert crashed == 0, f"{crashed} of 150 children died between fork and exec"
