"""The tests of tests/e2e/run/test_torchrun_compat.py that start no process and open no network socket
(the unit tier).

Split from it by move_tests.py; its subject: torchrun's launch lines under `taskd run`: change the
word `torchrun`, nothing else.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import pytest
from support import EXAMPLES

from taskd.run_config import RunConfig, add_run_arguments


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
        "nnodes-range": lambda: (cfg.min_nnodes, cfg.nnodes) == (0, 1) and not cfg.notices,  # 1:1 is fixed-size
        "redirects-tee": lambda: cfg.redirects == {0: 3, 1: 3} and cfg.tee == {0: 3, 1: 3},
        "max-restarts": lambda: (cfg.max_restarts, cfg.monitor_interval, cfg.script_args) == (2, 0.5, ("--lr", "0.1")),
        "underscores-mixed": lambda: (cfg.master_addr, cfg.master_port, cfg.max_restarts, cfg.log_dir,
                                      cfg.local_ranks_filter) == ("127.0.0.1", 29533, 1, "logs", frozenset({0})),
    }[name]
    assert expected(), cfg


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


def test_k8s_job_brings_a_lost_nodes_pod_back_with_its_index_and_fails_on_taskds_own_verdict() -> None:
    """Issue 17 item 6: a disrupted pod (node lost, drained, preempted) is the node's replacement, not a retry;
    taskd's own non-zero exit fails the Job; the pod is evicted from an unreachable node well within the
    controller's default --node-rejoin-timeout."""
    from taskd.controller.config import ControllerConfig

    job = next(d for ds in _manifests().values() for d in ds if d["kind"] == "Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    fail = rules[1]
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["operator"] == "NotIn"
    assert set(fail["onExitCodes"]["values"]) == {0, 137}
    assert fail["onExitCodes"]["containerName"] == pod["containers"][0]["name"]
    assert pod["restartPolicy"] == "Never" and spec["backoffLimitPerIndex"] >= 1 and spec["maxFailedIndexes"] == 0
    evicted_after = {t["key"]: t["tolerationSeconds"] for t in pod["tolerations"] if t["effect"] == "NoExecute"}
    assert set(evicted_after) == {"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"}
    assert max(evicted_after.values()) < ControllerConfig.node_rejoin_timeout / 2


def test_k8s_training_command_derives_node_rank_from_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES / "slurm")  # where train_ddp.py is
    job = next(d for ds in _manifests().values() for d in ds if d["kind"] == "Job")
    argv = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[:2] == ["taskd", "run"]
    cfg = RunConfig.from_args(taskd_parser().parse_args(argv[2:]), {"JOB_COMPLETION_INDEX": "1"})
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr, cfg.master_port) == (2, 1, "train-rdzv", 29500)
    assert cfg.server == "taskd-controller:8899"


def test_k8s_standby_pods_join_the_same_job_as_spares_and_the_rendezvous_follows_node_0(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17 item 6: standby pods of the same job (`taskd run --standby`, its flags otherwise the training
    pods'); the ranks meet at a Service that routes only to the pod listening on the store's port (node 0's)."""
    monkeypatch.chdir(EXAMPLES / "slurm")
    docs = {(d["kind"], d["metadata"]["name"]): d for ds in _manifests().values() for d in ds}
    train, spare = docs["Job", "train"], docs["Job", "train-standby"]
    argv = spare["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[:3] == ["taskd", "run", "--standby"]
    train_argv = train["spec"]["template"]["spec"]["containers"][0]["command"]
    assert [a for a in argv if a not in ("--standby", "--warm-spares", "1")] == train_argv
    cfg = RunConfig.from_args(taskd_parser().parse_args(argv[2:]), {})
    assert cfg.standby and cfg.nnodes == 2 and cfg.server == "taskd-controller:8899"
    rdzv = docs["Service", "train-rdzv"]
    assert rdzv["spec"].get("clusterIP") != "None" and rdzv["spec"]["ports"][0]["port"] == cfg.master_port
    for job in (train, spare):
        pod = job["spec"]["template"]
        assert rdzv["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        container = pod["spec"]["containers"][0]
        assert container["readinessProbe"]["tcpSocket"]["port"] == cfg.master_port
        assert {e["name"]: e.get("value") for e in container["env"]}["MINDX_TASK_ID"] == "train-001"
        assert job["spec"]["podFailurePolicy"] == train["spec"]["podFailurePolicy"]


def test_pytorchjob_command_derives_everything_from_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES / "slurm")
    pj = next(d for ds in _manifests().values() for d in ds if d["kind"] == "PyTorchJob")
    argv = pj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "MASTER_ADDR": "train-pj-master-0", "MASTER_PORT": "23456",
           "RANK": "1", "WORLD_SIZE": "2", "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2"}
    cfg = RunConfig.from_args(taskd_parser().parse_args(argv[2:]), pod)
    assert (cfg.nnodes, cfg.node_rank, cfg.nproc_per_node, cfg.master_addr) == (2, 1, 2, "train-pj-master-0")


def test_worker_spec_local_ranks_filter() -> None:
    from taskd.launcher import WorkerSpec, WorkerSpecError

    spec = WorkerSpec(["true"], nproc_per_node=3, console=True, local_ranks_filter=[0, 2])
    assert spec.local_ranks_filter == frozenset({0, 2})
    assert [spec.console_streams(r) for r in range(3)] == [(True, True), (False, False), (True, True)]
    assert WorkerSpec(["true"], nproc_per_node=2, console=True).console_streams(1) == (True, True)
    for bad in ([], [-1], "0", [True]):
        with pytest.raises(WorkerSpecError, match="--local-ranks-filter"):
            WorkerSpec(["true"], nproc_per_node=2, local_ranks_filter=bad)
