"""bench/goodput.py's DLRover system without DLRover: the rule that skips it (and says why), the names its agent
leaves on the node and their removal, its command, and that its rank script runs no taskd code."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from support.bench import BENCH, load_bench

dlr = load_bench("goodput_dlrover")
VERSIONS = "VERSIONS " + json.dumps({"torch": "2.7.1+cpu", "dlrover": "0.6.1"})


def test_the_probe_says_why_the_system_cannot_run() -> None:
    assert "no DLRover venv (--dlrover-python PATH" in dlr.judge_probe("", 0, "")[0]
    assert "did not import DLRover within" in dlr.judge_probe("/v/python", None, "")[0]
    why, _ = dlr.judge_probe("/v/python", 1, "Traceback ...\nModuleNotFoundError: No module named 'kubernetes'\n")
    assert "cannot import DLRover's launcher" in why and "No module named 'kubernetes'" in why and "k8s" in why
    why, versions = dlr.judge_probe("/v/python", 0, VERSIONS.replace("0.6.1", "0.7.0"))
    assert "has DLRover 0.7.0, not 0.6.1" in why and versions["torch"] == "2.7.1+cpu"
    assert dlr.judge_probe("/v/python", 0, "a warning\n" + VERSIONS + "\n") == \
        (None, {"torch": "2.7.1+cpu", "dlrover": "0.6.1"})
    assert "does not exist" in dlr.probe(str(Path("/nonexistent/bin/python")))[0]


def test_the_python_is_the_flag_then_the_variable_then_the_default_venv(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setenv(dlr.ENV_PYTHON, "/from/env/python")
    assert dlr.find_python("/given/python") == "/given/python"
    assert dlr.find_python("") == "/from/env/python"
    monkeypatch.delenv(dlr.ENV_PYTHON)
    monkeypatch.setattr(dlr, "DEFAULT_PYTHON", tmp_path / "absent")
    assert dlr.find_python("") == ""  # none found: the system is off
    (tmp_path / "python").touch()
    monkeypatch.setattr(dlr, "DEFAULT_PYTHON", tmp_path / "python")
    assert dlr.find_python("") == str(tmp_path / "python")


def test_what_the_agent_leaves_is_found_by_the_job_name_and_removed(tmp_path: Path) -> None:
    shm, sock = tmp_path / "shm", tmp_path / "sock"
    name = dlr.job_name(Path("/x/dlrover-0-ref0"))
    assert name == f"taskd-bench-{os.getpid()}-dlrover-0-ref0"
    (sock / name).mkdir(parents=True)
    (sock / name / "sharedlock_shm_lock_0.sock").touch()
    (sock / "another-job").mkdir()
    shm.mkdir()
    for f in (f"{name}_ckpt_shm_0", f"{name}_ckpt_shm_1", "another-job_ckpt_shm_0"):
        (shm / f).touch()
    left = [str(shm / f"{name}_ckpt_shm_0"), str(shm / f"{name}_ckpt_shm_1"), str(sock / name)]
    assert dlr.residue(name, shm, sock) == left
    assert dlr.clean(name, shm, sock) == left  # what was there, for the run's record
    assert dlr.residue(name, shm, sock) == []
    assert sorted(p.name for p in shm.iterdir()) == ["another-job_ckpt_shm_0"]  # another job's are kept
    assert [p.name for p in sock.iterdir()] == ["another-job"]
    dlr.clean("another-job", shm, sock)
    assert not sock.exists()  # DLRover's parent directory goes once it is empty


def test_the_command_is_dlrover_run_standalone_of_the_rank_script() -> None:
    cmd = dlr.command("/v/python", 4, 100, 1, ["--steps", "10"])
    assert cmd == ["/v/python", "-m", "dlrover.trainer.torch.elastic_run", "--standalone", "--nproc-per-node", "4",
                   "--max-restarts", "100", str(BENCH / "dlrover_rank.py"), "--flash-every=1", "--steps", "10"]


def test_goodput_skips_the_system_with_the_reason(monkeypatch: Any, tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("BENCH_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["goodput.py", "--systems", "DLRover", "--dlrover-python", "/nonexistent/python"])
    goodput = load_bench("goodput")
    assert goodput.main() == 0
    data = json.loads((tmp_path / "goodput.json").read_text())
    assert data["systems"] == [] and data["runs"] == []
    assert "/nonexistent/python does not exist" in data["skipped"][goodput.DLROVER]
    assert f"skipped: {goodput.DLROVER}: /nonexistent/python does not exist" in capsys.readouterr().out


def test_the_rank_script_runs_no_taskd_code(monkeypatch: Any) -> None:
    """Its venv has torch 2.7 and no taskd: train_ddp.py's taskd imports must meet the script's stand-ins. Imported
    here with the real taskd out of sys.modules (and the repository on sys.path, where it would be found), then
    every module put back as it was."""
    pytest.importorskip("torch")
    saved = dict(sys.modules)
    try:
        for name in [n for n in sys.modules if n.split(".")[0] in ("taskd", "train_ddp", "peer_rank", "dlrover_rank")]:
            del sys.modules[name]
        monkeypatch.syspath_prepend(str(BENCH.parent))
        rank = load_bench("dlrover_rank")
        assert rank.taskd_stubbed(), [m for m in sys.modules if m.startswith("taskd")]
        assert sys.modules["train_ddp"].make_model is not None and rank.parse_args(
            ["--steps", "3", "--ckpt-every", "0", "--ckpt-dir", "c", "--out", "o"]).steps == 3
    finally:
        sys.modules.clear()
        sys.modules.update(saved)


def test_the_table_counts_what_a_launcher_left_on_the_node(monkeypatch: Any) -> None:
    monkeypatch.setattr(sys, "argv", ["goodput.py"])
    goodput, gv = load_bench("goodput"), load_bench("goodput_verdict")
    run = {"ok": True, "seconds": 60.0, "faults": [], "leftovers": [], "residue": ["/dev/shm/j_ckpt_shm_0", "/s/j"]}
    r = gv.row(goodput.DLROVER, True, [{"ok": True, "seconds": 50.0}], run, 300.0)
    assert r["residue"] == run["residue"] and goodput._leftovers(r) == "0 + 2 files"
    assert goodput._leftovers({**r, "residue": None}) == "0"
    assert goodput._leftovers({**r, "leftovers": None, "residue": None}) == "-"
