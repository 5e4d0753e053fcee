"""LocalLauncher with real processes: msrun's callback semantics, environment, logs, process hygiene."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
from support import wait_for

from taskd.launcher import (
    STATUS_FAILED,
    STATUS_NOT_STARTED,
    STATUS_OK,
    LocalLauncher,
    WorkerSpec,
    command_for,
    exit_code_of,
)

# A rank whose behaviour is chosen per global rank through the environment:
#   TEST_MODE_<rank> = exit:<code> | sleep | grandchild | ignore_term | env | print:<text>
RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    rank = os.environ["RANK"]
    mode = os.environ.get("TEST_MODE_" + rank, "sleep")
    out = os.environ.get("TEST_OUT", ".")
    print(f"hello from rank {rank} restart {os.environ['TASKD_RESTART_COUNT']}", flush=True)
    if mode.startswith("exit:"):
        print("exiting now", file=sys.stderr, flush=True)
        sys.exit(int(mode[5:]))
    if mode == "env":
        with open(os.path.join(out, f"env{rank}.json"), "w") as f:
            json.dump(dict(os.environ), f)
        sys.exit(0)
    if mode == "grandchild":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        with open(os.path.join(out, f"grandchild{rank}"), "w") as f:
            f.write(str(child.pid))
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(os.path.join(out, f"ready{rank}"), "w") as f:
            f.write("1")
    time.sleep(300)
    """
)

TIMEOUT = 20.0


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def make_launcher(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    made: list[LocalLauncher] = []

    def make(nproc: int = 2, modes: dict[int, str] | None = None, **kw) -> LocalLauncher:
        env = {"TEST_OUT": str(tmp_path)}
        env.update({f"TEST_MODE_{r}": m for r, m in (modes or {}).items()})
        kw.setdefault("job_id", "test-job")
        spec = WorkerSpec(command_for(str(script)), nproc_per_node=nproc, extra_env=env, **kw)
        launcher = LocalLauncher(spec)
        made.append(launcher)
        return launcher

    yield make
    for launcher in made:
        launcher.close(grace=0.5)


def test_never_started_is_status_200_short_entry(make_launcher):
    launcher = make_launcher(nproc=2)
    assert launcher.monitor([-1]) == {
        0: {"pid": None, "status": STATUS_NOT_STARTED, "global_rank": 0},
        1: {"pid": None, "status": STATUS_NOT_STARTED, "global_rank": 1},
    }


def test_statuses_running_ok_failed_and_invalid_rank(make_launcher):
    launcher = make_launcher(nproc=3, modes={0: "exit:0", 1: "exit:3", 2: "sleep"})
    assert launcher.start_all_worker() in (0, 1)  # fast-exiting ranks may already be gone
    wait_for(lambda: launcher.monitor([0, 1]).get(1, {}).get("status") == STATUS_FAILED
             and launcher.monitor([0])[0]["status"] == STATUS_OK, what="ranks 0 and 1 to end")
    entries = launcher.monitor([-1])
    assert entries[0]["status"] == STATUS_OK
    assert entries[1]["status"] == STATUS_FAILED  # exit code 3 also shows as 300
    assert entries[2]["status"] is None
    for rank, entry in entries.items():
        assert entry["local_rank"] == rank and entry["global_rank"] == rank and entry["node_id"] == 0
        assert isinstance(entry["pid"], int)
    assert launcher.returncode(1) == 3
    assert launcher.returncode(2) is None
    assert launcher.monitor([7]) == {}
    assert launcher.monitor([1, 99]).keys() == {1}


def test_killed_rank_is_300_and_raw_returncode_is_negative(make_launcher):
    launcher = make_launcher(nproc=2)
    assert launcher.start_all_worker() == 0
    pid = launcher.monitor([1])[1]["pid"]
    assert launcher.kill_worker([pid]) == 0
    wait_for(lambda: launcher.monitor([1])[1]["status"] == STATUS_FAILED, what="killed rank to show 300")
    assert launcher.returncode(1) == -signal.SIGKILL
    assert exit_code_of(launcher.returncode(1)) == 128 + signal.SIGKILL
    assert launcher.monitor([0])[0]["status"] is None  # the other rank is untouched


def test_kill_by_pid_kills_whole_group_including_grandchild(make_launcher, tmp_path):
    launcher = make_launcher(nproc=1, modes={0: "grandchild"})
    assert launcher.start_all_worker() == 0
    marker = tmp_path / "grandchild0"
    wait_for(lambda: marker.exists() and marker.read_text(), what="grandchild pid")
    grandchild = int(marker.read_text())
    rank_pid = launcher.pid(0)
    assert os.getpgid(grandchild) == rank_pid  # the rank leads its own group
    assert launcher.kill_worker([rank_pid]) == 0
    wait_for(lambda: gone(grandchild) and gone(rank_pid), what="rank and grandchild to die")


def test_rank_exit_kills_what_it_left_in_its_group(make_launcher, tmp_path):
    launcher = make_launcher(nproc=1, modes={0: "grandchild"})
    launcher.start_all_worker()
    marker = tmp_path / "grandchild0"
    wait_for(lambda: marker.exists() and marker.read_text(), what="grandchild pid")
    grandchild = int(marker.read_text())
    os.kill(launcher.pid(0), signal.SIGKILL)  # only the leader
    wait_for(lambda: gone(grandchild), what="orphaned grandchild to be killed")


def test_kill_all_and_unknown_pid(make_launcher, caplog):
    launcher = make_launcher(nproc=2)
    launcher.start_all_worker()
    with caplog.at_level(logging.WARNING, logger="taskd.launcher"):
        assert launcher.kill_worker([999999999]) == 0
    assert "999999999" in caplog.text
    assert launcher.monitor([-1])[0]["status"] is None
    assert launcher.kill_worker([-1]) == 0
    wait_for(lambda: all(e["status"] == STATUS_FAILED for e in launcher.monitor([-1]).values()),
             what="all ranks killed")


def test_start_worker_list_type_error_and_bad_ranks(make_launcher):
    launcher = make_launcher(nproc=2)
    for bad in (1, None, "0", {0: 1}):
        with pytest.raises(TypeError):
            launcher.start_worker_list(bad)
    assert launcher.start_worker_list([5]) == 1
    assert launcher.start_worker_list([]) == 0
    assert launcher.monitor([-1])[0]["status"] == STATUS_NOT_STARTED


def test_start_worker_list_restarts_only_listed_ranks(make_launcher):
    launcher = make_launcher(nproc=3)
    assert launcher.start_all_worker() == 0
    before = {r: e["pid"] for r, e in launcher.monitor([-1]).items()}
    launcher.kill_worker([before[1]])
    wait_for(lambda: launcher.monitor([1])[1]["status"] == STATUS_FAILED, what="rank 1 dead")
    assert launcher.start_worker_list([1]) == 0
    after = {r: e["pid"] for r, e in launcher.monitor([-1]).items()}
    assert after[0] == before[0] and after[2] == before[2]
    assert after[1] != before[1]
    assert launcher.restart_count(1) == 1 and launcher.restart_count(0) == 0
    assert all(e["status"] is None for e in launcher.monitor([-1]).values())


def test_start_all_worker_replaces_live_workers(make_launcher):
    launcher = make_launcher(nproc=2)
    assert launcher.start_all_worker() == 0
    old = [e["pid"] for e in launcher.monitor([-1]).values()]
    assert launcher.start_all_worker() == 0
    new = [e["pid"] for e in launcher.monitor([-1]).values()]
    assert set(old).isdisjoint(new)
    for pid in old:
        assert gone(pid)
    assert [launcher.restart_count(r) for r in (0, 1)] == [1, 1]


def test_spawn_failure_reports_failed_rank(tmp_path):
    spec = WorkerSpec([str(tmp_path / "no-such-program")], nproc_per_node=1)
    with LocalLauncher(spec) as launcher:
        # Either Popen itself fails (no setpriv: status 300 at once, pid None), or setpriv
        # starts and then cannot exec the program (exit 127 a moment later).
        assert launcher.start_all_worker() in (0, 1)
        wait_for(lambda: launcher.monitor([0])[0]["status"] == STATUS_FAILED, what="rank to fail")
        assert launcher.returncode(0) == 127
        assert any("no-such-program" in line for line in launcher.tail_log(0))


def test_environment_of_both_launchers(make_launcher, tmp_path):
    launcher = make_launcher(nproc=2, nnodes=2, node_rank=1, modes={2: "env", 3: "env"}, job_id="j42")
    launcher.start_all_worker()
    wait_for(lambda: all(e["status"] == STATUS_OK for e in launcher.monitor([-1]).values()), what="env ranks")
    port = str(launcher.spec.master_port)
    assert launcher.spec.master_port > 0
    for local in (0, 1):
        env = json.loads((tmp_path / f"env{2 + local}.json").read_text())
        expected = {
            "RANK_ID": str(2 + local), "RANK_SIZE": "4", "DEVICE_ID": str(local), "MS_WORKER_NUM": "4",
            "MS_NODE_ID": str(2 + local), "MS_ROLE": "MS_WORKER", "MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": port,
            "RANK": str(2 + local), "LOCAL_RANK": str(local), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RESTART_COUNT": "0",
            "TASKD_RESTART_COUNT": "0", "TASKD_JOB_ID": "j42", "PYTHONUNBUFFERED": "1",
            "TASKD_HEARTBEAT_FILE": launcher.heartbeat_path(local),
        }
        assert {k: env.get(k) for k in expected} == expected
        assert os.path.exists(env["TASKD_HEARTBEAT_FILE"])
    assert launcher.monitor([0])[0]["global_rank"] == 2 and launcher.monitor([0])[0]["node_id"] == 1


def test_logs_appended_across_restarts_with_headers(make_launcher, tmp_path):
    log_dir = tmp_path / "logs"
    launcher = make_launcher(nproc=1, modes={0: "exit:5"}, log_dir=str(log_dir))
    for attempt in range(3):
        launcher.start_worker_list([0])
        wait_for(lambda: launcher.monitor([0])[0]["status"] == STATUS_FAILED, what="rank to exit")
        assert launcher.tail_log(0) == [f"hello from rank 0 restart {attempt}", "exiting now"]
    path = launcher.log_path(0)
    assert path == str(log_dir / "rank_0.log")
    text = open(path).read()
    headers = [line for line in text.splitlines() if line.startswith("==== taskd: rank 0")]
    assert [h.split("start #")[1].split()[0] for h in headers] == ["0", "1", "2"]
    for attempt in range(3):
        assert f"hello from rank 0 restart {attempt}" in text
    assert text.index("restart 0") < text.index("start #1") < text.index("restart 1")


def test_console_output_is_rank_prefixed(make_launcher, capsys):
    launcher = make_launcher(nproc=2, modes={0: "exit:0", 1: "exit:0"}, console=True)
    launcher.start_all_worker()
    wait_for(lambda: all(e["status"] == STATUS_OK for e in launcher.monitor([-1]).values()), what="ranks to end")
    for r in (0, 1):
        launcher.tail_log(r)  # waits for the output to be copied
    out = capsys.readouterr().out
    assert "[rank0]: hello from rank 0 restart 0" in out
    assert "[rank1]: exiting now" in out


def test_exited_rank_is_reaped_without_monitor(make_launcher):
    exits: list[tuple[int, int, int]] = []
    launcher = make_launcher(nproc=1, modes={0: "exit:4"})
    launcher._on_exit = lambda *a: exits.append(a)
    launcher.start_all_worker()
    pid = launcher.pid(0)
    wait_for(lambda: exits, what="on_exit callback")
    assert exits == [(0, pid, 4)]
    with pytest.raises(psutil.NoSuchProcess):
        psutil.Process(pid)  # no zombie left behind


def test_close_leaves_nothing_even_if_sigterm_is_ignored(make_launcher, tmp_path):
    launcher = make_launcher(nproc=2, modes={0: "ignore_term", 1: "grandchild"})
    launcher.start_all_worker()
    wait_for(lambda: (tmp_path / "ready0").exists() and (tmp_path / "grandchild1").exists()
             and (tmp_path / "grandchild1").read_text(), what="ranks ready")
    pids = [launcher.pid(0), launcher.pid(1), int((tmp_path / "grandchild1").read_text())]
    run_dir = launcher.spec.run_dir
    launcher.close(grace=0.5)
    launcher.close(grace=0.5)  # idempotent
    for pid in pids:
        assert gone(pid)
    assert not psutil.Process().children(recursive=True)
    assert not os.path.exists(run_dir)
    with pytest.raises(RuntimeError):
        launcher.start_all_worker()


AGENT = textwrap.dedent(
    """
    import sys, time
    from taskd.launcher import LocalLauncher, WorkerSpec
    spec = WorkerSpec([sys.executable, "-c", "import time; time.sleep(300)"], nproc_per_node=2)
    launcher = LocalLauncher(spec)
    assert launcher.start_all_worker() == 0
    print(" ".join(str(launcher.pid(r)) for r in range(2)), flush=True)
    time.sleep(300)
    """
)


def test_ranks_die_with_their_agent():
    agent = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    try:
        line = agent.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2 and all(not gone(p) for p in pids)
        agent.kill()
        agent.wait(TIMEOUT)
        wait_for(lambda: all(gone(p) for p in pids), what="ranks to die with the agent")
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(TIMEOUT)


def test_restart_right_after_kill_does_not_overlap_incarnations(make_launcher, caplog):
    launcher = make_launcher(nproc=1)
    launcher.start_all_worker()
    old = launcher.pid(0)
    launcher.kill_worker([old])
    with caplog.at_level(logging.WARNING, logger="taskd.launcher"):
        assert launcher.start_worker_list([0]) == 0
    assert "still running" not in caplog.text
    assert gone(old) and launcher.pid(0) != old


def test_output_without_newlines_still_reaches_the_log(tmp_path):
    spec = WorkerSpec([sys.executable, "-c", "import sys; sys.stdout.write('x' * 200000); sys.stdout.flush()"],
                      nproc_per_node=1, log_dir=str(tmp_path))
    with LocalLauncher(spec) as launcher:
        launcher.start_all_worker()
        wait_for(lambda: launcher.monitor([0])[0]["status"] == STATUS_OK, what="rank to end")
        tail = launcher.tail_log(0, n=10)
        assert sum(len(line) for line in tail) == 200000
    assert open(tmp_path / "rank_0.log").read().count("x") == 200000
