"""Live recovery beyond the dead rank's gloo neighbours: every survivor leaves the broken group together.

With 4+ ranks only the dead rank's neighbours get "Connection closed by peer"; the others wait on
live connections to those neighbours. A rank that leaves therefore shuts down its group's
connections (taskd.worker.torch_group), so the failure runs along the ring instead of every far
rank waiting out the collective timeout.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from test_live_e2e import SMALL, assert_identical, reference4, resumed_after, start_pids, summary, taskd_run  # noqa: E402

from taskd.worker import CheckpointManager  # noqa: E402
from taskd.worker.checkpoint import HOLD_SECONDS  # noqa: E402
from taskd.worker.live import ErrorKind, write_control  # noqa: E402
from taskd.worker.torch_group import GroupSockets, LeaveWatch  # noqa: E402

pytestmark = pytest.mark.torch

WORLD = 4
PG_TIMEOUT = 60.0  # a far rank that waited for it would report COLLECTIVE_TIMEOUT and resume after it
ARGS = [*SMALL[:SMALL.index("--pg-timeout")], "--pg-timeout", str(PG_TIMEOUT)]  # the reference's job (reference4)


def run(tmp, extra: list[str] = ()) -> tuple[int, str]:  # noqa: ANN001 (a Path)
    return taskd_run(tmp, args=[*ARGS, "--ckpt-dir", str(tmp / "ckpt"), "--out", str(tmp / "out"), *extra],
                     nproc=WORLD)


def test_sigkill_with_four_ranks_every_survivor_learns_from_a_closed_connection(tmp_path, tmp_path_factory):
    reference = reference4(tmp_path_factory)

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


def test_leave_watch_ends_the_generation_the_agent_says_is_over_and_nothing_else(tmp_path):
    """Issue 20 item 2: the agent writes `leave g` the moment it sees a rank of the group gone; each rank's
    LeaveWatch then ends its connections of g at once (its own blocked collective fails), not when the
    failure reaches it along the ring. A retry keeps the group; an older generation's leave is not ours."""
    listener = socket.create_server(("127.0.0.1", 0))
    opened = [listener]
    control = tmp_path / "control.json"
    group = GroupSockets()
    ended: list[tuple[int, str, int]] = []
    watch = LeaveWatch(str(control), group, interval=0.002,
                       on_end=lambda n, c: ended.append((n, c.action, c.generation))).start()

    def form(generation: int) -> socket.socket:
        with group.forming(generation=generation):
            opened.append(socket.create_connection(listener.getsockname()))
        theirs, _ = listener.accept()  # the peer's end (another process's, in a real group): not tracked
        opened.append(theirs)
        theirs.settimeout(10)
        return theirs

    try:
        theirs = form(3)
        for generation, action in ((2, "leave"), (4, "retry"), (3, "rejoin")):
            write_control(control, generation, action)
            assert not wait_until(lambda: ended, 0.3), f"{action} {generation} must keep generation 3's connections"
        ckpt = CheckpointManager(tmp_path / "ckpt")
        ckpt.save_async({"step": 0}, 0).result(HOLD_SECONDS + 10)  # past a hold an earlier test may have left
        assert ckpt.save_async({"step": 1}, 1).result(HOLD_SECONDS / 2)  # nothing held a background save so far
        write_control(control, 3, "leave")
        assert wait_until(lambda: ended, 10), "leave 3 did not end generation 3's connections"
        assert ended == [(1, "leave", 3)] and len(group) == 0
        assert theirs.recv(1) == b"", "the peer must read EOF: its collective fails at once"
        held = ckpt.save_async({"step": 2}, 2)  # the recovery has begun: a background save waits it out
        started = time.monotonic()
        ckpt.save({"step": 3}, 3)  # a blocking save is never held
        assert time.monotonic() - started < HOLD_SECONDS / 2
        assert not wait_until(held.done, HOLD_SECONDS / 4), "a background save ran during the recovery"
        assert held.result(HOLD_SECONDS + 10) == ckpt.path_for(2)  # the hold lapses by itself
        form(4)  # the next generation, while `leave 3` is still the file's word
        assert not wait_until(lambda: len(ended) > 1, 0.3), "leave 3 must not end generation 4"
        write_control(control, 5, "rejoin")  # the agent names the next generation: 4 is over too
        assert wait_until(lambda: len(ended) > 1, 10) and ended[1] == (1, "rejoin", 5)
    finally:
        watch.stop()
        for s in opened:
            s.close()


def test_a_generation_the_agent_ended_while_it_formed_is_ended_once_formed(tmp_path):
    """The agent writes `leave g` while the rank still forms g (the file's change came before g's connections
    existed): the rank's watch, asleep in inotify until the next change, would look again only when idle. The
    thread that formed g checks the file the moment g is formed (GroupSockets.on_formed); idle 60 s here, so
    nothing else can end g within the test's 10 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    control = tmp_path / "control.json"
    group = GroupSockets()
    ended: list[tuple[int, str, int]] = []
    watch = LeaveWatch(str(control), group, interval=0.002, idle=60.0,
                       on_end=lambda n, c: ended.append((n, c.action, c.generation))).start()
    opened = [listener]
    try:
        with group.forming(generation=7):
            opened.append(socket.create_connection(listener.getsockname()))
            write_control(control, 7, "leave")  # said while g is forming: the watch looks, finds nothing held
            time.sleep(0.3)  # and sleeps again
        theirs, _ = listener.accept()
        opened.append(theirs)
        theirs.settimeout(10)
        assert ended == [(1, "leave", 7)] and len(group) == 0, ended  # at once, on the forming thread
        assert theirs.recv(1) == b""
    finally:
        watch.stop()
        for s in opened:
            s.close()


def wait_until(predicate, timeout: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return bool(predicate())


def start_two_live_ranks(tmp_path, script: str) -> tuple[object, list[subprocess.Popen]]:  # noqa: ANN001
    """Two LiveGroup ranks running ``script`` with control files control0/1.json, each past its READY line (the
    store is returned to be kept alive)."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, world_size=2, is_master=True, wait_for_workers=False)
    procs = []
    for r in (0, 1):
        env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(store.port), "TASKD_CONTROL_FILE": str(tmp_path / f"control{r}.json")}
        env.pop("TASKD_HEARTBEAT_FILE", None)
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    for p in procs:
        line = p.stdout.readline()
        if not line.startswith("READY"):
            for q in procs:
                q.kill()
            raise AssertionError(line + (p.stdout.read() if p.poll() is not None else ""))
    return store, procs


BLOCKED_RANK = """
import os, sys, time, torch, torch.distributed as dist
from taskd.worker.torch import LiveGroup
live = LiveGroup(backend="gloo", timeout=60.0)
print("READY", flush=True)
if dist.get_rank() == 1:
    time.sleep(60)   # alive, holding its connections, never joining the collective
    sys.exit(0)
t0 = time.monotonic()
try:
    dist.all_reduce(torch.ones(4))
    print("RETURNED", flush=True)
except Exception as exc:  # noqa: BLE001
    print(f"FAILED {time.monotonic() - t0:.3f} {type(exc).__name__}", flush=True)
"""


def test_a_rank_blocked_on_a_live_peer_leaves_its_group_when_the_agent_says_so(tmp_path):
    """The far rank's case, with nothing else to wake it: its peer is alive and silent, so no connection
    closes; only the agent's `leave 0` can end rank 0's all_reduce before the 60 s collective timeout."""
    store, procs = start_two_live_ranks(tmp_path, BLOCKED_RANK)
    try:
        time.sleep(0.5)  # rank 0 is now blocked in its all_reduce (nothing can be awaited from outside it)
        assert procs[0].poll() is None
        write_control(tmp_path / "control0.json", 0, "leave")
        out, _ = procs[0].communicate(timeout=20)
        assert "FAILED" in out and "RETURNED" not in out, out
        took = float(out.split("FAILED ")[1].split()[0])
        assert took < 30, f"rank 0 waited {took:.1f}s: the collective timeout, not the agent's word\n{out}"
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


LEFT_BLOCKED_RANK = """
import sys, time
from taskd.worker import torch_stuck
from taskd.worker.torch import LiveGroup
torch_stuck.STUCK_AFTER = 1.0
live = LiveGroup(backend="gloo", timeout=60.0)
print("READY", flush=True)
live.mark.enter()  # inside a collective, as in DDP's backward
if live.rank == 0:
    time.sleep(30)  # blocked without CPU, as on the receive gloo does not wake when its connection fails
    print("WOKE", flush=True)
else:
    t0 = time.monotonic()
    while time.monotonic() - t0 < 4:  # a backward still computing after the group's connections were ended
        sum(i * i for i in range(10_000))
    print("COMPUTED", flush=True)
"""


def test_a_rank_left_blocked_in_its_broken_group_exits_and_one_still_computing_does_not(tmp_path):
    """torch_stuck: after the agent's `leave` has ended the group's connections, a rank that stays inside its
    collective while its process uses no CPU ends itself with STUCK_EXIT (here after 1 s), where it would wait out
    the 60 s collective timeout; a rank inside backward that still computes is left to finish."""
    from taskd.worker.torch_stuck import STUCK_EXIT

    store, procs = start_two_live_ranks(tmp_path, LEFT_BLOCKED_RANK)
    try:
        told = time.monotonic()
        for r in (0, 1):
            write_control(tmp_path / f"control{r}.json", 0, "leave")
        stuck, _ = procs[0].communicate(timeout=20)
        took = time.monotonic() - told
        assert procs[0].returncode == STUCK_EXIT, stuck
        assert "rank 0: still blocked in a collective" in stuck and "WOKE" not in stuck, stuck
        assert 1.0 <= took < 10, f"ended {took:.1f}s after the agent's word"
        computing, _ = procs[1].communicate(timeout=20)
        assert procs[1].returncode == 0 and "COMPUTED" in computing, computing
        assert "still blocked" not in computing, computing
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_a_rank_that_leaves_on_its_own_holds_background_saves_too(tmp_path):
    """A survivor whose own collective failed first leaves before the agent's word reaches its watch: ending the
    group's connections (GroupSockets.shut_down, LiveGroup._leave) holds a background checkpoint write as well."""
    listener = socket.create_server(("127.0.0.1", 0))
    group = GroupSockets()
    with group.forming(generation=1):
        ours = socket.create_connection(listener.getsockname())
    theirs, _ = listener.accept()
    try:
        ckpt = CheckpointManager(tmp_path / "ckpt")
        ckpt.save_async({"step": 0}, 0).result(HOLD_SECONDS + 10)  # past a hold an earlier test may have left
        assert ckpt.save_async({"step": 1}, 1).result(HOLD_SECONDS / 2)  # not held before
        assert group.shut_down() == 1
        held = ckpt.save_async({"step": 2}, 2)
        assert not wait_until(held.done, HOLD_SECONDS / 4), "a background save ran during the recovery"
        assert held.result(HOLD_SECONDS + 10) == ckpt.path_for(2)
        group.release()  # an orderly end (LiveGroup.close): nothing is held
        assert ckpt.save_async({"step": 3}, 3).result(HOLD_SECONDS / 2)
    finally:
        for s in (listener, ours, theirs):
            s.close()
