"""taskd.worker: rank info, heartbeats, sections and save requests between real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from support import wait_for
from support.worker import LAUNCHER_VARS

from taskd.worker import HeartbeatFile, HeartbeatFileError
from taskd.worker.heartbeat_file import SIZE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TIMEOUT = 20.0


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def stop_rank(rank: subprocess.Popen, hb: HeartbeatFile) -> None:
    """A test's cleanup, also when it failed half-way: no rank left running, the agent's mapping released."""
    if rank.poll() is None:
        rank.kill()
        rank.wait(TIMEOUT)
    hb.close()


def run_rank(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=clean_env(**env), text=True,
                          capture_output=True, timeout=TIMEOUT)


def test_heartbeat_and_section_are_noops_without_taskd():
    result = run_rank(
        """
        from taskd import worker
        worker.on_save_request(lambda: 1 / 0)
        worker.heartbeat(1)
        with worker.section("checkpoint", timeout=5):
            worker.heartbeat()
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_heartbeat_file_written_by_rank_read_by_agent(tmp_path):
    path = str(tmp_path / "rank_0.hb")
    hb = HeartbeatFile(path).create()
    state = hb.read()
    assert state.time == 0.0 and state.step is None and not state.started and state.deadline(5.0) is None
    before = time.time()
    result = run_rank(
        """
        import os
        from taskd import worker
        for step in range(8):
            worker.heartbeat(step)
        worker.heartbeat()  # keeps the last step
        print(os.getpid())
        """,
        TASKD_HEARTBEAT_FILE=path,
    )
    assert result.returncode == 0, result.stderr
    state = hb.read()
    assert state.step == 7 and state.beats == 9
    assert state.pid == int(result.stdout)
    assert before <= state.time <= time.time()
    assert state.section == "" and state.section_timeout is None
    assert state.deadline(10.0) == pytest.approx(state.time + 10.0)
    assert state.stack_signal == signal.SIGUSR2
    hb.close()


def test_section_recorded_and_cleared(tmp_path):
    path = str(tmp_path / "rank_0.hb")
    hb = HeartbeatFile(path).create()
    rank = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            """
            import sys
            from taskd import worker
            worker.heartbeat(3)
            with worker.section("checkpoint", timeout=42):
                with worker.section("evaluation"):
                    print("inner", flush=True); sys.stdin.readline()
                print("outer", flush=True); sys.stdin.readline()
            print("done", flush=True); sys.stdin.readline()
            """)],
        env=clean_env(TASKD_HEARTBEAT_FILE=path), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert rank.stdout.readline().strip() == "inner"
        inner = hb.read()
        assert inner.section == "evaluation" and inner.section_timeout is None and inner.step == 3
        assert inner.deadline(5.0) == pytest.approx(max(inner.time, inner.section_start) + 5.0)
        rank.stdin.write("\n")
        rank.stdin.flush()
        assert rank.stdout.readline().strip() == "outer"
        outer = hb.read()
        assert outer.section == "checkpoint" and outer.section_timeout == 42.0
        assert outer.deadline(5.0) == pytest.approx(outer.section_start + 42.0)
        assert outer.time >= inner.time  # leaving a section counts as a heartbeat
        rank.stdin.write("\n")
        rank.stdin.flush()
        assert rank.stdout.readline().strip() == "done"
        done = hb.read()
        assert done.section == "" and done.section_timeout is None and done.section_start is None
        rank.stdin.write("\n")
        rank.stdin.flush()
        assert rank.wait(TIMEOUT) == 0
    finally:
        stop_rank(rank, hb)


SAVER = """
import os, sys, time
from taskd import worker
out = sys.argv[1]
saves = []
def save():
    saves.append(step)
    open(os.path.join(out, f"saved{len(saves)}"), "w").write(str(step))
    return len(saves) != 2  # the second request reports failure
worker.on_save_request(save)
step = 0
while not os.path.exists(os.path.join(out, "stop")):
    step += 1
    worker.heartbeat(step)
    time.sleep(0.005)
"""


def test_save_request_round_trip(tmp_path):
    path = str(tmp_path / "rank_0.hb")
    hb = HeartbeatFile(path).create()
    rank = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path)], env=clean_env(TASKD_HEARTBEAT_FILE=path))
    try:
        wait_for(lambda: hb.read().beats > 0, what="first heartbeat")
        first = hb.request_save()
        assert first == 1
        state = hb.wait_save(first, timeout=TIMEOUT)
        assert state is not None and state.save_ack == 1 and state.save_ok
        assert (tmp_path / "saved1").exists()
        second = hb.request_save()
        state = hb.wait_save(second, timeout=TIMEOUT)
        assert state is not None and state.save_ack == 2 and not state.save_ok
        time.sleep(0.1)
        assert not (tmp_path / "saved3").exists()  # once per request
        (tmp_path / "stop").write_text("")
        assert rank.wait(TIMEOUT) == 0
    finally:
        stop_rank(rank, hb)


def test_save_request_without_callback_is_acknowledged_as_failed(tmp_path):
    path = str(tmp_path / "rank_0.hb")
    hb = HeartbeatFile(path).create()
    hb.request_save()
    result = run_rank("from taskd import worker\nworker.heartbeat(1)\n", TASKD_HEARTBEAT_FILE=path)
    assert result.returncode == 0, result.stderr
    state = hb.read()
    assert state.save_ack == 1 and not state.save_ok
    hb.close()


FAILING_STEP = """
import sys
from taskd import worker
worker.on_save_request(lambda: print("saved step 7", flush=True))
worker.heartbeat(7)
print("failing", flush=True)
sys.stdin.readline()
try:
    with worker.save_on_error(wait=float(sys.argv[1])):
        raise RuntimeError("Launch kernel failed: Default/AllReduce-op0")
except RuntimeError as exc:
    print("raised", exc, flush=True)
"""


@pytest.mark.parametrize("offered", [True, False], ids=["dump-offered", "dump-not-offered"])
def test_a_failed_step_serves_the_dump_save_request_on_its_own_thread(tmp_path, offered):
    """A step that raises where no heartbeat follows (a dead peer's collective): `save_on_error()` serves the
    save request on the training thread, waiting for it when the job offers dump (the request is made here
    0.3 s after the step failed); without dump offered it does not wait; the step's error goes on."""
    path = str(tmp_path / "rank_0.hb")
    hb = HeartbeatFile(path).create()
    env = clean_env(TASKD_HEARTBEAT_FILE=path, TASKD_STRATEGIES="dump,exit" if offered else "job-rescheduling,exit")
    rank = subprocess.Popen([sys.executable, "-c", FAILING_STEP, "10"], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert rank.stdout.readline().strip() == "failing"
        rank.stdin.write("\n")
        rank.stdin.flush()
        time.sleep(0.3)  # the step has failed; the agent's request comes later
        number = hb.request_save()
        if offered:
            state = hb.wait_save(number, timeout=TIMEOUT)
            assert state is not None and state.save_ok
            assert rank.stdout.readline().strip() == "saved step 7"
        assert rank.stdout.readline().strip() == "raised Launch kernel failed: Default/AllReduce-op0"
        assert rank.wait(TIMEOUT) == 0
        assert (hb.read().save_ack == number) is offered
    finally:
        stop_rank(rank, hb)


def test_stack_dump_signal_writes_python_stacks(tmp_path):
    path = str(tmp_path / "rank_0.hb")
    hb = HeartbeatFile(path).create()
    rank = subprocess.Popen(
        [sys.executable, "-c", "from taskd import worker\nimport time\nworker.heartbeat(1)\n"
                               "def stuck_here():\n    time.sleep(60)\nstuck_here()\n"],
        env=clean_env(TASKD_HEARTBEAT_FILE=path), stderr=subprocess.PIPE, text=True,
    )
    try:
        state = wait_for(lambda: (s := hb.read()).beats and s, what="heartbeat")
        os.kill(rank.pid, state.stack_signal)
        time.sleep(0.2)
        rank.kill()
        _, err = rank.communicate(timeout=TIMEOUT)
        assert "stuck_here" in err
    finally:
        stop_rank(rank, hb)


def test_heartbeat_dir_for_ranks_of_another_launcher(tmp_path):
    result = run_rank("from taskd import worker\nworker.heartbeat(11)\n", TASKD_HEARTBEAT_DIR=str(tmp_path),
                      RANK_ID="3", MS_WORKER_NUM="4")
    assert result.returncode == 0, result.stderr
    with HeartbeatFile(tmp_path / "rank_3.hb") as hb:
        assert hb.read().step == 11


def test_forked_child_does_not_beat(tmp_path):
    path = str(tmp_path / "rank_0.hb")
    result = run_rank(
        """
        import os
        from taskd import worker
        worker.heartbeat(1)
        pid = os.fork()
        if pid == 0:
            worker.heartbeat(999)
            os._exit(0)
        os.waitpid(pid, 0)
        """,
        TASKD_HEARTBEAT_FILE=str(HeartbeatFile(path).create().path),
    )
    assert result.returncode == 0, result.stderr
    with HeartbeatFile(path) as hb:
        assert hb.read().step == 1


def test_bad_heartbeat_files(tmp_path):
    with pytest.raises(HeartbeatFileError):
        HeartbeatFile(tmp_path / "missing").open()
    (tmp_path / "small").write_bytes(b"x")
    with pytest.raises(HeartbeatFileError):
        HeartbeatFile(tmp_path / "small").open()
    (tmp_path / "other").write_bytes(b"y" * SIZE)
    with pytest.raises(HeartbeatFileError):
        HeartbeatFile(tmp_path / "other").open()
    # a rank given a broken file keeps training without heartbeats
    result = run_rank("from taskd import worker\nworker.heartbeat(1)\nprint('ok')\n",
                      TASKD_HEARTBEAT_FILE=str(tmp_path / "other"))
    assert result.returncode == 0 and result.stdout.strip() == "ok"
    assert "heartbeats disabled" in result.stderr


def test_create_resets_a_mapped_file(tmp_path):
    path = tmp_path / "rank_0.hb"
    agent_view = HeartbeatFile(path).create().open()
    run_rank("from taskd import worker\nworker.heartbeat(5)\n", TASKD_HEARTBEAT_FILE=str(path))
    assert agent_view.read().step == 5
    HeartbeatFile(path).create()  # next incarnation
    assert agent_view.read().step is None and agent_view.read().time == 0.0
    agent_view.close()


