"""The launcher gives a torch script what torchrun gives it: environment, @record error files, output routing.

Real ranks, real torch where the feature is torch's (@record, torch's own `[rankN]:` prefix).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import wait_for

from taskd.launcher import STATUS_FAILED, STATUS_OK, LocalLauncher, WorkerSpec, command_for
from taskd.launcher.output import RankLog, RankLogError

WAIT = 60.0  # torch's import takes seconds on a loaded 2-core machine

RECORD_SCRIPT = textwrap.dedent(
    """
    import os
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        if os.environ["TASKD_RESTART_COUNT"] == "0":
            raise ValueError("bad batch 7")

    if __name__ == "__main__":
        main()
    """
)

PREFIX_SCRIPT = textwrap.dedent(
    """
    import torch.distributed as dist
    dist.init_process_group("gloo")  # installs torch's excepthook, which prefixes "[rank0]: "
    print("plain line", flush=True)
    raise RuntimeError("torch prefixed this")
    """
)

STREAMS_SCRIPT = textwrap.dedent(
    """
    import os, sys
    rank = os.environ["RANK"]
    print(f"out-{rank}", flush=True)
    print(f"err-{rank}", file=sys.stderr, flush=True)
    """
)

ENV_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    keys = ("TORCHELASTIC_RESTART_COUNT", "TASKD_RESTART_COUNT", "OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE")
    with open(os.path.join(sys.argv[1], f"env{os.environ['RANK']}-{os.environ['TASKD_RESTART_COUNT']}.json"), "w") as f:
        json.dump({k: os.environ.get(k) for k in keys}, f)
    """
)


@pytest.fixture
def launch(tmp_path: Path):
    made: list[LocalLauncher] = []

    def make(source: str, args: tuple[str, ...] = (), **kw) -> LocalLauncher:
        script = tmp_path / "rank.py"
        script.write_text(source)
        launcher = LocalLauncher(WorkerSpec(command_for(str(script), list(args)), **kw))
        made.append(launcher)
        return launcher

    yield make
    for launcher in made:
        launcher.close(grace=0.5)


def ended(launcher: LocalLauncher, status: int | None = None) -> None:
    def done() -> bool:
        entries = launcher.monitor([-1]).values()
        return all(e["status"] is not None and (status is None or e["status"] == status) for e in entries)

    wait_for(done, timeout=WAIT, what="ranks to end")
    for rank in range(launcher.spec.nproc_per_node):
        launcher.tail_log(rank)  # waits for the I/O thread to copy the last output


def test_record_error_file_becomes_the_root_cause(launch):
    before = time.time()
    launcher = launch(RECORD_SCRIPT, nproc_per_node=1, job_id="rec")
    launcher.start_all_worker()
    ended(launcher, STATUS_FAILED)
    error = launcher.error_report(0)
    assert error is not None, launcher.tail_log(0)
    assert error.exception == "ValueError: bad batch 7"
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert "raise ValueError" in error.traceback
    assert error.timestamp is not None and int(before) <= error.timestamp <= time.time() + 1
    assert error.lines()[0] == "ValueError: bad batch 7"
    assert error.path == launcher.error_file_path(0) and error.path.startswith(launcher.spec.run_dir)
    launcher.start_worker_list([0])  # the next incarnation succeeds: the old report must not survive it
    ended(launcher, STATUS_OK)
    assert launcher.error_report(0) is None


def test_torch_prefixed_lines_are_not_prefixed_again(launch, capsys):
    launcher = launch(PREFIX_SCRIPT, nproc_per_node=1, console=True)
    launcher.start_all_worker()
    ended(launcher, STATUS_FAILED)
    out = capsys.readouterr().out
    assert "[rank0]: plain line" in out
    assert "[rank0]: Traceback (most recent call last):" in out  # torch's prefix, kept once
    assert "RuntimeError: torch prefixed this" in out
    assert "[rank0]: [rank0]:" not in out


def test_symlink_planted_in_log_dir_is_refused(tmp_path: Path):
    log_dir = tmp_path / "shared"
    log_dir.mkdir()
    target = tmp_path / "victim"
    target.write_text("precious\n")
    (log_dir / "rank_1.log").symlink_to(target)
    spec = WorkerSpec([sys.executable, "-c", "print('x')"], nproc_per_node=2, log_dir=str(log_dir))
    with pytest.raises(RankLogError, match=r"rank_1\.log: it is a symbolic link"):
        LocalLauncher(spec)
    assert target.read_text() == "precious\n"
    os.mkfifo(log_dir / "rank_0.log.fifo")
    with pytest.raises(RankLogError, match="FIFO"):
        RankLog(str(log_dir / "rank_0.log.fifo"))  # does not block waiting for a reader


def test_rank_logs_are_0640_or_tighter(tmp_path: Path):
    loose = tmp_path / "rank_1.log"
    loose.write_text("old\n")
    loose.chmod(0o666)
    spec = WorkerSpec([sys.executable, "-c", "print('x')"], nproc_per_node=2, log_dir=str(tmp_path))
    with LocalLauncher(spec) as launcher:
        launcher.start_all_worker()
        ended(launcher, STATUS_OK)
    for name in ("rank_0.log", "rank_1.log"):
        mode = stat.S_IMODE(os.stat(tmp_path / name).st_mode)
        assert mode & ~0o640 == 0, f"{name}: {oct(mode)}"
    assert loose.read_text().startswith("old\n")  # appended, never truncated


def test_redirects_and_tee_route_each_stream(launch, tmp_path: Path, capsys):
    log_dir = tmp_path / "logs"
    # rank 0: both streams to the file only; rank 1: stderr to the file only;
    # rank 2: both to the file, stderr tee'd to the console too; rank 3: the default (console and file).
    launcher = launch(STREAMS_SCRIPT, nproc_per_node=4, console=True, log_dir=str(log_dir),
                      redirects={0: 3, 1: 2, 2: 3}, tee={2: 2})
    launcher.start_all_worker()
    ended(launcher, STATUS_OK)
    captured = capsys.readouterr()
    console = captured.out + captured.err
    assert "out-0" not in console and "err-0" not in console
    assert "[rank1]: out-1" in captured.out and "err-1" not in console
    assert "out-2" not in console and "[rank2]: err-2" in captured.err
    assert "[rank3]: out-3" in captured.out and "[rank3]: err-3" in captured.out  # one pipe: stdout, in order
    for rank in range(4):
        text = (log_dir / f"rank_{rank}.log").read_text()
        assert f"out-{rank}\n" in text and f"err-{rank}\n" in text  # the log file always has both
        assert launcher.tail_log(rank)[-2:] in ([f"out-{rank}", f"err-{rank}"], [f"err-{rank}", f"out-{rank}"])


def test_redirects_without_log_dir_keep_a_log_dir(launch, caplog):
    with caplog.at_level(logging.WARNING, logger="taskd.launcher"):
        launcher = launch(STREAMS_SCRIPT, nproc_per_node=1, console=True, redirects=3)
    log_dir = launcher.spec.log_dir
    assert log_dir and f"rank logs go to {log_dir}" in caplog.text
    launcher.start_all_worker()
    ended(launcher, STATUS_OK)
    launcher.close()
    assert "out-0" in (Path(log_dir) / "rank_0.log").read_text()  # kept after close, as torchrun's


def test_one_job_wide_restart_count(launch, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    launcher = launch(ENV_SCRIPT, (str(out),), nproc_per_node=2)

    def env(rank: int, own: int) -> dict:
        path = out / f"env{rank}-{own}.json"
        wait_for(path.exists, timeout=WAIT, what=path.name)
        ended(launcher)
        return json.loads(path.read_text())

    launcher.start_all_worker()
    assert env(0, 0)["TORCHELASTIC_RESTART_COUNT"] == env(1, 0)["TORCHELASTIC_RESTART_COUNT"] == "0"
    launcher.start_worker_list([1])  # a recover of rank 1: restart 1 of the job
    assert env(1, 1)["TORCHELASTIC_RESTART_COUNT"] == "1"
    launcher.start_all_worker()  # then a job rescheduling: every rank gets the job's count, 2
    assert env(0, 1)["TORCHELASTIC_RESTART_COUNT"] == env(1, 2)["TORCHELASTIC_RESTART_COUNT"] == "2"
    launcher.set_restart_count(7)  # the agent knows the job-wide count (other nodes' restarts too)
    launcher.start_worker_list([0])
    seen = env(0, 7)  # from then on TASKD_RESTART_COUNT is the job-wide count too, the same on every rank
    assert (seen["TORCHELASTIC_RESTART_COUNT"], seen["TASKD_RESTART_COUNT"]) == ("7", "7")
    assert seen["TORCHELASTIC_ERROR_FILE"] == launcher.error_file_path(0)
    with pytest.raises(ValueError, match="set_restart_count"):
        launcher.set_restart_count(-1)


def test_omp_num_threads_default_and_torchruns_warning_once(launch, monkeypatch, caplog, tmp_path: Path):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out = tmp_path / "out"
    out.mkdir()
    with caplog.at_level(logging.WARNING, logger="taskd.launcher"):
        launcher = launch(ENV_SCRIPT, (str(out),), nproc_per_node=2)
        launcher.start_all_worker()
        launcher.start_worker_list([0])
    warnings = [r.getMessage() for r in caplog.records if "OMP_NUM_THREADS" in r.getMessage()]
    assert len(warnings) == 1
    assert "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default" in warnings[0]
    wait_for(lambda: (out / "env1-0.json").exists(), timeout=WAIT, what="env1-0.json")
    ended(launcher)
    assert json.loads((out / "env1-0.json").read_text())["OMP_NUM_THREADS"] == "1"
    caplog.clear()
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with caplog.at_level(logging.WARNING, logger="taskd.launcher"):
        launch(ENV_SCRIPT, (str(out),), nproc_per_node=2)
    assert "OMP_NUM_THREADS" not in caplog.text
