"""A replacement node's ranks never ran: START_WORKER_LIST starts them as first incarnations; a standby's launcher
gets its node rank late (RANK, GROUP_RANK, ... for that node) and its warm spares import before any assignment."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import psutil
from support import wait_for, written

from taskd.callbacks import STATUS_RUNNING
from taskd.launcher import LocalLauncher, WorkerSpec, command_for

SCRIPT = textwrap.dedent('''
    import json, os, sys, time
    names = ("RANK", "LOCAL_RANK", "GROUP_RANK", "MS_NODE_ID", "RANK_ID", "TASKD_RESTART_COUNT")
    record = {name: os.environ[name] for name in names} | {"pid": os.getpid()}
    final = os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json")
    with open(final + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(final + ".tmp", final)
    time.sleep(60)
''')


def _spec(tmp_path: Path, node_rank: int | None, spares: int = 0) -> WorkerSpec:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    (tmp_path / "out").mkdir(exist_ok=True)
    return WorkerSpec(command_for(str(script), [str(tmp_path / "out")]), nproc_per_node=2, nnodes=2,
                      node_rank=node_rank, master_port=29511, warm_spares=spares, cwd=str(tmp_path),
                      log_dir=str(tmp_path / "logs"))


def test_start_worker_list_starts_ranks_that_never_ran(tmp_path: Path) -> None:
    with LocalLauncher(_spec(tmp_path, 1)) as launcher:
        assert launcher.start_worker_list([0, 1]) == 0
        entries = launcher.monitor([-1])
        assert {lr: (e["status"], e["global_rank"]) for lr, e in entries.items()} == \
            {0: (STATUS_RUNNING, 2), 1: (STATUS_RUNNING, 3)}
        records = [json.loads(written(tmp_path / "out" / f"rank{r}.json")) for r in (2, 3)]
        assert [r["TASKD_RESTART_COUNT"] for r in records] == ["0", "0"]  # first incarnations, not restarts
        assert launcher.restart_count(0) == 0 and launcher.restart_count(1) == 0


def test_a_standby_takes_its_node_rank_late_and_its_first_ranks_are_warm_spares(tmp_path: Path) -> None:
    with LocalLauncher(_spec(tmp_path, None, spares=1)) as launcher:
        assert launcher.monitor([-1]) == {}  # no node yet: no rank to tell of
        me = psutil.Process()
        spare = wait_for(lambda: [c.pid for c in me.children() if "-c" in c.cmdline()], 10, "a warm spare")[0]
        launcher.set_node_rank(1)
        assert launcher.start_worker_list([0, 1]) == 0
        records = {r: json.loads(written(tmp_path / "out" / f"rank{r}.json")) for r in (2, 3)}
        assert records[2] | {"pid": 0} == {"RANK": "2", "LOCAL_RANK": "0", "GROUP_RANK": "1", "MS_NODE_ID": "2",
                                           "RANK_ID": "2", "TASKD_RESTART_COUNT": "0", "pid": 0}
        assert records[3]["RANK"] == "3" and records[3]["GROUP_RANK"] == "1"
        assert spare in (records[2]["pid"], records[3]["pid"]), "the standby's spare became a rank"
        assert (tmp_path / "logs" / "rank_2.log").exists() and (tmp_path / "logs" / "rank_3.log").exists()


def test_a_standby_of_a_live_job_warms_its_spares_with_the_framework_before_any_assignment(tmp_path: Path) -> None:
    """Its spares were plain interpreters before (the standby decided live recovery only once it had a node), so
    its ranks imported torch after the loss: a warm standby took as long as a cold one (BENCHMARKS.md, node loss)."""
    import pytest
    pytest.importorskip("torch")
    script = tmp_path / "live.py"
    script.write_text("from taskd.worker.torch import LiveGroup\n")
    spec = WorkerSpec(command_for(str(script), []), nproc_per_node=1, nnodes=2, node_rank=None, master_port=29512,
                      warm_spares=1, cwd=str(tmp_path), rdzv_store="auto")  # taskd run's default
    with LocalLauncher(spec) as launcher:
        assert launcher.live_recovery
        me = psutil.Process()
        spare = wait_for(lambda: [c for c in me.children() if "-c" in c.cmdline()], 10, "a warm spare")[0]
        # read again until set: in a full run one read came back without it (the spare caught mid-exec)
        preimport = wait_for(lambda: spare.environ().get("TASKD_PREIMPORT"), 10, "the spare's TASKD_PREIMPORT")
        assert preimport == "torch,torch._dynamo,taskd.worker.torch"


def test_node_0_that_becomes_a_standby_stops_listening_on_the_store_port_and_can_take_a_node_again(
        tmp_path: Path) -> None:
    """An agent whose node a replacement holds becomes a standby (agent/link/registration.py): as node 0 its launcher
    listened on the store's port from the start; it must stop, or a port probe (Kubernetes' train-rdzv Service) would
    count it as the job's rendezvous beside the standby that took node 0 over."""
    import socket

    import pytest
    pytest.importorskip("torch")
    from support import free_port

    script = tmp_path / "live.py"
    script.write_text("from taskd.worker.torch import LiveGroup\n")
    port = free_port()
    spec = WorkerSpec(command_for(str(script), []), nproc_per_node=1, nnodes=2, node_rank=0, master_port=port,
                      cwd=str(tmp_path), rdzv_store="auto")

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    with LocalLauncher(spec) as launcher:
        assert launcher.live_recovery and listening()
        launcher.set_node_rank(None)
        assert not listening() and launcher.monitor([-1]) == {}
        launcher.set_node_rank(1)
        assert not listening() and set(launcher.monitor([-1])) == {0}
