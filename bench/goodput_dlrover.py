"""bench/goodput.py's DLRover system: DLRover 0.6.1's `dlrover-run` with its Flash Checkpoint in memory.

Why a module of its own: DLRover 0.6.1 needs torch 2.7, so its job runs under the python of a venv of its own
(never taskd's), found here or skipped with the reason; and its agent leaves named objects on the node that the
bench must remove after every job. The venv, as bench/dlrover_peer.py's docstring has it, plus the `k8s` extra
(the standalone master imports `kubernetes` even on one node; without it `dlrover-run --standalone` falls back to
a torchrun mode that fails with "rendezvous backend 'dlrover-master' is not registered"):

    python3 -m venv /work/venv-dlrover
    /work/venv-dlrover/bin/pip install "dlrover[torch,k8s]==0.6.1" "torch==2.7.*" grpcio protobuf

The system: `python -m dlrover.trainer.torch.elastic_run` (= `dlrover-run`) `--standalone --nproc-per-node N
--max-restarts R` of bench/dlrover_rank.py (the example's job, plain DDP, `DdpCheckpointer.save_checkpoint(...,
StorageType.MEMORY)` every --snapshot-every steps: the same interval as taskd's snapshots system). Standalone, it
starts DLRover's local master (a subprocess) and its elastic agent, which holds the checkpoint's shared memory
and, when a rank fails, restarts every rank of the node (torch elastic's restart of the worker group); each
restores from that memory. DLRover finds a hang only by the collectives' timeout (--pg-timeout), as torchrun.

What its agent leaves after a job, even one that ended well (seen with 0.6.1): the shared memory
/dev/shm/<job>_ckpt_shm_<local rank> and the socket directory /tmp/ckpt_sock/<job>/; <job> is ELASTIC_JOB_NAME,
which the bench sets per job (`job_name`) so that it knows them, reports them ("residue") and removes them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from common import BENCH_DIR

DLROVER_RANK = BENCH_DIR / "dlrover_rank.py"
DEFAULT_PYTHON = Path("/work/venv-dlrover/bin/python")  # bench/dlrover_peer.py's venv
ENV_PYTHON = "BENCH_DLROVER_PYTHON"
WANT_DLROVER = "0.6.1"
SHM_DIR, SOCK_DIR = Path("/dev/shm"), Path("/tmp/ckpt_sock")
PROBE = ("import json, torch; from importlib.metadata import version; "
         "import dlrover.trainer.torch.flash_checkpoint.ddp, dlrover.trainer.torch.elastic_run, "
         "dlrover.python.master.local_master; "
         "print('VERSIONS ' + json.dumps({'torch': torch.__version__, 'dlrover': version('dlrover')}))")
INSTALL = f'`pip install "dlrover[torch,k8s]=={WANT_DLROVER}" "torch==2.7.*" grpcio protobuf` in a venv of its own'


def find_python(given: str) -> str:
    """The DLRover venv's python: --dlrover-python, else $BENCH_DLROVER_PYTHON, else the default venv if it exists;
    "" when none (the system is then skipped)."""
    if given:
        return given
    if os.environ.get(ENV_PYTHON):
        return os.environ[ENV_PYTHON]
    return str(DEFAULT_PYTHON) if DEFAULT_PYTHON.exists() else ""


def judge_probe(python: str, rc: int | None, output: str) -> tuple[str | None, dict[str, str]]:
    """Why the DLRover system cannot run with `python` (None: it can) and the versions its probe printed, from the
    probe's exit status (None: it did not end in time) and output."""
    if not python:
        return f"no DLRover venv (--dlrover-python PATH, ${ENV_PYTHON}, or {DEFAULT_PYTHON}): {INSTALL}", {}
    line = next((x for x in reversed(output.splitlines()) if x.startswith("VERSIONS ")), None)
    if rc is None:
        return f"{python} did not import DLRover within the probe's timeout", {}
    if rc != 0 or line is None:
        last = (output.strip().splitlines() or ["no output"])[-1]
        return f"{python} cannot import DLRover's launcher, master and Flash Checkpoint ({last}): {INSTALL}", {}
    versions = json.loads(line.split(" ", 1)[1])
    if versions.get("dlrover") != WANT_DLROVER:
        return f"{python} has DLRover {versions.get('dlrover')}, not {WANT_DLROVER}: {INSTALL}", versions
    return None, versions


def probe(given: str, timeout: float = 120.0) -> tuple[str | None, dict[str, str]]:
    """judge_probe of the python find_python picks, which imports what the system needs (a bounded wait)."""
    python = find_python(given)
    if not python:
        return judge_probe("", 0, "")
    if not Path(python).exists():
        return f"{python} does not exist: {INSTALL}", {}
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=timeout,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    except subprocess.TimeoutExpired:
        return judge_probe(python, None, "")
    return judge_probe(python, done.returncode, done.stdout + done.stderr)


def job_name(run_dir: Path) -> str:
    """ELASTIC_JOB_NAME of the job in `run_dir`: names its shared memory and sockets, unique per job and bench."""
    return f"taskd-bench-{os.getpid()}-{run_dir.name}"


def command(python: str, n: int, restarts: int, every: int, job: list[str]) -> list[str]:
    return [python, "-m", "dlrover.trainer.torch.elastic_run", "--standalone", "--nproc-per-node", str(n),
            "--max-restarts", str(restarts), str(DLROVER_RANK), f"--flash-every={every}", *job]


def residue(name: str, shm_dir: Path = SHM_DIR, sock_dir: Path = SOCK_DIR) -> list[str]:
    """What the job `name` left on the node: its shared memory segments and its socket directory."""
    shm = sorted(str(p) for p in shm_dir.glob(f"{name}_ckpt_shm_*")) if shm_dir.is_dir() else []
    return shm + ([str(sock_dir / name)] if (sock_dir / name).exists() else [])


def clean(name: str, shm_dir: Path = SHM_DIR, sock_dir: Path = SOCK_DIR) -> list[str]:
    """Remove residue(name) and return what it was (the run records it)."""
    left = residue(name, shm_dir, sock_dir)
    for path in left:
        if Path(path).is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            Path(path).unlink(missing_ok=True)
    try:
        sock_dir.rmdir()  # DLRover's own parent directory, once no job holds anything in it
    except OSError:
        pass  # absent, or another job's sockets are in it
    return left
