"""Values `taskd run` takes from its environment when the flags are absent.

Sources, first match wins for each setting (flags always win over all of them):

1. torchrun's own `PET_<FLAG>` variables (torchrun reads them for every flag; Kubeflow's
   PyTorchJob sets PET_NNODES, PET_NODE_RANK and PET_NPROC_PER_NODE);
2. taskd's `MINDX_TASK_ID` and `MINDX_SERVER_IP` (TaskD's names, as under msrun);
3. Slurm (`srun taskd run ...`, one task per node);
4. Kubernetes: an indexed Job / JobSet (`JOB_COMPLETION_INDEX`), or the PyTorchJob
   convention (`MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`) inside a pod.

Pure functions of a mapping, so tests pass a dict and need no cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from taskd.run_config.nodelist import first_host
from taskd.settings import RUN_SETTINGS

# torchrun flags whose default torchrun reads from PET_<DEST> (torch/distributed/argparse_util.py).
PET_VALUE_FLAGS = (
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "max_restarts",
    "monitor_interval", "start_method", "event_log_handler", "role", "log_dir", "redirects", "tee",
    "local_ranks_filter", "duplicate_stdout_filters", "duplicate_stderr_filters", "node_rank", "master_addr",
    "master_port", "local_addr", "signals_to_handle", "shutdown_timeout",
)
PET_SWITCHES = ("standalone", "module", "no_python", "run_path", "virtual_local_rank")


@dataclass(frozen=True)
class EnvValue:
    """One setting taken from the environment: the flag's dest, its raw text, and the variable."""

    dest: str
    value: str
    source: str


def pet_values(environ: Mapping[str, str]) -> tuple[list[EnvValue], list[str]]:
    """torchrun's PET_* defaults: (values, problems). A switch is on when its variable is a non-zero int."""
    values, problems = [], []
    for dest in PET_VALUE_FLAGS:
        name = f"PET_{dest.upper()}"
        if environ.get(name, "").strip():
            values.append(EnvValue(dest, environ[name].strip(), name))
    for dest in PET_SWITCHES:
        name = f"PET_{dest.upper()}"
        raw = environ.get(name, "").strip()
        if not raw:
            continue
        try:
            on = int(raw) != 0
        except ValueError:
            problems.append(f"{name}: must be an integer (0 = off), not {raw!r}")
            continue
        if on:
            values.append(EnvValue(dest, "1", name))
    return values, problems


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        raw = environ.get(name, "").strip()
        if raw:
            return name, raw
    return None


def taskd_values(environ: Mapping[str, str]) -> list[EnvValue]:
    """The variables taskd already honoured before it spoke torchrun (MINDX_TASK_ID, MINDX_SERVER_IP:
    the settings of taskd/settings.py with `run_env`)."""
    return [EnvValue(s.run, environ[s.env].strip(), s.env) for s in RUN_SETTINGS
            if s.run_env and environ.get(s.env, "").strip()]


def slurm_values(environ: Mapping[str, str]) -> tuple[list[EnvValue], list[str]]:
    """Inside a Slurm job: node count, node rank, job id and node 0's host (MASTER_ADDR).

    A step's own variables (SLURM_STEP_*) come first: `srun -N2` inside a larger allocation runs
    on two nodes, whatever the allocation holds.
    """
    if not environ.get("SLURM_JOB_ID", "").strip():
        return [], []
    out: list[EnvValue] = [EnvValue("job_id", environ["SLURM_JOB_ID"].strip(), "SLURM_JOB_ID")]
    problems: list[str] = []
    nodes = _first(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    if nodes:
        out.append(EnvValue("nnodes", nodes[1], nodes[0]))
    node_id = _first(environ, "SLURM_NODEID")
    if node_id:
        out.append(EnvValue("node_rank", node_id[1], node_id[0]))
    nodelist = _first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if nodelist:
        try:
            out.append(EnvValue("master_addr", first_host(nodelist[1]), nodelist[0]))
        except ValueError as exc:
            problems.append(f"{nodelist[0]}: {exc}")
    tasks = _first(environ, "SLURM_STEP_NUM_TASKS")
    step_nodes = _first(environ, "SLURM_STEP_NUM_NODES")
    if tasks and step_nodes and tasks[1].isdigit() and step_nodes[1].isdigit() and int(tasks[1]) > int(step_nodes[1]):
        problems.append(f"SLURM_STEP_NUM_TASKS: {tasks[1]} tasks on {step_nodes[1]} node(s); taskd run starts "
                        "a node's ranks itself, so run one task per node (srun --ntasks-per-node=1)")
    return out, problems


def kubernetes_values(environ: Mapping[str, str]) -> list[EnvValue]:
    """An indexed Job / JobSet pod's index is its node rank; a PyTorchJob pod has MASTER_ADDR and RANK.

    Kubeflow's PyTorchJob sets RANK to the pod's index (master 0, worker i -> i+1), MASTER_ADDR to
    the master pod's service and MASTER_PORT. WORLD_SIZE is the pod count in training-operator
    before v1.7 and pods x nprocPerNode since (which also sets PET_NNODES, read first), so
    WORLD_SIZE is used as the node count only when PET_NNODES is absent. Only inside a pod
    (KUBERNETES_SERVICE_HOST): elsewhere RANK and WORLD_SIZE are more likely a parent job's.
    """
    out: list[EnvValue] = []
    index = _first(environ, "JOB_COMPLETION_INDEX")
    if index:
        out.append(EnvValue("node_rank", index[1], index[0]))
    if not environ.get("KUBERNETES_SERVICE_HOST") or not environ.get("MASTER_ADDR") or "RANK" not in environ:
        return out
    out.append(EnvValue("node_rank", environ["RANK"].strip(), "RANK"))
    if environ.get("WORLD_SIZE", "").strip():
        out.append(EnvValue("nnodes", environ["WORLD_SIZE"].strip(), "WORLD_SIZE"))
    out.append(EnvValue("master_addr", environ["MASTER_ADDR"].strip(), "MASTER_ADDR"))
    if environ.get("MASTER_PORT", "").strip():
        out.append(EnvValue("master_port", environ["MASTER_PORT"].strip(), "MASTER_PORT"))
    return out


def environment_values(environ: Mapping[str, str]) -> tuple[list[EnvValue], list[str]]:
    """Every candidate in precedence order (the caller keeps the first per setting), and problems."""
    pet, pet_problems = pet_values(environ)
    slurm, slurm_problems = slurm_values(environ)
    return [*pet, *taskd_values(environ), *slurm, *kubernetes_values(environ)], pet_problems + slurm_problems
