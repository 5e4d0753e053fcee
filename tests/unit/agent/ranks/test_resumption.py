"""When "training resumed" is said after a restart that is not a live rebuild (agent/ranks/resumption.py), and what
the summary then prints (agent/summary.py): only what was read from the ranks' heartbeat files, never the
restart itself passed off as the recovery."""

from __future__ import annotations

from taskd.agent.ranks.resumption import Resumption
from taskd.agent.ranks.table import Rank, RankLayout, RankTable
from taskd.agent.summary import ELSEWHERE, NO_HEARTBEATS, PENDING, RESUMED, SUPERSEDED, RecoveryRecord
from taskd.worker.heartbeat_file import HeartbeatState


def beat(pid: int, step: int | None, when: float = 100.0) -> HeartbeatState:
    return HeartbeatState(time=when, step=step, section="", section_timeout=None, section_start=None,
                          save_request=0, save_ack=0, save_ok=False, pid=pid, stack_signal=0, beats=1)


class Files:
    """The ranks' heartbeat files as the agent reads them: the state of the rank's current pid, or None."""

    def __init__(self) -> None:
        self.states: dict[int, HeartbeatState] = {}

    def __call__(self, rank: Rank) -> HeartbeatState | None:
        state = self.states.get(rank.local_rank)
        return state if state is not None and state.pid == rank.pid else None


def two_ranks() -> RankTable:
    table = RankTable(RankLayout(0, 1, (0, 1)))
    for rank, pid in zip(table.all(), (10, 11), strict=True):
        rank.pid = pid
    return table


def record() -> RecoveryRecord:
    return RecoveryRecord("recover", [1], 0.0, 0.01)


def test_resumed_once_every_restarted_rank_beat_from_its_new_process(caplog) -> None:
    table, files = two_ranks(), Files()
    files.states = {0: beat(10, 40), 1: beat(11, 50)}
    watch = Resumption(table, files)
    before = watch.steps([1])
    assert before == {1: 50}
    table[1].pid = 21  # the replacement
    rec = record()
    watch.track(rec, [1], before, started=1.0)
    assert watch.check(now=1.5) is None
    assert rec.resumption == PENDING and watch.pending  # the old incarnation's file does not count
    files.states[1] = beat(21, 43)
    with caplog.at_level("INFO", logger="taskd.agent"):
        assert watch.check(now=2.25) == 1.25  # the seconds the controller is told (ResumedRequest)
    assert rec.resumption == RESUMED and rec.resumed_seconds == 1.25 and not watch.pending
    assert "rank 1 at step 43, step 50 before the fault: it redoes at least 8 step(s)" in caplog.text
    assert "1.250s from the fault to training resumed" in rec.describe()


def test_a_beat_without_a_step_counts_only_for_a_rank_that_never_named_steps(caplog) -> None:
    """A job-rescheduling restarts both ranks: rank 0's first beat names no step (a callback's at the start of
    training); rank 1, which never named steps, counts with such a beat, rank 0 only once it names a step."""
    table, files = two_ranks(), Files()
    files.states = {0: beat(10, 36), 1: beat(11, None)}
    watch = Resumption(table, files)
    before = watch.steps([0, 1])
    assert before == {0: 36, 1: None}
    table[0].pid, table[1].pid = 20, 21
    rec = record()
    watch.track(rec, [0, 1], before, started=1.0)
    files.states = {0: beat(20, None), 1: beat(21, None)}
    assert watch.check(now=1.5) is None and watch.pending  # rank 0 is beating but has not named a step
    files.states[0] = beat(20, 33)
    with caplog.at_level("INFO", logger="taskd.agent"):
        assert watch.check(now=2.0) == 1.0
    assert "rank 0 at step 33, step 36 when stopped: it redoes at least 4 step(s)" in caplog.text
    assert "rank 1 sent a heartbeat (no step number)" in caplog.text


def test_a_restart_with_no_heartbeats_says_it_cannot_tell() -> None:
    table, files = two_ranks(), Files()
    watch = Resumption(table, files)
    before = watch.steps([1])  # nobody ever beat
    rec = record()
    watch.track(rec, [1], before, started=1.0)
    assert rec.resumption == NO_HEARTBEATS and not watch.pending
    assert "from the fault to rank(s) replaced" in rec.describe() and "resumed" not in rec.describe().split(";")[0]


def test_a_restart_elsewhere_and_a_superseded_one_are_said_as_such() -> None:
    table, files = two_ranks(), Files()
    files.states = {0: beat(10, 5), 1: beat(11, 5)}
    watch = Resumption(table, files)
    elsewhere = record()
    watch.track(elsewhere, [], {}, started=1.0)  # no rank of this node was restarted
    assert elsewhere.resumption == ELSEWHERE
    first = record()
    watch.track(first, [1], watch.steps([1]), started=1.0)
    watch.supersede()  # the next restart replaces its ranks before they beat
    assert first.resumption == SUPERSEDED and not watch.pending


def test_the_resumption_says_where_each_restarted_rank_restored_from(caplog) -> None:
    """What each rank's restore wrote (taskd.worker.snapshot_account), read from its current pid only, goes in the
    "training resumed" line, the summary's record and the controller's report (`restores`)."""
    from taskd.worker.snapshot_account import Restored

    table, files = two_ranks(), Files()
    files.states = {0: beat(10, 40), 1: beat(11, 40)}
    said = {0: Restored(0, 20, "buddy", 9, 9, holder=1), 1: Restored(1, 11, "memory", 9, 10)}  # 1: the old pid's
    watch = Resumption(table, files, lambda rank: said.get(rank.local_rank))
    before = watch.steps([0, 1])
    table[0].pid, table[1].pid = 20, 21
    rec = RecoveryRecord("job-rescheduling", [0, 1], 0.0, 0.01)
    watch.track(rec, [0, 1], before, started=1.0)
    files.states = {0: beat(20, 10), 1: beat(21, 10)}
    with caplog.at_level("INFO", logger="taskd.agent"):
        assert watch.check(now=2.0) == 1.0
    assert [r.rank for r in watch.restores] == [0]  # rank 1's record is its previous incarnation's: not counted
    words = "rank(s) 0 restored step 9 from the buddy's copy (node 1's agent), redoing the 0 newer step(s)"
    assert words in caplog.text and words in rec.describe()
    said[1] = Restored(1, 21, "memory", 9, 10)
    watch.track(rec, [0, 1], before, started=1.0)
    watch.check(now=2.0)
    assert "rank(s) 1 restored step 9 from this node's memory, redoing the 1 newer step(s)" in rec.describe()


def test_a_fresh_agent_watches_its_first_restart_and_says_where_its_ranks_restored_from(caplog) -> None:
    """Issue 33: a replacement's (or standby's) agent has seen no heartbeat (its ranks never ran here), yet its
    ranks' resumption and their buddy restores are said like a survivor's; if no heartbeat comes within
    UNSURE_LIMIT it says it cannot tell, still with the restores."""
    from taskd.agent.ranks.resumption import UNSURE_LIMIT
    from taskd.worker.snapshot_account import Restored

    for heartbeats in (True, False):
        table, files = RankTable(RankLayout(0, 1, (0, 1))), Files()  # no pid: this agent never started them
        said = {0: Restored(0, 20, "buddy", 9, -1, holder=0), 1: Restored(1, 21, "buddy", 9, -1, holder=0)}
        watch = Resumption(table, files, lambda rank, said=said: said.get(rank.local_rank))
        before = watch.steps([0, 1])
        table[0].pid, table[1].pid = 20, 21
        rec = RecoveryRecord("job-rescheduling", [2, 3], 0.0, 0.01)
        watch.track(rec, [0, 1], before, started=1.0)
        assert rec.resumption == PENDING and watch.pending
        assert watch.check(now=2.0) is None and not watch.expire(now=2.0)
        caplog.clear()
        with caplog.at_level("INFO", logger="taskd.agent"):
            if heartbeats:
                files.states = {0: beat(20, 10), 1: beat(21, 10)}
                assert watch.check(now=3.0) == 2.0 and rec.resumption == RESUMED
            else:
                assert watch.check(now=1.0 + UNSURE_LIMIT) is None and watch.expire(now=1.0 + UNSURE_LIMIT)
                assert rec.resumption == NO_HEARTBEATS and "resumption not seen" in caplog.text
        assert not watch.pending and [r.source for r in watch.restores] == ["buddy", "buddy"]
        words = "rank(s) 0, 1 restored step 9 from the buddy's copy (node 0's agent)"
        assert words in caplog.text and words in rec.describe(), (caplog.text, rec.describe())
