"""Which stale rank hung (taskd.agent.watches.culprit): the decision alone, on the cases issue 18 measured.

The dumps are faulthandler's as real MindSpore 2.10 ranks wrote them (tests/mindspore_scripts/ms_stall.py,
rank 1 stalled after its step-20 heartbeat, rank 0 waiting in the next AllReduce).
"""

from __future__ import annotations

import pytest

from taskd.agent.watches.culprit import (
    STOP_GAP,
    STOP_LOOK,
    STOPPED_AFTER,
    StopLooks,
    Suspect,
    decide,
    stall_in_sight,
    waits_in_framework,
)

SITE = "/work/main/.venv/lib/python3.11/site-packages"
WAITING_DUMP = f"""rank 0 pid 27659 started (first incarnation)
Current thread 0x00007fda2c82eb80 (most recent call first):
  File "{SITE}/mindspore/common/tensor.py", line 1090 in asnumpy
  File "/work/tests/mindspore_scripts/ms_stall.py", line 75 in main
  File "/work/tests/mindspore_scripts/ms_stall.py", line 94 in <module>
"""
STALLED_DUMP = """rank 1 stalls after the AllReduce of step 20
Current thread 0x00007f801b333b80 (most recent call first):
  File "/work/tests/mindspore_scripts/ms_stall.py", line 47 in stall_forever
  File "/work/tests/mindspore_scripts/ms_stall.py", line 83 in main
  File "/work/tests/mindspore_scripts/ms_stall.py", line 94 in <module>
"""
TIMEOUT = 4.0


def rank(r: int, step: int | None = 35, quiet: float = 5.0, stale: bool = True, **kw) -> Suspect:
    return Suspect(rank=r, stale=stale, step=step, quiet=quiet, **kw)


def test_stopped_rank_is_the_culprit_even_when_its_heartbeat_is_the_newer_one() -> None:
    """The issue's case: both at step 35, rank 0's heartbeat 2 ms older, rank 1 SIGSTOPped."""
    verdict = decide([rank(0, quiet=5.002), rank(1, quiet=5.0, stopped=True)], TIMEOUT)
    assert verdict.decided and verdict.culprits == (1,) and verdict.waiting == (0,)
    assert "stopped" in verdict.reason


def test_a_stopped_rank_not_yet_past_its_deadline_is_the_culprit_of_the_stale_one() -> None:
    """rank 1 beat last, then was stopped: rank 0 goes stale first, waiting on it."""
    verdict = decide([rank(0, quiet=4.1), rank(1, quiet=4.05, stale=False, stopped=True)], TIMEOUT)
    assert verdict.culprits == (1,) and verdict.waiting == (0,)


def test_same_step_heartbeats_are_equal_whatever_their_times() -> None:
    """Neither the older (the old rule's pick) nor the newer heartbeat is evidence: the stacks are asked for."""
    for quiets in ((5.002, 5.0), (5.0, 5.4)):
        verdict = decide([rank(0, quiet=quiets[0]), rank(1, quiet=quiets[1])], TIMEOUT)
        assert verdict.need_stacks and not verdict.culprits


def test_same_step_the_stacks_decide_the_sleeping_rank() -> None:
    suspects = [rank(0, quiet=5.002, in_framework=waits_in_framework(WAITING_DUMP)),
                rank(1, quiet=5.0, in_framework=waits_in_framework(STALLED_DUMP))]
    verdict = decide(suspects, TIMEOUT, stacks_taken=True)
    assert verdict.decided and verdict.culprits == (1,) and verdict.waiting == (0,)
    assert "script's own code" in verdict.reason


def test_stacks_that_do_not_decide_say_cannot_tell_and_fault_every_stale_rank() -> None:
    for dumps in ((WAITING_DUMP, WAITING_DUMP), (STALLED_DUMP, STALLED_DUMP), ("", ""), (WAITING_DUMP, "")):
        suspects = [rank(r, quiet=2 * TIMEOUT + 1, in_framework=waits_in_framework(d)) for r, d in enumerate(dumps)]
        verdict = decide(suspects, TIMEOUT, stacks_taken=True)
        assert not verdict.decided, dumps
        assert verdict.culprits == (0, 1) and verdict.waiting == ()
        assert verdict.reason.startswith("cannot tell which rank hung: ranks [0, 1] stopped beating at step 35")


def test_a_rank_at_an_earlier_step_than_the_others_is_the_culprit() -> None:
    verdict = decide([rank(0, step=9, stale=False, quiet=0.1), rank(1, step=5)], TIMEOUT)
    assert verdict.culprits == (1,) and verdict.waiting == ()
    assert "step 5, the others' at step 9" in verdict.reason
    verdict = decide([rank(0, step=36), rank(1, step=35), rank(2, step=36)], TIMEOUT)  # all stale
    assert verdict.culprits == (1,) and verdict.waiting == (0, 2)


def test_without_steps_only_a_gap_over_half_the_timeout_counts() -> None:
    assert decide([rank(0, step=None, quiet=4.5), rank(1, step=None, quiet=4.4)], TIMEOUT).need_stacks
    verdict = decide([rank(0, step=None, quiet=0.5, stale=False), rank(1, step=None, quiet=4.5)], TIMEOUT)
    assert verdict.culprits == (1,)


def test_a_stale_rank_whose_peer_still_beats_at_the_same_step_waits_for_the_next_sweep() -> None:
    suspects = [rank(0, quiet=3.9, stale=False), rank(1, quiet=4.1)]
    verdict = decide(suspects, TIMEOUT)
    assert verdict.defer and not verdict.culprits
    late = decide([rank(0, quiet=0.2, stale=False), rank(1, quiet=2 * TIMEOUT + 0.1)], TIMEOUT)
    assert not late.defer  # bounded: past twice the timeout it is judged on what there is
    assert late.need_stacks


def test_collective_markers_say_who_waits() -> None:
    suspects = [rank(0, marked=True, waiting=True), rank(1, marked=True), rank(2, marked=True, waiting=True)]
    verdict = decide(suspects, TIMEOUT)
    assert verdict.culprits == (1,) and verdict.waiting == (0, 2)
    all_wait = decide([rank(0, marked=True, waiting=True), rank(1, marked=True, waiting=True)], TIMEOUT)
    assert all_wait.culprits == () and all_wait.waiting == (0, 1)  # the culprit is on another node
    stopped = decide([rank(0, marked=True, waiting=True, stopped=True), rank(1, marked=True, waiting=True)],
                     TIMEOUT)
    assert stopped.culprits == (0,)


def test_a_lone_rank_is_named_only_when_its_stacks_say_it_waits_on_nothing() -> None:
    own = decide([rank(1, in_framework=False)], TIMEOUT, stacks_taken=True)
    assert own.decided and own.culprits == (1,)
    unknown = decide([rank(0, in_framework=None)], TIMEOUT, stacks_taken=True)
    assert not unknown.decided and unknown.culprits == (0,)
    assert "may be on another node" in unknown.reason


def test_ranks_all_waiting_inside_the_framework_leave_the_naming_to_another_node_for_a_while() -> None:
    """Two nodes, one rank each: node 0's rank waits in the AllReduce for node 1's, which node 1's agent
    names; node 0 judges its rank only past twice the timeout (then: cannot tell)."""
    early = decide([rank(0, quiet=TIMEOUT + 0.5, in_framework=True)], TIMEOUT, stacks_taken=True)
    assert early.defer and not early.culprits
    both = decide([rank(0, in_framework=True), rank(1, in_framework=True)], TIMEOUT, stacks_taken=True)
    assert both.defer
    late = decide([rank(0, quiet=2 * TIMEOUT + 0.5, in_framework=True)], TIMEOUT, stacks_taken=True)
    assert not late.decided and late.culprits == (0,) and "inside the framework" in late.reason


def test_nothing_stale_nothing_to_decide() -> None:
    verdict = decide([rank(0, stale=False), rank(1, stale=False)], TIMEOUT)
    assert verdict.culprits == () and not verdict.need_stacks and not verdict.defer


@pytest.mark.parametrize(("dump", "expected"), [
    (WAITING_DUMP, True),
    (STALLED_DUMP, False),
    ("", None),
    ("rank 0 started\n", None),
    # the standard library is looked through: a lock taken inside torch waits in torch ...
    (f'Current thread 0x1 (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
     f'  File "{SITE}/torch/distributed/distributed_c10d.py", line 2501 in all_reduce\n'
     '  File "/w/train.py", line 9 in main\n', True),
    # ... and one the script takes itself waits in the script
    ('Current thread 0x1 (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
     '  File "/w/train.py", line 9 in main\n', False),
    # only the main ("Current") thread counts, not a framework thread beside it
    (f'Thread 0x2 (most recent call first):\n  File "{SITE}/mindspore/dataset/engine/iterators.py", line 5 in x\n\n'
     'Current thread 0x1 (most recent call first):\n  File "/w/train.py", line 9 in main\n', False),
    # a script in a directory called "mindspore" is the script's own code (measured: examples/mindspore/,
    # a Model.train callback of the script's that sleeps, called from inside mindspore/train/model.py)
    ('Current thread 0x1 (most recent call first):\n'
     '  File "/work/examples/mindspore/train_model.py", line 143 in on_train_step_end\n'
     f'  File "{SITE}/mindspore/train/callback/_callback.py", line 435 in on_train_step_end\n'
     f'  File "{SITE}/mindspore/train/model.py", line 1272 in _train_process\n', False),
    (f'Current thread 0x1 (most recent call first):\n  File "{SITE}/mindspore/graph/api.py", line 695 in compile\n'
     '  File "/work/examples/mindspore/train_model.py", line 148 in main\n', True),
    # py-spy's format
    (f'Thread 4242 (idle): "MainThread"\n    asnumpy ({SITE}/mindspore/common/tensor.py:1090)\n'
     '    main (/w/ms_stall.py:75)\n', True),
])
def test_where_a_dump_waits(dump: str, expected: bool | None) -> None:
    assert waits_in_framework(dump) is expected


# -- the hang timeout derived from the step times (issue 37: on by default under msrun) ------------------------

def test_auto_timeout_needs_two_step_times_and_skips_the_first_step() -> None:
    from taskd.agent.watches.culprit import AUTO_FLOOR, AutoTimeout

    auto = AutoTimeout()
    auto.observe(0, 0, 100.0)
    auto.observe(0, 1, 160.0)  # the first step (compilation): no sample
    assert auto.value is None and auto.slowest == 0.0
    auto.observe(0, 2, 160.2)
    assert auto.value is None  # one sample is not enough
    auto.observe(0, 4, 160.6)
    assert auto.samples == 2 and auto.slowest == pytest.approx(0.2)
    assert auto.value == AUTO_FLOOR  # 10 x 0.2 s is under the floor


def test_auto_timeout_grows_with_slow_steps_and_stays_under_the_collective_cap() -> None:
    from taskd.agent.watches.culprit import AUTO_FACTOR, AutoTimeout

    auto = AutoTimeout()
    for step, when in ((1, 1.0), (2, 3.0), (3, 5.0)):
        auto.observe(3, step, when)
    assert auto.value == pytest.approx(AUTO_FACTOR * 2.0)
    capped = AutoTimeout(cap=15.0)
    for step, when in ((1, 1.0), (2, 3.0), (3, 5.0)):
        capped.observe(3, step, when)
    assert capped.value == pytest.approx(15.0)
    slow = AutoTimeout(cap=15.0)  # steps slower than the cap allows: never under two steps
    for step, when in ((1, 1.0), (2, 11.0), (3, 21.0)):
        slow.observe(3, step, when)
    assert slow.value == pytest.approx(20.0)


def test_auto_timeout_forgets_a_restarted_rank_and_ignores_repeats() -> None:
    from taskd.agent.watches.culprit import AutoTimeout

    auto = AutoTimeout()
    auto.observe(1, 5, 10.0)
    auto.observe(1, 5, 10.0)  # the same beat read twice in a sweep
    auto.forget(1)
    auto.observe(1, 3, 50.0)  # the restarted rank's first beat: no step advance of the old one's
    assert auto.samples == 0


def test_collective_timeout_is_the_lowest_one_set() -> None:
    from taskd.agent.watches.culprit import collective_timeout

    assert collective_timeout({}) is None
    assert collective_timeout({"MS_CPU_COMM_OP_TIMEOUT": "12", "HCCL_EXEC_TIMEOUT": "1836"}) == 12.0
    assert collective_timeout({"HCCL_EXEC_TIMEOUT": "300", "MS_CPU_COMM_OP_TIMEOUT": "junk"}) == 300.0
    assert collective_timeout({"MS_CPU_COMM_OP_TIMEOUT": "0"}) is None


def test_a_derived_timeout_judges_only_a_stall_in_sight() -> None:
    """A rank quiet alone (its peers exited or on other nodes) may be finishing: not judged without a setting."""
    lone = Suspect(rank=1, stale=True, step=40, quiet=6.0)
    assert not stall_in_sight([lone], 5.0)
    assert stall_in_sight([lone, Suspect(rank=0, stale=True, step=41, quiet=5.8)], 5.0)  # rank 0 waits on it
    assert not stall_in_sight([lone, Suspect(rank=0, stale=False, step=41, quiet=0.3)], 5.0)  # rank 0 trains on
    assert stall_in_sight([Suspect(rank=1, stale=False, step=40, quiet=2.1, stopped=True)], 5.0)  # SIGSTOP


def test_a_rank_seen_stopped_at_every_look_for_stopped_after_is_due() -> None:
    looks = StopLooks()
    t = 100.0
    assert not looks.look([(1, 501)], t)  # first seen stopped
    while t + STOP_LOOK < 100.0 + STOPPED_AFTER:
        t += STOP_LOOK
        assert not looks.look([(1, 501)], t)
    t += STOP_LOOK
    assert looks.look([(1, 501)], t)
    assert looks.held(1, 501) >= STOPPED_AFTER and looks.held(0, 500) == 0.0
    assert looks.next_at == t + STOP_LOOK


def test_a_look_that_sees_it_running_starts_the_count_over() -> None:
    looks = StopLooks()
    looks.look([(1, 501)], 0.0)
    looks.look([], STOP_LOOK)  # SIGCONT: running again
    assert looks.held(1, 501) == 0.0
    t = 2 * STOP_LOOK
    while t < 2 * STOP_LOOK + STOPPED_AFTER:
        assert not looks.look([(1, 501)], t)
        t += STOP_LOOK
    assert looks.look([(1, 501)], t)


def test_after_a_gap_in_the_looks_the_agent_itself_was_stopped_and_counts_anew() -> None:
    """`scontrol suspend` stops the agent with its ranks; continued first, it finds them still stopped for a
    moment, with a heartbeat as old as the suspension: the gap in its own looks says not to believe it yet."""
    looks = StopLooks()
    looks.look([(1, 501)], 0.0)  # the ranks stopped a moment before the agent
    assert not looks.look([(1, 501)], 3600.0)  # continued an hour later, the rank not yet
    assert looks.held(1, 501) == 0.0
    assert not looks.look([], 3600.0 + STOP_LOOK)  # its SIGCONT arrived
    assert STOP_GAP > STOP_LOOK


def test_a_new_process_of_the_same_rank_is_counted_apart() -> None:
    looks = StopLooks()
    looks.look([(1, 501)], 0.0)
    looks.look([(1, 777)], STOP_LOOK)  # replaced by a new process, stopped too
    assert looks.held(1, 501) == 0.0 and looks.held(1, 777) == 0.0
