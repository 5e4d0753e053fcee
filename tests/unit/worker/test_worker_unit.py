"""The tests of tests/e2e/worker/test_worker.py that start no process and open no network socket (the
unit tier).

Split from it by move_tests.py; its subject: taskd.worker: rank info, heartbeats, sections and save
requests between real processes.
"""

from __future__ import annotations

import pytest
from support.worker import LAUNCHER_VARS

from taskd import worker


@pytest.fixture
def no_launcher(monkeypatch):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)


def test_defaults_outside_any_launcher(no_launcher):
    assert (worker.rank(), worker.local_rank(), worker.world_size(), worker.restart_count()) == (0, 0, 1, 0)
    assert worker.job_id() is None


def test_torchrun_environment(no_launcher, monkeypatch):
    for k, v in {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RESTART_COUNT": "2"}.items():
        monkeypatch.setenv(k, v)
    assert (worker.rank(), worker.local_rank(), worker.world_size(), worker.restart_count()) == (5, 1, 8, 2)


def test_msrun_environment(no_launcher, monkeypatch):
    for k, v in {"RANK_ID": "3", "DEVICE_ID": "3", "RANK_SIZE": "4", "MS_WORKER_NUM": "4"}.items():
        monkeypatch.setenv(k, v)
    assert (worker.rank(), worker.local_rank(), worker.world_size(), worker.restart_count()) == (3, 3, 4, 0)


def test_taskd_restart_count_wins(no_launcher, monkeypatch):
    monkeypatch.setenv("TASKD_RESTART_COUNT", "4")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TASKD_JOB_ID", "job-9")
    assert worker.restart_count() == 4 and worker.job_id() == "job-9"


def test_device_id_alone_is_not_a_local_rank(no_launcher, monkeypatch):
    monkeypatch.setenv("DEVICE_ID", "6")  # a user pinning a device, no launcher
    assert worker.local_rank() == 0


def test_non_integer_rank_is_skipped_with_a_warning(no_launcher, monkeypatch, caplog):
    monkeypatch.setenv("RANK", "two")
    monkeypatch.setenv("RANK_ID", "2")
    assert worker.rank() == 2
    assert "RANK='two'" in caplog.text


def test_section_rejects_bad_timeout():
    with pytest.raises(ValueError):
        with worker.section("x", timeout=0):
            pass
