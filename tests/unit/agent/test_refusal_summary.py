"""A rank that refuses live recovery cleanly (its shards are lost: exit 76 after it said GAVE_UP,
taskd.worker.torch_retry) is no fault: the agent acts on it as on one (the round goes on to job-rescheduling, the
job's exit code as before) but its event line, its summary and its first-failure line say what it was."""

from __future__ import annotations

from pathlib import Path

from support.live_files import running_ranks, write

from taskd.agent.ranks.live import LiveRanks
from taskd.agent.ranks.table import RankLayout
from taskd.agent.summary import REFUSED, FaultRecord, JobResult
from taskd.worker import heartbeat_file as hbf
from taskd.worker.live import _U32, SHARDS_LOST_EXIT, Phase

PIDS = {0: 5001, 1: 5002, 2: 5003}


def test_only_exit_76_after_gave_up_is_a_refusal(tmp_path: Path) -> None:
    node, table = running_ranks(tmp_path, RankLayout(0, 1, (0, 1, 2)), PIDS)
    live = LiveRanks(table, node)  # type: ignore[arg-type]
    said = {0: Phase.GAVE_UP, 1: Phase.TRAINING, 2: Phase.GAVE_UP}  # rank 1: a script's own exit 76
    for local, phase in said.items():
        write(node.heartbeat_path(local), (hbf.IDENT, hbf.OFF_IDENT, (PIDS[local], 0)),
              (_U32, hbf.OFF_LIVE_PHASE, (int(phase),)))
    for local, code in ((0, SHARDS_LOST_EXIT), (1, SHARDS_LOST_EXIT), (2, 1)):
        table[local].returncode = code
    assert [live.refused(table[local]) for local in PIDS] == [True, False, False]


def test_the_summary_counts_a_refusal_apart_from_the_faults() -> None:
    result = JobResult(succeeded=True, reason="strategy: job-rescheduling", ranks=2, started=100.0, ended=130.0)
    killed = FaultRecord(110.0, 1, 1, 4242, -9, "exit")
    refused = FaultRecord(115.0, 0, 0, 4241, SHARDS_LOST_EXIT, REFUSED)
    result.add(killed)
    result.add(refused)
    assert result.faults == [killed] and result.refusals == [refused] and result.first_failure is killed
    assert (killed.kind, refused.kind) == ("fault", "refusal")
    summary = result.format_summary()
    assert "2 ranks, 1 fault(s), 1 rank(s) refused live recovery (shards lost), 0 recovery(ies)" in summary, summary
    assert refused.describe() == ("rank 0 (pid 4241) refused live recovery: the shards it would need are lost "
                                  "(exit 76)")
    failed = JobResult(succeeded=False, exit_code=9, ranks=2)
    failed.add(killed)
    failed.add(refused)
    assert failed.format_summary().splitlines()[-1] == "first failure: rank 1 (pid 4242) killed by SIGKILL; exit code 9"
