"""Live recovery beyond the dead rank's gloo neighbours: every survivor leaves the broken group together.

With 4+ ranks only the dead rank's neighbours get "Connection closed by peer"; the others wait on
live connections to those neighbours. A rank that leaves therefore shuts down its group's
connections (taskd.worker.torch_group), so the failure runs along the ring instead of every far
rank waiting out the collective timeout.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest

torch = pytest.importorskip("torch")

from test_live_e2e import assert_identical, resumed_after, start_pids, summary, taskd_run  # noqa: E402

from taskd.worker.live import ErrorKind  # noqa: E402
from taskd.worker.torch_group import GroupSockets  # noqa: E402

pytestmark = pytest.mark.torch

WORLD = 4
PG_TIMEOUT = 60.0  # a far rank that waited for it would report COLLECTIVE_TIMEOUT and resume after it
ARGS = ["--hidden", "64", "--layers", "2", "--steps", "30", "--ckpt-every", "10", "--step-sleep", "0.05",
        "--pg-timeout", str(PG_TIMEOUT)]


def run(tmp, extra: list[str] = ()) -> tuple[int, str]:  # noqa: ANN001 (a Path)
    return taskd_run(tmp, args=[*ARGS, "--ckpt-dir", str(tmp / "ckpt"), "--out", str(tmp / "out"), *extra],
                     nproc=WORLD)


def test_sigkill_with_four_ranks_every_survivor_learns_from_a_closed_connection(tmp_path):
    code, console = run(tmp_path / "reference")
    assert code == 0, console[-6000:]
    reference = torch.load(tmp_path / "reference" / "out" / "final.pt")

    victim = 1  # rank 3 is not its gloo neighbour in a 4-rank ring
    job = tmp_path / "fault"
    code, console = run(job, ["--crash-at-step", "12", "--fault-rank", str(victim)])
    assert code == 0, console[-6000:]
    info = summary(job)
    pids = start_pids(console)
    survivors = [r for r in range(WORLD) if r != victim]
    assert {r: info["ranks"][str(r)]["pid"] for r in survivors} == {r: pids[r] for r in survivors}
    assert f"strategy: recover for rank(s) [{victim}]" in console and "job-rescheduling" not in console
    for r in survivors:
        (event,) = info["ranks"][str(r)]["recoveries"]
        # a failed connection (or the control file at a step boundary), never the collective timeout
        assert event["error"] in (ErrorKind.PEER_LOST.name, None), (r, event)
    assert_identical(torch.load(job / "out" / "final.pt"), reference)
    assert all(info["recomputed"][str(r)] == 0 for r in survivors) and info["recomputed"][str(victim)] <= 1
    (resumed,) = resumed_after(console)
    assert resumed < PG_TIMEOUT / 2, console[-6000:]  # a correctness guard only; speed is in bench/
    print(f"4 ranks, kill of rank {victim} -> training resumed in {resumed:.2f}s")


def test_group_sockets_tracks_connections_made_while_forming_and_ends_them(tmp_path):
    store = socket.create_server(("127.0.0.1", 0))  # stands for the rendezvous store: never ended
    peer_listener = socket.create_server(("127.0.0.1", 0))
    to_store = socket.create_connection(store.getsockname())
    store_side, _ = store.accept()
    group = GroupSockets("127.0.0.1", str(store.getsockname()[1]))
    before = socket.create_connection(peer_listener.getsockname())  # made before forming: not the group's
    before_side, _ = peer_listener.accept()
    with group.forming():
        ours = socket.create_connection(peer_listener.getsockname())
        listener = socket.create_server(("127.0.0.1", 0))  # gloo's own listener: no peer, not tracked
        again = socket.create_connection(store.getsockname())  # a store connection: not tracked
    peer_side, _ = peer_listener.accept()
    again_side, _ = store.accept()
    assert len(group) == 1

    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(peer_side.recv(1)))
    reader.start()
    assert group.shut_down() == 1 and len(group) == 0
    reader.join(timeout=10)
    assert got == [b""]  # the peer read EOF although `ours` (the group's descriptor) is still open
    assert ours.fileno() >= 0 and os.fstat(ours.fileno())
    for sock, other in ((to_store, store_side), (again, again_side), (before, before_side)):
        sock.sendall(b"x")
        assert other.recv(1) == b"x"  # untouched
    for s in (store, peer_listener, to_store, store_side, before, before_side, ours, listener, again, peer_side,
              again_side):
        s.close()
