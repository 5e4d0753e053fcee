"""Warm spares: an interpreter started ahead of time becomes the restarted rank, indistinguishable to the script."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from support import wait_for, written

from taskd.launcher import STATUS_FAILED, STATUS_OK, LocalLauncher, WorkerSpec, command_for, spares

SCRIPT = textwrap.dedent('''
    import json, os, sys, time
    out = sys.argv[1]
    mode = sys.argv[2]
    rank = os.environ["RANK"]
    record = {"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
              "restart": os.environ["TASKD_RESTART_COUNT"], "pid": os.getpid(), "stdin": sys.stdin.read(),
              "cwd": os.getcwd(), "join_after": os.environ.get("TASKD_JOIN_AFTER")}
    final = os.path.join(out, f"rank{rank}-{record['restart']}.json")
    with open(final + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(final + ".tmp", final)  # the test polls for the name: it must never see a half-written file
    print(f"rank {rank} restart {record['restart']} up", flush=True)
    if mode == "raise" and record["restart"] != "0":
        raise RuntimeError("boom from a spare")
    if mode == "exit3" and record["restart"] != "0":
        sys.exit(3)
    time.sleep(60)
''')


@pytest.fixture
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(spares, "REFILL_DELAY", 0.5)  # the refill after a restart is deferred; not 5 s here
    made = []

    def make(mode: str) -> LocalLauncher:
        script = tmp_path / "spare_probe.py"
        script.write_text(SCRIPT)
        (tmp_path / "out").mkdir(exist_ok=True)
        spec = WorkerSpec(command_for(str(script), [str(tmp_path / "out"), mode]), nproc_per_node=2,
                          log_dir=str(tmp_path / "logs"), warm_spares=1, cwd=str(tmp_path))
        made.append(LocalLauncher(spec))
        return made[-1]

    yield make
    for launcher in made:
        launcher.close(1.0)


def _record(tmp_path: Path, rank: int, restart: int) -> dict:
    return json.loads(written(tmp_path / "out" / f"rank{rank}-{restart}.json"))


def test_restarted_rank_runs_in_the_spare_like_a_fresh_interpreter(launcher, tmp_path: Path) -> None:
    la = launcher("sleep")
    assert la.start_all_worker() == 0
    ready = la._spares.pids()
    assert len(ready) == 1, "a spare is kept ready once the ranks run"
    first = _record(tmp_path, 1, 0)
    os.kill(la.pid(1), signal.SIGKILL)
    wait_for(lambda: la.monitor([1])[1]["status"] == STATUS_FAILED, what="rank 1 seen dead")
    assert la.start_worker_list([1]) == 0
    restarted = time.monotonic()
    pool = la._spares.pids()
    # not refilled at once (REFILL_DELAY after the restart): unless this thread was kept off the CPU that long
    assert pool == [] or time.monotonic() - restarted >= spares.REFILL_DELAY, "the pool refilled at once"
    assert la.pid(1) == ready[0], "the restarted rank is the spare"
    again = _record(tmp_path, 1, 1)
    assert again["pid"] == ready[0]
    for key in ("argv", "name", "file", "path0", "cwd"):
        assert again[key] == first[key], key
    assert again["name"] == "__main__" and again["stdin"] == ""
    wait_for(lambda: len(la._spares.pids()) == 1, what="the pool refilled after REFILL_DELAY")
    refilled = la._spares.pids()[0]
    assert refilled != ready[0]
    log = tmp_path / "logs" / "rank_1.log"  # the line reaches the log through the launcher's I/O thread
    wait_for(lambda: "rank 1 restart 1 up" in log.read_text(), what="the spare-run rank's output in its log")
    # the refilled spare is alive and becomes the next restarted rank: spawned from a thread that ended (a timer's),
    # its death signal had killed it at once
    os.kill(la.pid(1), signal.SIGKILL)
    wait_for(lambda: la.monitor([1])[1]["status"] == STATUS_FAILED, what="rank 1 seen dead again")
    assert la.start_worker_list([1]) == 0
    assert la.pid(1) == refilled, "the refilled spare became the rank"
    assert _record(tmp_path, 1, 2)["pid"] == refilled


@pytest.mark.parametrize("mode,code", [("raise", 1), ("exit3", 3)])
def test_spare_exit_codes_match_a_fresh_interpreter(launcher, tmp_path: Path, mode: str, code: int) -> None:
    la = launcher(mode)
    la.start_all_worker()
    _record(tmp_path, 0, 0)
    os.kill(la.pid(0), signal.SIGKILL)
    wait_for(lambda: la.monitor([0])[0]["status"] == STATUS_FAILED, what="rank 0 seen dead")
    la.start_worker_list([0])
    wait_for(lambda: la.monitor([0])[0]["status"] is not None, what="the spare-run rank to end")
    assert la.returncode(0) == code
    if mode == "raise":
        wait_for(lambda: "RuntimeError: boom from a spare" in "\n".join(la.tail_log(0)), what="the traceback")
    assert la.monitor([0])[0]["status"] != STATUS_OK


def test_close_leaves_no_spare(launcher, tmp_path: Path) -> None:
    la = launcher("sleep")
    la.start_all_worker()
    spare = la._spares.pids()[0]
    la.close(1.0)
    assert not psutil.pid_exists(spare) or psutil.Process(spare).status() == psutil.STATUS_ZOMBIE


def test_no_spares_for_other_executables(tmp_path: Path) -> None:
    spec = WorkerSpec(["sh", "-c", "sleep 30"], nproc_per_node=1, warm_spares=2)
    with LocalLauncher(spec) as la:
        la.start_all_worker()
        assert la._spares.pids() == [], "only `python -u script.py` entrypoints get spares"


def test_spare_that_died_idle_is_reaped_and_replaced(launcher, tmp_path: Path) -> None:
    la = launcher("sleep")
    assert la.start_all_worker() == 0
    dead = la._spares.pids()[0]
    os.kill(dead, signal.SIGKILL)
    os.kill(la.pid(1), signal.SIGKILL)
    wait_for(lambda: la.monitor([1])[1]["status"] == STATUS_FAILED, what="rank 1 seen dead")
    wait_for(lambda: psutil.Process(dead).status() == psutil.STATUS_ZOMBIE, what="the spare to die")
    assert la.start_worker_list([1]) == 0
    assert la.pid(1) != dead, "a dead spare never becomes a rank"
    assert _record(tmp_path, 1, 1)["pid"] == la.pid(1)
    assert not psutil.pid_exists(dead), "the dead spare is reaped, not left a zombie"
    wait_for(lambda: len(la._spares.pids()) == 1, what="the pool refilled after REFILL_DELAY")
    assert dead not in la._spares.pids()


def test_a_refill_scheduled_when_the_pool_closes_starts_nothing(tmp_path: Path) -> None:
    pool = spares.SparePool(1, dict(os.environ), str(tmp_path), refill_delay=0.2)
    pool.refill_later()
    pool.close()
    time.sleep(0.5)  # past the delay: the cancelled timer must not have started a spare
    assert pool.pids() == []


def test_a_negative_refill_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="refill_delay must be >= 0"):
        spares.SparePool(1, {}, None, refill_delay=-1)


@pytest.mark.parametrize("then", ["restart the rank", "restart every rank"])
def test_a_prepared_replacement_is_adopted_by_its_rank_start_or_discarded(tmp_path: Path, then: str) -> None:
    """Live (an agent-hosted store): a spare handed the dead rank 1 before any START runs the script at once, told
    to join the next generation; START_WORKER_LIST([1]) adopts that process, START_ALL_WORKER kills it first."""
    pytest.importorskip("torch")  # the agent-hosted store is torch's TCPStore
    script = tmp_path / "spare_probe.py"
    script.write_text(SCRIPT)
    (tmp_path / "out").mkdir()
    spec = WorkerSpec(command_for(str(script), [str(tmp_path / "out"), "sleep"]), nproc_per_node=2, warm_spares=1,
                      log_dir=str(tmp_path / "logs"), cwd=str(tmp_path), rdzv_store="agent", preimport="json")
    launcher = LocalLauncher(spec)
    try:
        assert launcher.live_recovery and launcher.start_all_worker() == 0
        _record(tmp_path, 1, 0)
        assert not launcher.prepare_replacement(1, 0)  # rank 1 still runs: nothing to replace
        os.kill(launcher.pid(1), signal.SIGKILL)
        wait_for(lambda: launcher.monitor([1])[1]["status"] is not None, 10, "rank 1's death to be seen")
        wait_for(lambda: launcher._spares.ready(), 30, "the warm spare")  # noqa: SLF001
        assert launcher.prepare_replacement(1, 0)
        prepared = _record(tmp_path, 1, 1)  # it runs before any START: the script's own first lines are done
        assert prepared["join_after"] == "0" and launcher.pid(1) != prepared["pid"]
        if then == "restart the rank":
            assert launcher.start_worker_list([1]) == 0
            assert launcher.pid(1) == prepared["pid"] and launcher.monitor([1])[1]["status"] is None  # adopted
        else:
            assert launcher.start_all_worker() == 0
            assert not psutil.pid_exists(prepared["pid"]) or psutil.Process(prepared["pid"]).status() == "zombie"
            assert launcher.pid(1) != prepared["pid"]  # a fresh incarnation, into the fresh group
    finally:
        launcher.close(1.0)
    if then == "restart the rank":
        assert not psutil.pid_exists(prepared["pid"])


STAGED = textwrap.dedent('''
    import json, os, sys, time
    from taskd import worker
    from taskd.worker.env import NotARankYet

    def dump(name, record):
        with open(name + ".tmp", "w") as fh:
            json.dump(record, fh)
        os.replace(name + ".tmp", name)

    out, mode = sys.argv[1], sys.argv[2]
    before = {"pid": os.getpid(), "time": time.time(), "argv": sys.argv, "spare": os.environ.get("TASKD_SPARE"),
              "rank_var": os.environ.get("RANK")}
    try:
        worker.rank()
    except NotARankYet as exc:
        before["rank_error"] = str(exc)
    dump(os.path.join(out, f"before-{os.getpid()}.json"), before)
    if mode == "forget" and "TASKD_SPARE" in os.environ:
        pass  # a script that never calls become_rank(): in a spare it ends here
    else:
        worker.become_rank()
        dump(os.path.join(out, f"rank{os.environ['RANK']}-{os.environ['TASKD_RESTART_COUNT']}.json"),
             {"pid": os.getpid(), "became": time.time(), "argv": sys.argv, "stdin": sys.stdin.read(),
              "spare": os.environ.get("TASKD_SPARE"), "rank": worker.rank(), "before": before})
        time.sleep(60)
''')


def _script_mode(tmp_path: Path, mode: str) -> LocalLauncher:
    script = tmp_path / "staged_probe.py"
    script.write_text(STAGED)
    (tmp_path / "out").mkdir(exist_ok=True)
    spec = WorkerSpec(command_for(str(script), [str(tmp_path / "out"), mode]), nproc_per_node=2, warm_spares=1,
                      warm_spare_mode="script", log_dir=str(tmp_path / "logs"), cwd=str(tmp_path))
    return LocalLauncher(spec)


def test_a_script_mode_spare_runs_the_script_up_to_become_rank_before_any_fault(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "7")  # an outer launcher's: a spare that is no rank must not inherit it
    la = _script_mode(tmp_path, "sleep")
    try:
        assert la.start_all_worker() == 0
        spare = la._spares.pids()[0]  # noqa: SLF001
        before = json.loads(written(tmp_path / "out" / f"before-{spare}.json"))  # done with no fault yet
        assert before["spare"] == "1" and before["rank_var"] is None
        assert "become_rank()" in before["rank_error"], "worker.rank() refuses to answer in a spare"
        first = _record(tmp_path, 1, 0)
        assert first["before"]["spare"] is None and "rank_error" not in first["before"]  # a rank: become_rank no-op
        killed = time.time()
        os.kill(la.pid(1), signal.SIGKILL)
        wait_for(lambda: la.monitor([1])[1]["status"] == STATUS_FAILED, what="rank 1 seen dead")
        assert la.start_worker_list([1]) == 0
        assert la.pid(1) == spare
        again = _record(tmp_path, 1, 1)
        assert again["pid"] == spare and again["before"]["time"] < killed < again["became"]
        assert again["rank"] == 1 and again["spare"] is None and again["stdin"] == ""
        assert again["argv"] == first["argv"] == before["argv"]
    finally:
        la.close(1.0)


def test_a_script_mode_spare_whose_script_never_calls_become_rank_is_replaced_by_a_fresh_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    la = _script_mode(tmp_path, "forget")
    try:
        assert la.start_all_worker() == 0
        spare = la._spares.pids()[0]  # noqa: SLF001
        wait_for(lambda: psutil.Process(spare).status() == psutil.STATUS_ZOMBIE, what="the spare to end")
        os.kill(la.pid(0), signal.SIGKILL)
        wait_for(lambda: la.monitor([0])[0]["status"] == STATUS_FAILED, what="rank 0 seen dead")
        with caplog.at_level("WARNING", logger="taskd.launcher.spares"):
            assert la.start_worker_list([0]) == 0
        assert la.pid(0) != spare and _record(tmp_path, 0, 1)["pid"] == la.pid(0)
        assert "ended (exit code 3) before it was given a rank" in caplog.text
        assert "ended in a warm spare before it called LiveGroup()" in caplog.text, "its own words are in the warning"
        assert not psutil.pid_exists(spare), "reaped"
    finally:
        la.close(1.0)
