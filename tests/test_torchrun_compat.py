"""torchrun's launch lines under `taskd run`: change the word `torchrun`, nothing else.

The lines are parsed by torch's own parser too, so each is a line torchrun really accepts. The
end-to-end runs use a tiny script (no torch) so they stay fast; real-DDP lines live elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import STARTED

from taskd.run_config import RunConfig, add_run_arguments

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 90


def taskd_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskd run")
    add_run_arguments(parser)
    return parser


def torchrun_argv(line: str) -> list[str]:
    argv = shlex.split(line)
    assert argv[0] == "torchrun"
    return argv[1:]


@pytest.fixture(scope="module")
def torch_parser() -> argparse.ArgumentParser:
    run = pytest.importorskip("torch.distributed.run")
    return run.get_args_parser()


def test_every_torchrun_option_string_is_accepted(torch_parser: argparse.ArgumentParser) -> None:
    theirs = {s for a in torch_parser._actions for s in a.option_strings} - {"-h", "--help"}
    ours = {s for a in taskd_parser()._actions for s in a.option_strings}
    assert theirs - ours == set(), "torchrun flags taskd run does not accept"


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("print('hi')\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


LINES = {
    "standalone-module": "torchrun --standalone --nproc_per_node=4 -m pkg.train --epochs 1",
    "no-python": "torchrun --nproc-per-node 2 --no-python echo hello",
    "rdzv-endpoint": "torchrun --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=localhost:29411 "
                     "--rdzv-id=job9 train.py",
    "nnodes-range": "torchrun --nnodes 1:1 --nproc_per_node 2 train.py",
    "redirects-tee": "torchrun --nproc-per-node 2 --redirects 3 --tee 3 --log-dir logs train.py",
    "max-restarts": "torchrun --max_restarts=2 --monitor_interval=0.5 --nproc-per-node=2 train.py --lr 0.1",
    "underscores-mixed": "torchrun --nproc_per_node=2 --node-rank=0 --master_addr=127.0.0.1 --master-port=29533 "
                         "--max-restarts 1 --log_dir logs --local_ranks_filter=0 train.py",
}


@pytest.mark.parametrize("name", sorted(LINES))
def test_torchrun_line_parses_with_torchruns_meaning(name: str, pkg: Path,
                                                     torch_parser: argparse.ArgumentParser) -> None:
    argv = torchrun_argv(LINES[name])
    theirs = torch_parser.parse_args(argv)
    cfg = RunConfig.from_args(taskd_parser().parse_args(argv), {})
    assert cfg.script == theirs.training_script and list(cfg.script_args) == theirs.training_script_args
    assert cfg.nproc_per_node == int(theirs.nproc_per_node)
    assert cfg.nnodes == int(theirs.nnodes.split(":")[-1])
    if "max_restarts" in LINES[name] or "max-restarts" in LINES[name]:
        assert cfg.max_restarts == theirs.max_restarts
    if theirs.log_dir:
        assert cfg.log_dir == theirs.log_dir
    expected = {
        "standalone-module": lambda: cfg.standalone and cfg.server is None and cfg.entrypoint[-4:] == (
            "-m", "pkg.train", "--epochs", "1") and cfg.entrypoint[:2] == (sys.executable, "-u"),
        "no-python": lambda: cfg.entrypoint == ("echo", "hello"),
        "rdzv-endpoint": lambda: (cfg.master_addr, cfg.master_port, cfg.job_id) == ("localhost", 29411, "job9")
        and any("--rdzv-backend" in n for n in cfg.notices),
        "nnodes-range": lambda: (cfg.min_nnodes, cfg.nnodes) == (1, 1) and not cfg.notices,
        "redirects-tee": lambda: cfg.redirects == {0: 3, 1: 3} and cfg.tee == {0: 3, 1: 3},
        "max-restarts": lambda: (cfg.max_restarts, cfg.monitor_interval, cfg.script_args) == (2, 0.5, ("--lr", "0.1")),
        "underscores-mixed": lambda: (cfg.master_addr, cfg.master_port, cfg.max_restarts, cfg.log_dir,
                                      cfg.local_ranks_filter) == ("127.0.0.1", 29533, 1, "logs", frozenset({0})),
    }[name]
    assert expected(), cfg


# --- end to end: `taskd run` with torchrun-style lines -------------------------------------------

PROBE = """
import json, os, sys
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
out = os.path.join(sys.argv[1], "rank%s.json" % os.environ["RANK"])
with open(out, "w") as f:
    json.dump({k: os.environ.get(k) for k in keys} | {"argv": sys.argv[1:], "name": __name__}, f)
print("rank", os.environ["RANK"], "done", flush=True)
"""


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None,
        cmd: tuple[str, ...] = ("-m", "taskd.run")) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("SLURM_", "PET_", "MINDX_")) and k not in ("JOB_COMPLETION_INDEX",)}
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, *cmd, *args], cwd=cwd, env=full_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    STARTED.append(proc)
    out, _ = proc.communicate(timeout=TIMEOUT)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, None)


def ranks(out_dir: Path, world: int) -> dict[int, dict]:
    return {r: json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)}


def test_standalone_module_line_runs_a_package_made_in_tmp(tmp_path: Path) -> None:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    done = run(["--standalone", "--nproc_per_node=2", "-m", "mypkg.train", str(out)], tmp_path)
    assert done.returncode == 0, done.stdout
    got = ranks(out, 2)
    assert {r["name"] for r in got.values()} == {"__main__"}, "run as python -m, not imported"
    assert [got[r]["WORLD_SIZE"] for r in range(2)] == ["2", "2"]


def test_no_python_line_runs_the_command_as_is(tmp_path: Path) -> None:
    script = tmp_path / "probe.sh"
    script.write_text('#!/bin/sh\necho "$RANK $WORLD_SIZE" > "$1/rank$RANK.txt"\n')
    script.chmod(0o755)
    done = run(["--nproc-per-node", "2", "--no-python", str(script), str(tmp_path)], tmp_path,
               cmd=("-m", "taskd", "run"))
    assert done.returncode == 0, done.stdout
    assert sorted(p.read_text() for p in tmp_path.glob("rank*.txt")) == ["0 2\n", "1 2\n"]


def test_rdzv_endpoint_line_sets_master_addr_and_port_and_restarts(tmp_path: Path) -> None:
    script = tmp_path / "flaky.py"
    script.write_text(PROBE + "if os.environ['RANK'] == '1' and not os.path.exists(sys.argv[1] + '/crashed'):\n"
                      "    open(sys.argv[1] + '/crashed', 'w').close(); sys.exit(3)\n")
    line = ["--nnodes", "1:1", "--nproc_per_node=2", "--rdzv-backend=c10d", "--rdzv_endpoint=127.0.0.1:29467",
            "--max_restarts=2", "--monitor-interval", "0.2", str(script), str(tmp_path)]
    done = run(line, tmp_path)
    assert done.returncode == 0, done.stdout
    assert "notice: --rdzv-backend" in done.stdout
    got = ranks(tmp_path, 2)
    assert {(g["MASTER_ADDR"], g["MASTER_PORT"]) for g in got.values()} == {("127.0.0.1", "29467")}
    assert "fault: rank 1" in done.stdout


def test_redirects_tee_log_dir_line_keeps_rank_logs(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    logs = tmp_path / "D"
    done = run(["--nproc-per-node", "2", "--redirects", "3", "--tee", "3", "--log-dir", str(logs), str(script),
                str(tmp_path)], tmp_path)
    assert done.returncode == 0, done.stdout
    assert all("done" in (logs / f"rank_{r}.log").read_text() for r in range(2))


def test_slurm_step_values_reach_the_ranks(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    slurm = {"SLURM_JOB_ID": "777", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "localhost"}
    done = run(["--nproc-per-node", "2", str(script), str(tmp_path)], tmp_path, env=slurm)
    assert done.returncode == 0, done.stdout
    assert "from the environment: job_id=777 (SLURM_JOB_ID), nnodes=1 (SLURM_NNODES)" in done.stdout
    assert "job 777:" in done.stdout
    assert {g["MASTER_ADDR"] for g in ranks(tmp_path, 2).values()} == {"localhost"}


def test_sigkilled_rank_makes_taskd_exit_137(tmp_path: Path) -> None:
    """The documented exit-code rule: the failing rank's code, 128 + signal for a signal (torchrun exits 1)."""
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    done = run(["--nproc-per-node", "2", "--max_restarts=0", str(script)], tmp_path)
    assert done.returncode == 128 + signal.SIGKILL, done.stdout


def test_bad_flags_print_taskd_runs_usage(tmp_path: Path) -> None:
    for cmd in (("-m", "taskd"), ("-m", "taskd.run")):
        argv = ["run"] if cmd == ("-m", "taskd") else []
        unknown = run([*argv, "--no-such-flag", "x.py"], tmp_path, cmd=cmd)
        bad = run([*argv, "--nnodes", "0", "--nproc-per-node", "x", "missing.py"], tmp_path, cmd=cmd)
        for done in (unknown, bad):
            assert done.returncode == 2, done.stdout
            assert done.stdout.startswith("usage: taskd run"), done.stdout
        assert "--nnodes" in bad.stdout and "--nproc-per-node" in bad.stdout and "missing.py" in bad.stdout


# --- the cluster examples ------------------------------------------------------------------------

EXAMPLES = ROOT / "examples"


def test_slurm_example_is_valid_bash() -> None:
    for script in (EXAMPLES / "slurm").glob("*.sbatch"):
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        assert "taskd run --server" in script.read_text() and "taskd server" in script.read_text()


def _manifests() -> dict[str, list[dict]]:
    yaml = pytest.importorskip("yaml")
    return {p.name: list(yaml.safe_load_all(p.read_text())) for p in sorted((EXAMPLES / "k8s").glob("*.yaml"))}


def test_k8s_manifests_parse_and_fit_together() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for ds in _manifests().values() for d in ds}
    assert {("Secret", "taskd-token"), ("Deployment", "taskd-controller"), ("Service", "taskd-controller"),
            ("Service", "train"), ("Job", "train")} <= set(docs)
    job, headless = docs["Job", "train"], docs["Service", "train"]
    assert job["spec"]["completionMode"] == "Indexed" and headless["spec"]["clusterIP"] == "None"
    pod = job["spec"]["template"]
    assert pod["spec"]["subdomain"] == "train" and headless["spec"]["selector"].items() <= pod["metadata"][
        "labels"].items()
    # the controller mounts the admin token, the training pods only their job's credential (issue 19)
    for name, secret in ((("Job", "train"), "taskd-job-train-001"),
                         (("Deployment", "taskd-controller"), "taskd-token")):
        volumes = docs[name]["spec"]["template"]["spec"]["volumes"]
        assert [v["secret"] for v in volumes if "secret" in v] == [{"secretName": secret}]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["MINDX_TASK_ID"] == "train-001"  # the job the credential was minted for


def test_k8s_training_command_derives_node_rank_from_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES / "slurm")  # where train_ddp.py is
    job = next(d for ds in _manifests().values() for d in ds if d["kind"] == "Job")
    argv = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[:2] == ["taskd", "run"]
    cfg = RunConfig.from_args(taskd_parser().parse_args(argv[2:]), {"JOB_COMPLETION_INDEX": "1"})
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr, cfg.master_port) == (2, 1, "train-0.train", 29500)
    assert cfg.server == "taskd-controller:8899"


def test_pytorchjob_command_derives_everything_from_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES / "slurm")
    pj = next(d for ds in _manifests().values() for d in ds if d["kind"] == "PyTorchJob")
    argv = pj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "MASTER_ADDR": "train-pj-master-0", "MASTER_PORT": "23456",
           "RANK": "1", "WORLD_SIZE": "2", "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2"}
    cfg = RunConfig.from_args(taskd_parser().parse_args(argv[2:]), pod)
    assert (cfg.nnodes, cfg.node_rank, cfg.nproc_per_node, cfg.master_addr) == (2, 1, 2, "train-pj-master-0")


def test_redirects_keep_rank_output_off_the_console(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = run(["--nproc-per-node", "2", "-r", "3", "--log-dir", str(tmp_path / "D"), str(script), str(tmp_path)],
               tmp_path)
    assert done.returncode == 0, done.stdout
    assert "done" not in done.stdout.replace("finished", "")
    assert "rank 0 done" in (tmp_path / "D" / "rank_0.log").read_text()


def test_local_ranks_filter_keeps_other_ranks_off_the_console(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = run(["--nproc-per-node", "2", "--local-ranks-filter", "1", "--log-dir", str(tmp_path / "D"), str(script),
                str(tmp_path)], tmp_path)
    assert done.returncode == 0, done.stdout
    assert "[rank1]: rank 1 done" in done.stdout
    assert "rank 0 done" not in done.stdout, "rank 0 is filtered out of the console"
    assert "rank 0 done" in (tmp_path / "D" / "rank_0.log").read_text(), "its log keeps everything"


def config_errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 2, done.stdout
    assert "Traceback" not in done.stdout, done.stdout
    return [line for line in done.stdout.splitlines() if line.startswith("taskd run: error:")]


def test_planted_rank_log_link_is_a_config_error_and_nothing_starts(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    logs = tmp_path / "D"
    logs.mkdir()
    (logs / "rank_1.log").symlink_to(tmp_path / "elsewhere")
    errors = config_errors(run(["--nproc-per-node", "2", "--log-dir", str(logs), str(script), str(tmp_path)],
                               tmp_path))
    assert len(errors) == 1 and "rank_1.log" in errors[0] and "symbolic link" in errors[0], errors
    assert not list(tmp_path.glob("rank*.json")), "no rank started"


def test_bad_agent_variable_is_a_config_error_naming_it(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    errors = config_errors(run(["--nproc-per-node", "2", str(script), str(tmp_path)], tmp_path,
                               env={"TASKD_CONTROLLER_TIMEOUT": "soon"}))
    assert len(errors) == 1 and "TASKD_CONTROLLER_TIMEOUT" in errors[0], errors
    assert not list(tmp_path.glob("rank*.json")), "no rank started"


def test_worker_spec_local_ranks_filter() -> None:
    from taskd.launcher import WorkerSpec, WorkerSpecError

    spec = WorkerSpec(["true"], nproc_per_node=3, console=True, local_ranks_filter=[0, 2])
    assert spec.local_ranks_filter == frozenset({0, 2})
    assert [spec.console_streams(r) for r in range(3)] == [(True, True), (False, False), (True, True)]
    assert WorkerSpec(["true"], nproc_per_node=2, console=True).console_streams(1) == (True, True)
    for bad in ([], [-1], "0", [True]):
        with pytest.raises(WorkerSpecError, match="--local-ranks-filter"):
            WorkerSpec(["true"], nproc_per_node=2, local_ranks_filter=bad)
