"""Issue 17: the agents tell the controller when their ranks train again after a round; the controller keeps,
per round and per lost node, the time to the last node's resumption, stores it, and `taskd status` shows it.

Against the real core, state machine and SQLite store (a file in tmp_path); the clock is the test's."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from support import ManualClock
from support.controller import ROUND_CFG

from taskd.controller.core import ControllerCore
from taskd.controller.machine.events import TrainingResumed
from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentRegistered,
    FaultReported,
    JobInit,
    RecoverStatusReported,
    StopComplete,
    StrategiesReported,
)
from taskd.controller.service.hub import SignalHub, extra_params
from taskd.controller.service.validation import check_resumed
from taskd.controller.status_view import render_json, render_text
from taskd.controller.storage.store import Store
from taskd.proto import taskd_pb2
from taskd.vocabulary import Code

BOTH = ("recover", "job-rescheduling", "dump", "exit")
T0 = 1000.0


def make_core(path: Path, clock: ManualClock) -> ControllerCore:
    return ControllerCore(ROUND_CFG, Store(path), SignalHub(), clock=clock, wall=clock)


def at(core: ControllerCore, clock: ManualClock, t: float, ev: Any, code: int = Code.OK) -> Any:
    clock.now = T0 + t
    out = core.dispatch("j", ev)
    assert out.code == code, (ev, out.code, out.info)
    return out


def records(out: Any, kind: str) -> list[dict[str, Any]]:
    return [r.detail for r in out.records if r.kind == kind]


def two_nodes(core: ControllerCore, clock: ManualClock) -> None:
    assert core.init_job("j", JobInit(node_count=2, ranks_per_node=2)).code == Code.OK
    for n in (0, 1):
        at(core, clock, 0, AgentRegistered(node_rank=n, host="h", pid=100 + n, ranks_per_node=2))
        at(core, clock, 0, AgentConnected(node_rank=n, host="h", pid=100 + n))


def lose_and_replace_node_1(core: ControllerCore, clock: ManualClock) -> None:
    """Node 1's agent is lost at +10 s (its stream ended at +5, the grace is 5 s) and replaced; the round
    recovers live; the last recover status arrives at +17 s."""
    two_nodes(core, clock)
    at(core, clock, 5, AgentDisconnected(node_rank=1))
    clock.now = T0 + 10
    for ev in core.jobs["j"].due_events(clock.now):
        core.dispatch("j", ev)
    assert core.jobs["j"].rejoining == {1: T0 + 10}
    at(core, clock, 11, StopComplete(node_rank=0, host="h", pid=100, faults={2: "1", 3: "1"}))
    at(core, clock, 12, StrategiesReported(node_rank=0, strategies=BOTH, host="h", pid=100))
    at(core, clock, 14, AgentRegistered(node_rank=1, host="h2", pid=201, ranks_per_node=2))
    change = at(core, clock, 15, AgentConnected(node_rank=1, host="h2", pid=201)).signals[0]
    assert json.loads(extra_params(change))["round"] == 1  # what the agents name in their report
    at(core, clock, 16, RecoverStatusReported(node_rank=0, host="h", pid=100, strategy="recover", rejoined=True))


def resumed(node: int, pid: int, host: str = "h", round_: int = 1, seconds: float = 6.0, ago: float = 0.0,
            unseen: bool = False) -> TrainingResumed:
    return TrainingResumed(node_rank=node, host=host, pid=pid, round=round_, seconds=seconds, seconds_ago=ago,
                           unseen=unseen)


def test_a_node_loss_round_keeps_the_time_from_the_loss_to_the_last_node_training_again(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    core = make_core(tmp_path / "ctl.sqlite3", clock)
    lose_and_replace_node_1(core, clock)
    # node 0's ranks train again before node 1 reported its status: counted, nothing final yet
    out = at(core, clock, 16.5, resumed(0, 100, seconds=6.2, ago=0.1))
    assert records(out, "training_resumed") == [{"node_rank": 0, "seconds": 6.2, "unseen": False,
                                                 "since_fault": pytest.approx(11.4)}]  # from the fault at +5
    assert records(out, "round_training_resumed") == []
    out = at(core, clock, 17, RecoverStatusReported(node_rank=1, host="h2", pid=201, strategy="recover",
                                                    rejoined=True))
    assert core.jobs["j"].state.value == "RUNNING" and records(out, "round_training_resumed") == []
    assert core.jobs["j"].info == "round 1 ended with recover 12.00s after its fault"  # not "recovered": not yet
    # the replacement's ranks, last: resumed 0.5 s before its report went out (a re-sent report is not late)
    out = at(core, clock, 19.5, resumed(1, 201, host="h2", seconds=2.1, ago=0.5))
    (done,) = records(out, "round_training_resumed")
    assert done == {"nodes": [0, 1], "unseen": [], "seconds": pytest.approx(14.0), "last_node": 1,
                    "since_loss": {"1": pytest.approx(14.0)}}  # from the fault (+5), not the declaration (+10)
    assert core.jobs["j"].info == "recovered round 1: training resumed 14.00s after its fault"
    # a duplicate (a client retry) is fine and changes nothing
    assert records(at(core, clock, 20, resumed(1, 201, host="h2", seconds=2.1, ago=0.5)), "training_resumed") == []
    (job,) = core.job_list("j").jobs
    (loss,) = job.rounds[0].nodeLosses
    assert loss.secondsToRoundEnd == pytest.approx(12.0) and loss.secondsToTrainingResumed == pytest.approx(14.0)
    assert job.rounds[0].durationSeconds == pytest.approx(12.0)
    assert job.rounds[0].secondsToTrainingResumed == pytest.approx(14.0)
    text = render_text(core.job_list("j"))
    assert "lost -> round ended 12.000s" in text and "lost -> training resumed 14.000s" in text, text
    assert json.loads(render_json(core.job_list("j")))["jobs"][0]["rounds"][0]["secondsToTrainingResumed"] == 14.0
    core.store.close()
    # a controller restart keeps it (the store), and what the round still waited for (the snapshot)
    again = make_core(tmp_path / "ctl.sqlite3", clock)
    again.load()
    (loss,) = again.job_list("j").jobs[0].rounds[0].nodeLosses
    assert loss.secondsToTrainingResumed == pytest.approx(14.0)
    assert again.jobs["j"].resume_watch == core.jobs["j"].resume_watch
    again.store.close()


def test_a_restart_between_two_nodes_reports_loses_neither(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    core = make_core(tmp_path / "ctl.sqlite3", clock)
    lose_and_replace_node_1(core, clock)
    at(core, clock, 17, RecoverStatusReported(node_rank=1, host="h2", pid=201, strategy="recover", rejoined=True))
    at(core, clock, 18, resumed(0, 100))
    core.store.close()
    clock.now = T0 + 30
    again = make_core(tmp_path / "ctl.sqlite3", clock)
    again.load()
    at(again, clock, 31, AgentRegistered(node_rank=1, host="h2", pid=201, ranks_per_node=2))
    (done,) = records(at(again, clock, 32, resumed(1, 201, host="h2", ago=1.0)), "round_training_resumed")
    assert done["seconds"] == pytest.approx(26.0) and done["last_node"] == 1  # node 1 at +31, the fault at +5
    assert again.job_list("j").jobs[0].rounds[0].nodeLosses[0].secondsToTrainingResumed == pytest.approx(26.0)
    again.store.close()


def test_reports_that_do_not_fit_the_job_are_refused_and_change_nothing(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    core = make_core(tmp_path / "ctl.sqlite3", clock)
    lose_and_replace_node_1(core, clock)
    m = core.jobs["j"]
    before = (m.resume_watch, m.updated_at, core.store.events("j"))
    refused = [
        (resumed(0, 100, round_=2), Code.OUT_OF_ORDER, "round 2 is not one job j is recovering or last recovered"),
        (resumed(1, 201, host="h2"), Code.OUT_OF_ORDER, "node 1 has not reported its recover status"),
        (resumed(1, 101), Code.FENCED, "declared lost"),  # the lost agent, back from a SIGSTOP
        (resumed(5, 105), Code.NOT_REGISTERED, "not registered"),
        (resumed(0, 100, ago=60.0), Code.INVALID_PARAMS, "before round 1's strategy was chosen"),
    ]
    for ev, code, words in refused:
        out = at(core, clock, 16.5, ev, code)
        assert words in out.info and out.records == [] and out.signals == [], out.info
    assert (m.resume_watch, m.updated_at, core.store.events("j")) == before
    assert core.dispatch("nope", resumed(0, 100)).code == Code.JOB_NOT_EXIST
    core.store.close()


@pytest.mark.parametrize(("field", "value", "words"), [
    ("jobId", "", "jobId is empty"),
    ("nodeRank", -1, "nodeRank"),
    ("round", 0, "round must be >= 1"),
    ("seconds", -0.5, "seconds must be finite and >= 0"),
    ("seconds", math.nan, "seconds must be finite and >= 0"),
    ("secondsAgo", math.inf, "secondsAgo must be finite and >= 0"),
    ("host", "x" * 5000, "host is 5000 characters long"),
])
def test_malformed_reports_are_refused_naming_the_field(field: str, value: Any, words: str) -> None:
    good = taskd_pb2.ResumedRequest(jobId="j", nodeRank=0, host="h", pid=1, round=1, seconds=1.0, secondsAgo=0.0)
    assert check_resumed(good) == ""
    bad = taskd_pb2.ResumedRequest()
    bad.CopyFrom(good)
    setattr(bad, field, value)
    assert words in check_resumed(bad)


def test_an_ordinary_round_counts_the_nodes_that_can_tell_and_a_failed_strategy_resets_them(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    core = make_core(tmp_path / "ctl.sqlite3", clock)
    two_nodes(core, clock)
    at(core, clock, 1, FaultReported(node_rank=1, faults={2: "1"}, host="h", pid=101))
    for n in (0, 1):
        at(core, clock, 2, StopComplete(node_rank=n, host="h", pid=100 + n, faults={2: "1"}))
    for n in (0, 1):
        at(core, clock, 3, StrategiesReported(node_rank=n, strategies=BOTH, host="h", pid=100 + n))
    at(core, clock, 4, RecoverStatusReported(node_rank=0, host="h", pid=100, strategy="recover"))
    at(core, clock, 4.5, resumed(0, 100))  # said under a strategy that then fails: it will not count
    at(core, clock, 5, RecoverStatusReported(node_rank=1, host="h", pid=101, strategy="recover", code=1, info="no"))
    assert core.jobs["j"].round.strategy == "job-rescheduling"
    for n in (0, 1):
        at(core, clock, 6, RecoverStatusReported(node_rank=n, host="h", pid=100 + n, strategy="job-rescheduling"))
    assert core.jobs["j"].state.value == "RUNNING"
    at(core, clock, 7, resumed(0, 100, unseen=True))  # its ranks write no heartbeat steps: it cannot tell
    (done,) = records(at(core, clock, 9, resumed(1, 101)), "round_training_resumed")
    assert done == {"nodes": [0, 1], "unseen": [0], "seconds": pytest.approx(8.0), "last_node": 1}
    (rnd,) = core.job_list("j").jobs[0].rounds
    assert rnd.secondsToTrainingResumed == pytest.approx(8.0) and rnd.durationSeconds == pytest.approx(5.0)
    assert "8.000s" in render_text(core.job_list("j"))
    # a new round opens: round 1 stays the one a late report counts in (said once)
    at(core, clock, 20, FaultReported(node_rank=0, faults={0: "1"}, host="h", pid=100))
    assert at(core, clock, 21, resumed(1, 101), Code.OK).info == "already counted for round 1"
    core.store.close()


def test_a_round_no_node_can_see_resume_records_no_time(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    core = make_core(tmp_path / "ctl.sqlite3", clock)
    assert core.init_job("j", JobInit(node_count=1, ranks_per_node=1)).code == Code.OK
    at(core, clock, 0, AgentRegistered(node_rank=0, host="h", pid=100, ranks_per_node=1))
    at(core, clock, 0, AgentConnected(node_rank=0, host="h", pid=100))
    at(core, clock, 1, FaultReported(node_rank=0, faults={0: "1"}, host="h", pid=100))
    at(core, clock, 2, StopComplete(node_rank=0, host="h", pid=100, faults={0: "1"}))
    at(core, clock, 3, StrategiesReported(node_rank=0, strategies=BOTH, host="h", pid=100))
    at(core, clock, 4, RecoverStatusReported(node_rank=0, host="h", pid=100, strategy="recover"))
    (done,) = records(at(core, clock, 5, resumed(0, 100, unseen=True)), "round_training_resumed")
    assert done == {"nodes": [0], "unseen": [0]}
    assert core.job_list("j").jobs[0].rounds[0].secondsToTrainingResumed == 0.0
    core.store.close()


def test_a_state_file_without_the_new_columns_gets_them(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE rounds (job_id TEXT NOT NULL, round INTEGER NOT NULL, started_at REAL NOT NULL,
            ended_at REAL NOT NULL DEFAULT 0, faults TEXT NOT NULL DEFAULT '', tried TEXT NOT NULL DEFAULT '[]',
            strategy TEXT NOT NULL DEFAULT '', outcome TEXT NOT NULL DEFAULT 'open', duration REAL NOT NULL DEFAULT 0,
            PRIMARY KEY (job_id, round));
        CREATE TABLE node_losses (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, round INTEGER NOT NULL,
            node_rank INTEGER NOT NULL, old_host TEXT NOT NULL DEFAULT '', old_pid INTEGER NOT NULL DEFAULT 0,
            lost_at REAL NOT NULL, new_host TEXT NOT NULL DEFAULT '', new_pid INTEGER NOT NULL DEFAULT 0,
            replaced_at REAL NOT NULL DEFAULT 0, standby INTEGER NOT NULL DEFAULT 0,
            seconds_to_round_end REAL NOT NULL DEFAULT 0);
        INSERT INTO rounds (job_id, round, started_at, duration) VALUES ('old', 1, 5.0, 2.0);
        INSERT INTO node_losses (job_id, round, node_rank, lost_at) VALUES ('old', 1, 1, 5.0);
    """)
    conn.close()
    store = Store(path)
    assert store.rounds("old")[0]["training_resumed"] == 0.0
    assert store.node_losses("old")[0]["seconds_to_training_resumed"] == 0.0
    store.close()


def test_the_round_account_says_where_each_node_restored_from_and_the_steps_redone(tmp_path: Path) -> None:
    """Issue 33: a node's report carries its restarted ranks' restore sources (`restores`), kept with its
    `training_resumed` event; a source outside the vocabulary is refused naming the field."""
    clock = ManualClock(T0)
    core = make_core(tmp_path / "ctl.sqlite3", clock)
    lose_and_replace_node_1(core, clock)
    at(core, clock, 17, RecoverStatusReported(node_rank=1, host="h2", pid=201, strategy="recover", rejoined=True))
    ev = TrainingResumed(node_rank=1, host="h2", pid=201, round=1, seconds=2.0, seconds_ago=0.0,
                         restores=((2, "buddy", 9, 1), (3, "buddy", 9, 0)))
    out = at(core, clock, 18, ev)
    (said,) = records(out, "training_resumed")
    assert said["restored_from"] == {"2": "buddy", "3": "buddy"} and said["restored_step"] == {"2": 9, "3": 9}
    assert said["steps_redone"] == 1
    good = taskd_pb2.ResumedRequest(jobId="j", nodeRank=0, host="h", pid=1, round=1, seconds=1.0, restores=[
        taskd_pb2.RankRestore(rank=0, source="memory", step=4, stepsRedone=0)])
    assert check_resumed(good) == ""
    good.restores[0].source = "tape"
    assert "restores: rank 0 source 'tape'" in check_resumed(good)
    core.store.close()


def test_the_round_closing_event_and_taskd_status_collect_each_nodes_restore(tmp_path: Path) -> None:
    """Issue 33: `round_training_resumed` (the event that closes the round's account) names, per node, where its
    ranks restored from, the step and the steps redone; a controller restart between the two nodes' reports keeps
    the first node's (the job's snapshot); `taskd status`'s text view shows it; a node that cannot tell when its
    ranks resumed (unseen) still says where they restored from."""
    clock = ManualClock(T0)
    core = make_core(tmp_path / "ctl.sqlite3", clock)
    lose_and_replace_node_1(core, clock)
    at(core, clock, 16.5, TrainingResumed(node_rank=0, host="h", pid=100, round=1, seconds=6.0, seconds_ago=0.0,
                                          restores=((0, "memory", 9, 0), (1, "memory", 9, 2))))
    core.store.close()
    core = make_core(tmp_path / "ctl.sqlite3", clock)
    core.load()
    at(core, clock, 17, RecoverStatusReported(node_rank=1, host="h2", pid=201, strategy="recover", rejoined=True))
    out = at(core, clock, 18, TrainingResumed(node_rank=1, host="h2", pid=201, round=1, seconds=0.0,
                                              seconds_ago=0.0, unseen=True,
                                              restores=((2, "buddy", 9, 1), (3, "disk", 0, -1))))
    (done,) = records(out, "round_training_resumed")
    assert done["restored"] == {"0": {"from": "memory", "step": 9, "steps_redone": 2},
                                "1": {"from": "buddy, disk", "step": 0, "steps_redone": 2}}, done  # node 0 had 11
    assert done["unseen"] == [1]
    text = render_text(core.job_list("j"))
    assert ("round 1: restored node 0 from memory at step 9, 2 step(s) redone; node 1 from buddy, disk at step 0, "
            "2 step(s) redone") in text, text
    core.store.close()


def test_a_buddy_restore_redoes_the_steps_the_job_had_reached_not_only_those_its_copy_held(tmp_path: Path) -> None:
    """Issue 33: node 1's ranks restored step 9 from the buddy's copy, whose newest was 9 (its rank says 0 redone),
    while node 0's ranks had reached step 13 in their own memory: node 1's ranks, in step with them, had reached
    it too, so the account says 4 steps redone for node 1 (it said 0, counting from the copy's newest)."""
    clock = ManualClock(T0)
    core = make_core(tmp_path / "ctl.sqlite3", clock)
    lose_and_replace_node_1(core, clock)
    at(core, clock, 16.5, TrainingResumed(node_rank=0, host="h", pid=100, round=1, seconds=6.0, seconds_ago=0.0,
                                          restores=((0, "memory", 9, 4), (1, "memory", 9, 3))))
    at(core, clock, 17, RecoverStatusReported(node_rank=1, host="h2", pid=201, strategy="recover", rejoined=True))
    out = at(core, clock, 18, TrainingResumed(node_rank=1, host="h2", pid=201, round=1, seconds=1.0, seconds_ago=0.0,
                                              restores=((2, "buddy", 9, 0), (3, "buddy", 9, 0))))
    (said,) = records(out, "training_resumed")
    assert said["steps_redone"] == 4, said
    (done,) = records(out, "round_training_resumed")
    assert done["restored"]["1"] == {"from": "buddy", "step": 9, "steps_redone": 4}, done
    assert done["restored"]["0"]["steps_redone"] == 4
    core.store.close()


def test_ranks_restoring_steps_of_their_own_keep_the_steps_redone_they_said(tmp_path: Path) -> None:
    """Scope "rank" (ranks that exchange no state): node 0's ranks ran on to step 190 while node 1 was replaced;
    node 1's restored 131 from the buddy's copy. They were never in step, so 190 says nothing of node 1's."""
    clock = ManualClock(T0)
    core = make_core(tmp_path / "ctl.sqlite3", clock)
    lose_and_replace_node_1(core, clock)
    at(core, clock, 16.5, TrainingResumed(node_rank=0, host="h", pid=100, round=1, seconds=6.0, seconds_ago=0.0,
                                          restores=((0, "memory", 190, 0), (1, "memory", 189, 0))))
    at(core, clock, 17, RecoverStatusReported(node_rank=1, host="h2", pid=201, strategy="recover", rejoined=True))
    out = at(core, clock, 18, TrainingResumed(node_rank=1, host="h2", pid=201, round=1, seconds=1.0, seconds_ago=0.0,
                                              restores=((2, "buddy", 131, 0), (3, "buddy", 131, 1))))
    (done,) = records(out, "round_training_resumed")
    assert done["restored"]["1"] == {"from": "buddy", "step": 131, "steps_redone": 1}, done
    core.store.close()
