"""LocalLauncher as a child subreaper: what a rank starts outside its process group does not outlive it.

Real ranks start real grandchildren that call setsid() (escaping the rank's group and
session); the tests kill ranks with real signals and look at the process table.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from support import wait_for, written

from taskd.launcher import STATUS_FAILED, LocalLauncher, WorkerSpec, command_for
from taskd.process import subreaper as launcher_process

# Escapee: leaves the rank's session, writes its pid, then sleeps, or exits once ESC_GO exists.
# ESC_TERM=ignore: it ignores SIGTERM; =record: it notes a SIGTERM in <path>.term and exits.
# ESC_KID=1: it starts a child of its own first.
ESCAPEE = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    os.setsid()
    if os.environ.get("ESC_TERM") == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("ESC_TERM") == "record":
        def on_term(*_):
            open(sys.argv[1] + ".term", "w").close()
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
    if os.environ.get("ESC_KID") == "1":
        kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        with open(sys.argv[1] + ".kid.tmp", "w") as f:
            f.write(str(kid.pid))
        os.rename(sys.argv[1] + ".kid.tmp", sys.argv[1] + ".kid")
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    go = os.environ.get("ESC_GO")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if go and os.path.exists(go):
            sys.exit(0)
        time.sleep(0.02)
    """
)

# A rank whose behaviour is chosen per global rank: TEST_MODE_<rank> =
#   escape          a direct child that calls setsid() and sleeps, then sleep
#   double          the same escapee, started through an intermediate that exits at once
#                   (so the escapee is re-parented while the rank is still alive), then sleep
#   orphans_exit:N  five double-forked escapees that exit at once, then wait for GO_RANK, exit N
#   sleep           just sleep
RANK = textwrap.dedent(
    """
    import os, subprocess, sys, time
    rank = os.environ["RANK"]
    mode = os.environ.get("TEST_MODE_" + rank, "sleep")
    out = os.environ["TEST_OUT"]
    escapee = os.path.join(out, "escapee.py")

    def double_fork(path, env=None):
        # The intermediate starts the escapee and exits: the escapee is orphaned at once.
        code = "import subprocess, sys; subprocess.Popen(sys.argv[1:]); sys.exit(0)"
        subprocess.run([sys.executable, "-c", code, sys.executable, escapee, path], env=env, check=True)

    if mode == "escape":
        subprocess.Popen([sys.executable, escapee, os.path.join(out, f"escapee{rank}")])
    elif mode == "double":
        double_fork(os.path.join(out, f"escapee{rank}"))
    elif mode.startswith("orphans_exit:"):
        env = dict(os.environ, ESC_GO=os.path.join(out, "now"))
        open(os.path.join(out, "now"), "w").close()
        for i in range(5):
            double_fork(os.path.join(out, f"orphan{rank}_{os.environ['TASKD_RESTART_COUNT']}_{i}"), env)
        go = os.path.join(out, f"go{rank}_{os.environ['TASKD_RESTART_COUNT']}")
        deadline = time.monotonic() + 120
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)
        sys.exit(int(mode.split(":")[1]))
    time.sleep(300)
    """
)


def read_pid(path: Path) -> int:
    return int(written(path))


def reaped(proc: psutil.Process) -> bool:
    """Gone from the process table: dead *and* reaped (a zombie still counts as running)."""
    return not proc.is_running()


def process_of(pid: int) -> psutil.Process | None:
    """The process, or None if it already exited and was reaped."""
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def our_zombies() -> list[int]:
    return [p.pid for p in psutil.Process().children() if _status(p) == psutil.STATUS_ZOMBIE]


def _status(proc: psutil.Process) -> str:
    try:
        return proc.status()
    except psutil.Error:
        return "gone"


@pytest.fixture
def make_launcher(tmp_path: Path):
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "escapee.py").write_text(ESCAPEE)
    made: list[LocalLauncher] = []

    def make(nproc: int = 2, modes: dict[int, str] | None = None, extra: dict[str, str] | None = None,
             **kw) -> LocalLauncher:
        env = {"TEST_OUT": str(tmp_path), **(extra or {})}
        env.update({f"TEST_MODE_{r}": m for r, m in (modes or {}).items()})
        spec = WorkerSpec(command_for(str(tmp_path / "rank.py")), nproc_per_node=nproc, extra_env=env)
        kw.setdefault("orphan_tick", 0.5)  # the default (5 s) would only make these tests wait
        launcher = LocalLauncher(spec, **kw)
        made.append(launcher)
        return launcher

    yield make
    for launcher in made:
        launcher.close(grace=0.5)


def test_killed_rank_takes_its_escaped_grandchild_with_it(make_launcher, tmp_path: Path) -> None:
    launcher = make_launcher(nproc=2, modes={0: "escape"})
    assert launcher.start_all_worker() == 0
    escapee = psutil.Process(read_pid(tmp_path / "escapee0"))
    assert os.getsid(escapee.pid) == escapee.pid  # it really left the rank's session and group
    other = launcher.pid(1)
    assert launcher.kill_worker([launcher.pid(0)]) == 0
    wait_for(lambda: reaped(escapee), what="escaped grandchild to be killed and reaped")
    assert launcher.monitor([0])[0]["status"] == STATUS_FAILED
    assert launcher.returncode(0) == -signal.SIGKILL
    assert launcher.monitor([1])[1]["status"] is None and launcher.pid(1) == other  # untouched
    assert psutil.Process(other).status() != psutil.STATUS_ZOMBIE


def test_rank_dying_by_itself_also_takes_its_escapee(make_launcher, tmp_path: Path) -> None:
    launcher = make_launcher(nproc=1, modes={0: "escape"})
    launcher.start_all_worker()
    escapee = psutil.Process(read_pid(tmp_path / "escapee0"))
    os.kill(launcher.pid(0), signal.SIGKILL)  # not through KILL_WORKER: the I/O thread sees the exit
    wait_for(lambda: reaped(escapee), what="escaped grandchild to be killed and reaped")


def test_close_leaves_no_descendant(make_launcher, tmp_path: Path) -> None:
    launcher = make_launcher(nproc=2, modes={0: "escape", 1: "double"},
                             extra={"ESC_TERM": "ignore", "ESC_KID": "1"})
    launcher.start_all_worker()
    procs = [psutil.Process(read_pid(tmp_path / name))
             for name in ("escapee0", "escapee0.kid", "escapee1", "escapee1.kid")]
    # the double-forked escapee is re-parented to us, not to init
    wait_for(lambda: procs[2].ppid() == os.getpid(), what="re-parenting to the launcher")
    launcher.close(grace=0.5)  # the escapees ignore SIGTERM: SIGKILL after the grace
    assert all(reaped(p) for p in procs)
    assert psutil.Process().children(recursive=True) == []


def test_close_gives_escapees_of_live_ranks_the_sigterm_grace(make_launcher, tmp_path: Path) -> None:
    launcher = make_launcher(nproc=2, modes={0: "escape", 1: "double"}, extra={"ESC_TERM": "record"})
    launcher.start_all_worker()
    procs = [psutil.Process(read_pid(tmp_path / f"escapee{r}")) for r in (0, 1)]
    launcher.close(grace=10.0)
    assert (tmp_path / "escapee0.term").exists()  # still its rank's child when close() began
    assert (tmp_path / "escapee1.term").exists()  # already an orphan of ours
    assert all(reaped(p) for p in procs)
    assert psutil.Process().children(recursive=True) == []


def test_escapee_that_exits_by_itself_is_reaped(make_launcher, tmp_path: Path) -> None:
    launcher = make_launcher(nproc=1, modes={0: "double"}, extra={"ESC_GO": str(tmp_path / "go")})
    launcher.start_all_worker()
    escapee = psutil.Process(read_pid(tmp_path / "escapee0"))
    wait_for(lambda: escapee.ppid() == os.getpid(), what="escapee to be re-parented to us")
    (tmp_path / "go").touch()
    wait_for(lambda: reaped(escapee), what="exited escapee to be reaped (not left a zombie)")
    assert launcher.monitor([0])[0]["status"] is None  # its rank lives on


def test_orphan_of_a_running_rank_survives_another_ranks_death(make_launcher, tmp_path: Path) -> None:
    launcher = make_launcher(nproc=2, modes={0: "escape", 1: "double"})
    launcher.start_all_worker()
    dies = psutil.Process(read_pid(tmp_path / "escapee0"))
    stays = psutil.Process(read_pid(tmp_path / "escapee1"))
    wait_for(lambda: stays.ppid() == os.getpid(), what="rank 1's escapee to be re-parented to us")
    launcher.kill_worker([launcher.pid(0)])
    wait_for(lambda: reaped(dies), what="rank 0's escapee to die")
    assert stays.is_running() and stays.status() != psutil.STATUS_ZOMBIE  # it carries rank 1's heartbeat path
    launcher.kill_worker([launcher.pid(1)])
    wait_for(lambda: reaped(stays), what="rank 1's escapee to die with rank 1")


def test_exit_codes_are_not_stolen_while_orphans_are_reaped(make_launcher, tmp_path: Path) -> None:
    exits: list[tuple[int, int, int]] = []
    launcher = make_launcher(nproc=2, modes={0: "orphans_exit:7", 1: "orphans_exit:3"},
                             on_exit=lambda *a: exits.append(a))
    for restart in range(3):
        assert launcher.start_worker_list([0, 1]) == 0
        pids = {0: launcher.pid(0), 1: launcher.pid(1)}
        orphans = [process_of(read_pid(tmp_path / f"orphan{r}_{restart}_{i}")) for r in (0, 1) for i in range(5)]
        wait_for(lambda: all(p is None or reaped(p) for p in orphans),  # noqa: B023
                 what="exited orphans to be reaped")
        for r in (0, 1):
            (tmp_path / f"go{r}_{restart}").touch()
        wait_for(lambda: all(launcher.returncode(r) is not None for r in (0, 1)), what="ranks to exit")
        assert launcher.returncode(0) == 7 and launcher.returncode(1) == 3
        wait_for(lambda: len(exits) == 2 * (restart + 1), what="on_exit callbacks")  # noqa: B023
        assert sorted(exits[-2:]) == [(0, pids[0], 7), (1, pids[1], 3)]
    wait_for(lambda: not our_zombies(), what="no zombie children")


def test_group_members_of_a_dead_rank_are_reaped_not_left_as_zombies(make_launcher, tmp_path: Path) -> None:
    # An in-group grandchild is re-parented to us too when its rank dies: it must be reaped by us.
    script = tmp_path / "grand.py"
    script.write_text(textwrap.dedent(
        f"""
        import subprocess, sys, time
        kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(tmp_path / 'kid')!r}, "w").write(str(kid.pid))
        time.sleep(300)
        """))
    with LocalLauncher(WorkerSpec(command_for(str(script)), nproc_per_node=1)) as launcher:
        launcher.start_all_worker()
        kid = psutil.Process(read_pid(tmp_path / "kid"))
        launcher.kill_worker([launcher.pid(0)])
        wait_for(lambda: reaped(kid), what="in-group grandchild to be killed and reaped")


def test_embedders_children_in_our_session_are_left_alone(make_launcher, tmp_path: Path) -> None:
    launcher = make_launcher(nproc=1, modes={0: "escape"})
    own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # like the agent's py-spy
    try:
        launcher.start_all_worker()
        escapee = psutil.Process(read_pid(tmp_path / "escapee0"))
        launcher.kill_worker([launcher.pid(0)])
        wait_for(lambda: reaped(escapee), what="escapee to die")
        launcher.close(grace=0.5)
        assert own.poll() is None  # neither killed nor reaped by the launcher
        own.kill()
        assert own.wait(20) == -signal.SIGKILL  # its exit status is still ours to collect
    finally:
        if own.poll() is None:
            own.kill()
            own.wait(20)


def test_opt_out_keeps_todays_behaviour(make_launcher, tmp_path: Path) -> None:
    if launcher_process.is_child_subreaper():
        pytest.skip("this test process is already a subreaper")
    launcher = make_launcher(nproc=1, modes={0: "escape"}, subreaper=False)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        launcher.start_all_worker()
        assert not launcher_process.is_child_subreaper()
        escapee = psutil.Process(read_pid(tmp_path / "escapee0"))
        rank_pid = launcher.pid(0)
        launcher.kill_worker([rank_pid])
        wait_for(lambda: launcher.returncode(0) is not None, what="rank to die")
        wait_for(lambda: escapee.ppid() != rank_pid, what="escapee to be re-parented")
        assert escapee.ppid() != os.getpid()  # went to init (or whatever reaper is above us)
        assert escapee.is_running() and escapee.status() != psutil.STATUS_ZOMBIE  # escaped, as before
        launcher.close(grace=0.5)
        assert other.poll() is None  # a child of ours in its own session is not touched either
        assert escapee.is_running()
    finally:
        for proc in (other,):
            if proc.poll() is None:
                proc.kill()
                proc.wait(20)
        try:
            escapee.kill()  # not our child: init reaps it
        except (psutil.Error, NameError):
            pass


def test_subreaper_is_on_while_open_and_restored_by_close(tmp_path: Path) -> None:
    if launcher_process.is_child_subreaper():
        pytest.skip("this test process is already a subreaper")
    spec = WorkerSpec([sys.executable, "-c", "pass"], nproc_per_node=1)
    first, second = LocalLauncher(spec), LocalLauncher(spec)
    assert launcher_process.is_child_subreaper()
    first.close()
    assert launcher_process.is_child_subreaper()  # the second still needs it
    second.close()
    assert not launcher_process.is_child_subreaper()


def test_without_prctl_the_launcher_carries_on(monkeypatch, tmp_path: Path, caplog) -> None:
    if launcher_process.is_child_subreaper():
        pytest.skip("this test process is already a subreaper")
    monkeypatch.setattr(launcher_process, "_prctl", None)  # as on a platform without prctl
    monkeypatch.setattr(launcher_process, "_subreaper_unavailable_logged", False)
    spec = WorkerSpec([sys.executable, "-c", "import sys; sys.exit(5)"], nproc_per_node=1)
    with caplog.at_level(logging.DEBUG, logger="taskd.process"):
        with LocalLauncher(spec) as launcher, LocalLauncher(spec):
            launcher.start_all_worker()
            wait_for(lambda: launcher.returncode(0) is not None, what="rank to exit")
            assert launcher.returncode(0) == 5
    assert caplog.text.count("cannot become a child subreaper") == 1


# `taskd run` end to end: a rank that leaves an escapee behind, then fails (restart 0) or
# sleeps until taskd run is stopped (ESCAPE_FAIL unset).
RUN_RANK = textwrap.dedent(
    """
    import os, subprocess, sys, time
    out = os.environ["TEST_OUT"]
    rank, restart = os.environ["RANK"], os.environ["TASKD_RESTART_COUNT"]
    path = os.path.join(out, f"escapee{rank}_{restart}")
    subprocess.Popen([sys.executable, os.path.join(out, "escapee.py"), path])
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    if os.environ.get("ESCAPE_FAIL") and restart == "0":
        sys.exit(1)
    if os.environ.get("ESCAPE_FAIL"):
        sys.exit(0)
    time.sleep(300)
    """
)


def taskd_run(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    (tmp_path / "rank.py").write_text(RUN_RANK)
    (tmp_path / "escapee.py").write_text(ESCAPEE)
    full_env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "MINDX_TASK_ID")}
    full_env.update(TEST_OUT=str(tmp_path), **env)
    root = Path(__file__).resolve().parents[3]
    return subprocess.Popen([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--quiet", *args,
                             str(tmp_path / "rank.py")], stdout=(tmp_path / "console.log").open("wb"),
                            stderr=subprocess.STDOUT, env=full_env, cwd=root)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_leftovers(pids: list[int]) -> None:
    """A failing test must not leave its escapees running (they are init's children then)."""
    for pid in pids:
        if alive(pid):
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def test_taskd_run_recovery_and_exit_leave_no_escapee(tmp_path: Path) -> None:
    proc = taskd_run(tmp_path, {"ESCAPE_FAIL": "1"}, "--nproc-per-node", "2", "--max-restarts", "2")
    try:
        assert proc.wait(timeout=120) == 0, (tmp_path / "console.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(20)
    pids = [int(p.read_text()) for p in tmp_path.glob("escapee*_*") if not p.name.endswith(".tmp")]
    try:
        assert len(pids) >= 3  # both ranks' first escapees and at least one restart's
        wait_for(lambda: not any(alive(p) for p in pids), what="every escapee to be gone")
    finally:
        kill_leftovers(pids)


def test_taskd_run_stopped_by_sigterm_leaves_no_escapee(tmp_path: Path) -> None:
    proc = taskd_run(tmp_path, {}, "--nproc-per-node", "2", "--stop-grace", "1")
    pids: list[int] = []
    try:
        pids = [read_pid(tmp_path / f"escapee{r}_0") for r in (0, 1)]
        assert all(alive(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        wait_for(lambda: not any(alive(p) for p in pids), what="every escapee to be gone")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(20)
        kill_leftovers(pids)
