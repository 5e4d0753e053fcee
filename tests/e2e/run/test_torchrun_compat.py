"""torchrun's launch lines under `taskd run`: change the word `torchrun`, nothing else.

The lines are parsed by torch's own parser too, so each is a line torchrun really accepts. The
end-to-end runs use a tiny script (no torch) so they stay fast; real-DDP lines live elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from support import EXAMPLES, ROOT, STARTED, free_port

TIMEOUT = 90


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
    port = free_port()  # a fixed port collides with a parallel job's
    line = ["--nnodes", "1:1", "--nproc_per_node=2", "--rdzv-backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
            "--max_restarts=2", "--monitor-interval", "0.2", str(script), str(tmp_path)]
    done = run(line, tmp_path)
    assert done.returncode == 0, done.stdout
    assert "notice: --rdzv-backend" in done.stdout
    got = ranks(tmp_path, 2)
    assert {(g["MASTER_ADDR"], g["MASTER_PORT"]) for g in got.values()} == {("127.0.0.1", str(port))}
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


def test_sigkilled_rank_makes_taskd_exit_109_never_137(tmp_path: Path) -> None:
    """The documented exit-code rule: the failing rank's code, 100 + signal for a signal (torchrun exits 1); 137
    would read, to a Kubernetes podFailurePolicy, as `taskd run` itself SIGKILLed (issue 32, item 8)."""
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    done = run(["--nproc-per-node", "2", "--max_restarts=0", str(script)], tmp_path)
    assert done.returncode == 100 + signal.SIGKILL, done.stdout
    assert "exit code 109" in done.stdout, done.stdout


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



def test_slurm_example_is_valid_bash() -> None:
    for script in (EXAMPLES / "slurm").glob("*.sbatch"):
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        text = script.read_text()
        assert "exec taskd run --nnodes" in text and '--server "$head:$port"' in text and "taskd server" in text
        assert "TASKD_SPARES" in text and "--standby" in text  # the spare nodes of an N+S allocation


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


