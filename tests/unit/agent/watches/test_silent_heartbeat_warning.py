"""Hang detection is silently off when no rank ever beats (issue 18): the agent must say so, once."""

from __future__ import annotations

import logging
import os

import psutil

from taskd.agent.ranks.launcher import MSRUN
from taskd.agent.ranks.table import Rank, RankState
from taskd.agent.watches.hangs import HangWatch


def this_process_as_a_rank() -> Rank:
    proc = psutil.Process()
    return Rank(local_rank=0, global_rank=0, pid=os.getpid(), proc=proc, state=RankState.RUNNING)


def test_warns_once_when_no_rank_beat_for_twice_the_timeout(caplog) -> None:
    watch = HangWatch(MSRUN, 5.0, lambda rank: None)  # msrun-like, no heartbeat directory: nobody beats
    rank = this_process_as_a_rank()
    started = rank.proc.create_time()
    with caplog.at_level(logging.WARNING, logger="taskd.agent"):
        assert watch.culprits([rank], started + 9.0) == ([], [])  # 9 s < 2 x 5 s: too early to say
        assert "no rank has sent a heartbeat" not in caplog.text
        watch.culprits([rank], started + 10.5)
        watch.culprits([rank], started + 30.0)
    assert caplog.text.count("no rank has sent a heartbeat") == 1
    assert "TaskdCallback" in caplog.text and "heartbeat timeout 5s" in caplog.text


def test_no_warning_without_a_heartbeat_timeout(caplog) -> None:
    watch = HangWatch(MSRUN, None, lambda rank: None)
    rank = this_process_as_a_rank()
    with caplog.at_level(logging.WARNING, logger="taskd.agent"):
        watch.culprits([rank], rank.proc.create_time() + 3600)
    assert "no rank has sent a heartbeat" not in caplog.text
