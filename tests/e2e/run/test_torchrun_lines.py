"""The issue's torchrun launch lines, run for real: a DDP script over gloo, once under torchrun, once under taskd run.

Each line is one argument list; only the launcher word changes (`python -m torch.distributed.run`
or `python -m taskd run`). Both runs start in directories laid out alike (relative output and log
paths), must exit 0 and must leave bit-identical final weights (for the --max_restarts line only
taskd's run crashes a rank: torchrun 2.13's own restart is not reliable enough to be a reference).
A launcher that does not finish in time is killed with its ranks. Skipped without torch.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support import STARTED, free_port

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.run")

ROOT = Path(__file__).resolve().parents[3]
DDP = ROOT / "tests" / "torch_scripts" / "ddp_train.py"
TIMEOUT = 120  # a wait's bound, not an expectation: 2 ranks importing torch on a loaded 2-core machine
LAUNCHERS = {"torchrun": ("-m", "torch.distributed.run"), "taskd": ("-m", "taskd", "run")}


def launch(launcher: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PET_", "MINDX_", "TORCHELASTIC_", "TASKD_"))
           and k not in ("JOB_COMPLETION_INDEX", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, *LAUNCHERS[launcher], *argv], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    STARTED.append(proc)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its ranks (which hold the pipe open)
        out, _ = proc.communicate(timeout=10)
        pytest.fail(f"{launcher} {argv} did not finish within {TIMEOUT}s:\n{out}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, None)


def weights(path: Path) -> dict[str, object]:
    return torch.load(path, map_location="cpu", weights_only=True)


def run_both(tmp_path: Path, argv: list[str], setup: Callable[[Path], None] = lambda d: None,
             ) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """Run argv under both launchers in twin directories; assert rc 0 and identical final weights."""
    runs = {}
    for launcher in LAUNCHERS:
        cwd = tmp_path / launcher
        cwd.mkdir()
        setup(cwd)
        done = launch(launcher, argv, cwd)
        assert done.returncode == 0, f"{launcher} {argv}\n{done.stdout}"
        assert (cwd / "out" / "final.pt").exists(), f"{launcher} wrote no weights:\n{done.stdout}"
        runs[launcher] = (cwd, done)
    assert_same_weights(runs["taskd"][0], runs["torchrun"][0])
    return runs


def assert_same_weights(ours_dir: Path, theirs_dir: Path) -> None:
    ours, theirs = (weights(d / "out" / "final.pt") for d in (ours_dir, theirs_dir))
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), f"{key} differs between taskd run and torchrun"


def test_standalone_module_line(tmp_path: Path) -> None:
    def package(cwd: Path) -> None:
        (cwd / "pkg").mkdir()
        (cwd / "pkg" / "__init__.py").write_text("")
        shutil.copy(DDP, cwd / "pkg" / "train.py")

    run_both(tmp_path, ["--standalone", "--nproc_per_node=2", "-m", "pkg.train", "out"], package)


def test_no_python_line(tmp_path: Path) -> None:
    def shebang(cwd: Path) -> None:
        script = cwd / "train"
        script.write_text(f"#!{sys.executable}\n" + DDP.read_text())
        script.chmod(0o755)

    run_both(tmp_path, ["--nproc-per-node", "2", "--no-python", "./train", "out"], shebang)


def test_rdzv_endpoint_line(tmp_path: Path) -> None:
    port = free_port()
    run_both(tmp_path, ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-backend", "c10d", "--nnodes", "1",
                        "--nproc-per-node", "2", str(DDP), "out"])


def test_nnodes_range_line(tmp_path: Path) -> None:
    run_both(tmp_path, ["--nnodes", "1:1", "--nproc_per_node", "2", str(DDP), "out"])


def test_redirects_tee_log_dir_line(tmp_path: Path) -> None:
    runs = run_both(tmp_path, ["--redirects", "3", "--tee", "3", "--log-dir", "D", "--nproc-per-node", "2",
                               str(DDP), "out", "--steps", "3"])
    logs = {"taskd": lambda d, r: d / "D" / f"rank_{r}.log",  # torchrun: D/<run id>_<random>/attempt_0/<lr>/
            "torchrun": lambda d, r: next(d.glob(f"D/*/attempt_0/{r}/stdout.log"))}
    for launcher, (cwd, done) in runs.items():
        for rank in range(2):
            assert f"rank {rank}: step 3 loss" in logs[launcher](cwd, rank).read_text(), launcher
            assert f"rank {rank}: step 3 loss" in done.stdout, f"{launcher}'s console lacks the teed line"
            assert f"rank {rank}: done" in done.stdout, f"{launcher}'s console lacks the teed stderr line"
    assert "rank 1: done" in (runs["taskd"][0] / "D" / "rank_1.log").read_text(), "stderr kept in the log too"


def test_max_restarts_line_recovers_a_crashed_rank(tmp_path: Path) -> None:
    """Rank 1 exits 3 once under `taskd run`; the job restarts it and ends with the weights of torchrun's
    fault-free run of the same line.

    torchrun runs the line without the crash: its own restart of this job is unreliable in torch 2.13
    (under the static rendezvous the restarted ranks' gloo connectFullMesh is refused, 1 run in 3 here
    and 4 in 5 in the issue; with --standalone it hung for 120 s after rank 1 exited in one CI run),
    so torchrun's restart cannot be the reference; its fault-free result can.
    """
    line = ["--standalone", "--max_restarts=2", "--nproc-per-node", "2", str(DDP), "out"]
    dirs = {name: tmp_path / name for name in LAUNCHERS}
    for d in dirs.values():
        d.mkdir()
    ours = launch("taskd", [*line, "--crash-once"], dirs["taskd"])
    assert ours.returncode == 0, ours.stdout
    assert (dirs["taskd"] / "out" / "crashed").exists() and "crashing once" in ours.stdout, ours.stdout
    assert "fault: rank 1" in ours.stdout and "exited with code 3" in ours.stdout, ours.stdout
    theirs = launch("torchrun", line, dirs["torchrun"])
    assert theirs.returncode == 0, theirs.stdout
    assert_same_weights(dirs["taskd"], dirs["torchrun"])
