"""RunConfig: flags, torchrun's value forms, the environment (PET_*, Slurm, Kubernetes) and the errors.

No cluster: each test hands `from_args` the variables a Slurm step or a pod would see.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskd.run_config import RunConfig, RunConfigError, add_run_arguments, count_gpus, expand_nodelist, first_host

SCRIPT = str(Path(__file__).resolve().parents[3] / "examples" / "train_resumable.py")
SERVER = ["--server", "10.0.0.1:8899"]


def parse(argv: list[str], env: dict[str, str] | None = None) -> RunConfig:
    parser = argparse.ArgumentParser(prog="taskd run")
    add_run_arguments(parser)
    return RunConfig.from_args(parser.parse_args(argv), env or {})


def problems(argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(RunConfigError) as info:
        parse(argv, env)
    return info.value.problems


# --- Slurm's node lists -------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "hosts"), [
    ("node01", ["node01"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
    ("a,b[2],c", ["a", "b2", "c"]),
])
def test_nodelist_expands_as_scontrol_show_hostnames(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts
    assert first_host(text) == hosts[0]


@pytest.mark.parametrize("text", ["", "node[1-", "node1]", "node[3-1]", "node[a-b]", "a,,b", "n[[1]]", "n[0-9999999]"])
def test_malformed_nodelist_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="node list"):
        expand_nodelist(text)


def test_first_host_does_not_expand_the_rest() -> None:
    assert first_host("a[0-999999],b") == "a0"


_prefix = st.from_regex(r"[a-z][a-z0-9-]{0,6}[a-z-]", fullmatch=True)
_range = st.tuples(st.integers(0, 300), st.integers(0, 20), st.integers(1, 4))  # start, length, width


@given(st.lists(st.tuples(_prefix, st.lists(_range, min_size=1, max_size=3)), min_size=1, max_size=4))
def test_nodelist_property_matches_a_direct_expansion(entries: list[tuple[str, list[tuple[int, int, int]]]]) -> None:
    """Build `prefix[lo-hi,...]` entries with zero padding and check every host, in order."""
    text_parts, expected = [], []
    for prefix, ranges in entries:
        groups = []
        for start, length, width in ranges:
            lo, hi = str(start).zfill(width), str(start + length).zfill(width)
            groups.append(lo if length == 0 else f"{lo}-{hi}")
            expected += [prefix + str(n).zfill(width) for n in range(start, start + length + 1)]
        text_parts.append(f"{prefix}[{','.join(groups)}]")
    text = ",".join(text_parts)
    assert expand_nodelist(text) == expected
    assert first_host(text) == expected[0]
    assert expand_nodelist(",".join(expected)) == expected  # an expanded list is its own expansion


# --- flags ---------------------------------------------------------------------------------------

def test_defaults_are_taskds() -> None:
    cfg = parse([SCRIPT, "--steps", "3"])
    assert cfg.entrypoint == (sys.executable, "-u", SCRIPT, "--steps", "3")
    assert (cfg.nnodes, cfg.nproc_per_node, cfg.node_rank, cfg.max_restarts) == (1, 1, 0, 3)
    assert cfg.server is None and cfg.master_port == 0 and cfg.job_id.startswith("taskd-")
    assert cfg.notices == () and cfg.from_environment == ()


def test_config_is_frozen_and_checked_when_built_directly() -> None:
    cfg = parse([SCRIPT])
    with pytest.raises(AttributeError):
        cfg.nnodes = 2  # type: ignore[misc]
    with pytest.raises(RunConfigError, match=r"--node-rank must be in \[0, 1\]"):
        RunConfig(entrypoint=("true",), script="true", script_args=(), launch_mode="no-python", job_id="j", nnodes=2,
                  node_rank=2)


def test_every_problem_is_reported_at_once_naming_its_flag() -> None:
    found = problems(["--nnodes", "3:1", "--nproc_per_node", "many", "--max_restarts=-1", "--master-port", "70000",
                      "--monitor-interval", "0", "--strategies", "recover,pray", "--tee", "9",
                      "--warm-spare-mode", "eager", "missing.py"])
    text = "\n".join(found)
    for flag in ("--nnodes", "--nproc-per-node", "--max-restarts", "--master-port", "--monitor-interval",
                 "--strategies", "-t/--tee", "--warm-spare-mode must be import or script, not 'eager'", "missing.py"):
        assert flag in text, f"{flag} not named in:\n{text}"
    assert len(found) == 9, text


@pytest.mark.parametrize("value", ["cpu", "auto"])
def test_nproc_cpu_and_auto_without_gpus_count_this_process_cpus(value: str) -> None:
    cfg = parse(["--nproc-per-node", value, SCRIPT], {"CUDA_VISIBLE_DEVICES": ""})
    assert cfg.nproc_per_node == len(os.sched_getaffinity(0))
    assert any("CPUs" in n for n in cfg.notices)


def test_nproc_gpu_counts_cuda_visible_devices() -> None:
    assert count_gpus({"CUDA_VISIBLE_DEVICES": "0,2,5"}) == 3
    assert count_gpus({"CUDA_VISIBLE_DEVICES": "0,-1,3"}) == 1  # CUDA stops at the first invalid entry
    assert parse(["--nproc-per-node", "gpu", SCRIPT], {"CUDA_VISIBLE_DEVICES": "0,1"}).nproc_per_node == 2
    assert parse(["--nproc-per-node", "auto", SCRIPT], {"CUDA_VISIBLE_DEVICES": "3"}).nproc_per_node == 1
    assert "no GPU found" in problems(["--nproc-per-node", "gpu", SCRIPT], {"CUDA_VISIBLE_DEVICES": ""})[0]


def test_nnodes_min_max_starts_after_a_last_call_and_may_scale_in_to_min_with_a_notice() -> None:
    cfg = parse(["--nnodes", "2:4", *SERVER, SCRIPT])
    assert (cfg.min_nnodes, cfg.nnodes, cfg.master_port, cfg.last_call_timeout) == (2, 4, 29500, None)
    assert any("once nodes 0..1 joined" in n and "last call" in n and "go on with 2 (scale-in" in n
               for n in cfg.notices)
    assert parse(["--nnodes", "2:4", "--rdzv-conf", "last_call_timeout=2", *SERVER, SCRIPT]).last_call_timeout == 2
    assert "last_call_timeout" in problems(["--nnodes", "1:2", "--rdzv-conf", "last_call_timeout=x", *SERVER,
                                            SCRIPT])[0]
    fixed = parse(["--nnodes", "3:3", *SERVER, SCRIPT])
    assert fixed.min_nnodes == 0 and not any("scale-in" in n for n in fixed.notices)  # MIN == MAX: fixed-size
    assert parse(["--nnodes", "3", *SERVER, SCRIPT]).min_nnodes == 0


def test_a_multi_node_job_needs_a_shared_controller() -> None:
    no_endpoint = problems(["--nnodes", "2", SCRIPT])[0]
    assert "needs one controller" in no_endpoint and "add --rdzv-endpoint HOST:PORT" in no_endpoint
    assert parse(["--nnodes", "2", SCRIPT], {"MINDX_SERVER_IP": "10.0.0.1:8899"}).server == "10.0.0.1:8899"


def test_a_multi_node_torchrun_line_gets_node_zeros_controller_beside_the_endpoint() -> None:
    """issue 32, F5: the unchanged line, with the secret every node has; without it, what to add."""
    line = ["--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29400", SCRIPT]
    cfg = parse(line, {"TASKD_TOKEN_FILE": "/run/secrets/taskd"})
    assert (cfg.hosted_controller, cfg.server, cfg.master_port) == ("head:29401", None, 29400)
    assert parse([*line[:-1], "--token-file", "t", SCRIPT]).hosted_controller == "head:29401"
    assert parse([*line[:-1], "--server", "ctl:1", SCRIPT]).hosted_controller is None  # a server given: that one
    missing = problems(line)
    assert len(missing) == 1 and "node 0's taskd run hosts the job's controller at head:29401" in missing[0]
    assert "set TASKD_TOKEN_FILE=FILE on every node" in missing[0] and "--rdzv-endpoint" in missing[0]
    assert "1..65534" in problems(["--nnodes", "2", "--rdzv-endpoint", "head:65535", SCRIPT],
                                  {"TASKD_TOKEN_FILE": "t"})[0]


def test_rdzv_endpoint_is_node_zeros_master_addr_and_port() -> None:
    cfg = parse(["--rdzv-endpoint", "head:29400", "--rdzv_id", "j7", "--rdzv-backend", "c10d", SCRIPT])
    assert (cfg.master_addr, cfg.master_port, cfg.job_id) == ("head", 29400, "j7")
    assert parse(["--rdzv_endpoint", "head", SCRIPT]).master_port == 29500
    explicit = parse(["--rdzv-endpoint", "head:1", "--master-addr", "other", "--master_port", "2", SCRIPT])
    assert (explicit.master_addr, explicit.master_port) == ("other", 2)
    assert any("--rdzv-backend" in n for n in cfg.notices)
    assert "--rdzv-endpoint" in problems(["--rdzv-endpoint", "a:b:c:99999", SCRIPT])[0]


def test_rdzv_id_and_job_id_must_agree() -> None:
    assert "different jobs" in problems(["--rdzv-id", "a", "--job-id", "b", SCRIPT])[0]
    assert parse(["--rdzv-id", "a", "--job-id", "a", SCRIPT]).job_id == "a"


def test_a_multi_node_line_without_a_job_id_names_torchruns_default_on_every_node() -> None:
    """Issue 21 D5: each node made up its own id and waited 600 s for nodes registered under theirs."""
    line = ["--nnodes", "2", *SERVER, "--master-addr", "head", SCRIPT]
    nodes = [parse(["--node-rank", str(r), *line], env) for r, env in ((0, {}), (1, {"MINDX_TASK_ID": ""}))]
    assert [n.job_id for n in nodes] == ["none", "none"]
    assert all(any("torchrun's default" in text for text in n.notices) for n in nodes)
    assert parse(["--rdzv-id", "none", *line]).job_id == "none"
    assert parse(["--rdzv-id", "j9", *line]).job_id == "j9"
    one = parse([SCRIPT])
    assert one.job_id.startswith("taskd-") and not any("torchrun's default" in t for t in one.notices)


def test_standalone_is_one_node_with_the_embedded_controller() -> None:
    cfg = parse(["--standalone", "--rdzv-endpoint", "far:1", SCRIPT], {"MINDX_SERVER_IP": "10.0.0.1",
                                                                      "SLURM_JOB_ID": "9", "SLURM_NNODES": "4"})
    assert (cfg.standalone, cfg.server, cfg.nnodes, cfg.master_addr) == (True, None, 1, "127.0.0.1")
    assert cfg.from_environment == () and any("ignored with --standalone" in n for n in cfg.notices)
    assert "--standalone" in problems(["--standalone", "--server", "h:1", SCRIPT])[0]
    assert "one-node job" in problems(["--standalone", "--nnodes", "2", SCRIPT])[0]


def test_redirects_and_tee_expand_to_every_local_rank() -> None:
    cfg = parse(["--nproc-per-node", "3", "-r", "3", "--tee", "0:1,2:2", "--log-dir", "/tmp/x-logs", SCRIPT])
    assert cfg.redirects == {0: 3, 1: 3, 2: 3}
    assert cfg.tee == {0: 1, 1: 0, 2: 2}
    assert "local rank 5" in problems(["--nproc-per-node", "2", "--redirects", "5:1", SCRIPT])[0]


def test_redirects_without_log_dir_get_a_temporary_one() -> None:
    cfg = parse(["-r", "1", SCRIPT])
    assert cfg.log_dir and os.path.isdir(cfg.log_dir)
    assert any(cfg.log_dir in n for n in cfg.notices)
    os.rmdir(cfg.log_dir)


def test_meaningless_flags_are_accepted_with_one_notice_each() -> None:
    argv = ["--start-method", "fork", "--event_log_handler", "x", "--logs-specs", "y", "--numa-binding", "node",
            "--signals-to-handle", "SIGUSR1", "--local-addr", "me", "--rdzv-conf", "timeout=5", "--run-path",
            "--virtual-local-rank", "--duplicate-stdout-filters", "a", "--duplicate_stderr_filters", "b", SCRIPT]
    cfg = parse(argv)
    assert len(cfg.notices) == 11 and all("\n" not in n for n in cfg.notices)
    assert cfg.rdzv_conf == {"timeout": "5"}
    assert "spawn, fork, forkserver" in problems(["--start-method", "vfork", SCRIPT])[0]


def test_shutdown_timeout_is_stop_grace() -> None:
    assert parse(["--shutdown-timeout", "7", SCRIPT]).stop_grace == 7.0
    assert "disagree" in problems(["--shutdown-timeout", "7", "--stop-grace", "2", SCRIPT])[0]


def test_local_ranks_filter_and_role() -> None:
    cfg = parse(["--local-ranks-filter", "0,2", "--role", "trainer", SCRIPT])
    assert cfg.local_ranks_filter == frozenset({0, 2}) and cfg.role == "trainer"
    assert "--local-ranks-filter" in problems(["--local_ranks_filter", "a", SCRIPT])[0]


def test_module_and_no_python_entrypoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    cfg = parse(["-m", "mypkg.train", "--lr", "1"])
    assert cfg.entrypoint == (sys.executable, "-u", "-m", "mypkg.train", "--lr", "1")
    assert cfg.launch_mode == "module"
    assert "no module 'nopkg'" in problems(["--module", "nopkg.train"])[0]
    cfg = parse(["--no-python", "echo", "hi"])
    assert cfg.entrypoint == ("echo", "hi") and cfg.launch_mode == "no-python"
    assert "cannot be combined" in problems(["-m", "--no-python", "mypkg.train"])[0]
    assert "no such file or command" in problems(["--no_python", "no-such-command-xyz"])[0]


# --- the environment -----------------------------------------------------------------------------

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "3", "SLURM_NODEID": "2",
         "SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_NUM_NODES": "3"}


def test_slurm_gives_node_count_rank_job_id_and_master_addr() -> None:
    cfg = parse([*SERVER, SCRIPT], SLURM)
    assert (cfg.nnodes, cfg.node_rank, cfg.job_id, cfg.master_addr, cfg.master_port) == (3, 2, "4242", "gpu07", 29500)
    line = cfg.environment_line()
    assert line is not None and "nnodes=3 (SLURM_STEP_NUM_NODES)" in line and "(SLURM_JOB_NODELIST)" in line


def test_slurm_job_num_nodes_when_nnodes_is_absent() -> None:
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_NODELIST": "a,b"}
    cfg = parse([*SERVER, SCRIPT], env)
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr) == (2, 1, "a")


def test_explicit_flags_win_over_slurm() -> None:
    cfg = parse(["--nnodes", "1", "--node-rank", "0", "--job-id", "mine", "--master-addr", "m", SCRIPT], SLURM)
    assert (cfg.nnodes, cfg.node_rank, cfg.job_id, cfg.master_addr) == (1, 0, "mine", "m")
    assert cfg.from_environment == ()


def test_slurm_errors_name_the_variable() -> None:
    found = problems([*SERVER, SCRIPT], {**SLURM, "SLURM_NODEID": "5", "SLURM_JOB_NODELIST": "gpu[07-"})
    assert any(p.startswith("SLURM_JOB_NODELIST:") for p in found), found
    assert any(p.startswith("SLURM_NODEID must be in [0, 2]") and "SLURM_STEP_NUM_NODES" in p for p in found), found


def test_slurm_with_a_task_per_gpu_is_refused() -> None:
    found = problems([*SERVER, SCRIPT], {**SLURM, "SLURM_STEP_NUM_TASKS": "12"})
    assert "--ntasks-per-node=1" in found[0]


def test_kubernetes_indexed_job_index_is_the_node_rank() -> None:
    cfg = parse(["--nnodes", "4", *SERVER, "--rdzv-endpoint", "train-0.train:29500", SCRIPT],
                {"JOB_COMPLETION_INDEX": "3"})
    assert (cfg.node_rank, cfg.master_addr) == (3, "train-0.train")
    assert "node_rank=3 (JOB_COMPLETION_INDEX)" in (cfg.environment_line() or "")


def test_pytorchjob_convention_in_a_pod() -> None:
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "MASTER_ADDR": "pj-master-0", "MASTER_PORT": "23456",
           "RANK": "1", "WORLD_SIZE": "2", "MINDX_SERVER_IP": "taskd:8899"}
    cfg = parse([SCRIPT], pod)
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr, cfg.master_port) == (2, 1, "pj-master-0", 23456)
    # training-operator >= 1.7: WORLD_SIZE counts processes; PET_NNODES / PET_NODE_RANK say the nodes
    newer = {**pod, "WORLD_SIZE": "8", "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "4"}
    cfg = parse([SCRIPT], newer)
    assert (cfg.nnodes, cfg.node_rank, cfg.nproc_per_node) == (2, 1, 4)
    assert "nnodes=2 (PET_NNODES)" in (cfg.environment_line() or "")


def test_rank_outside_a_pod_is_not_a_node_rank() -> None:
    cfg = parse([SCRIPT], {"MASTER_ADDR": "x", "RANK": "3", "WORLD_SIZE": "8"})
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr) == (1, 0, "127.0.0.1")


def test_pet_variables_are_torchruns_flag_defaults() -> None:
    cfg = parse([SCRIPT], {"PET_NPROC_PER_NODE": "2", "PET_MAX_RESTARTS": "5", "PET_STANDALONE": "1"})
    assert (cfg.nproc_per_node, cfg.max_restarts, cfg.standalone) == (2, 5, True)
    assert parse(["--max-restarts", "1", SCRIPT], {"PET_MAX_RESTARTS": "5"}).max_restarts == 1
    assert problems([SCRIPT], {"PET_MAX_RESTARTS": "x"}) == ["PET_MAX_RESTARTS: 'x' is not an integer"]


def test_mindx_variables_still_work() -> None:
    cfg = parse([SCRIPT], {"MINDX_TASK_ID": "t1", "MINDX_SERVER_IP": "10.1.1.1:8899"})
    assert (cfg.job_id, cfg.server) == ("t1", "10.1.1.1:8899")
    assert problems([SCRIPT], {"MINDX_SERVER_IP": "[bad:host:1]:8899"})[0].startswith("MINDX_SERVER_IP:")
