"""Fixtures shared by several test files (plain helpers live in support.py)."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator

import pytest
from support import STARTED


@pytest.fixture
def taskd_logging() -> Iterator[None]:
    """`taskd.cli.main` configures the "taskd" logger for a console; undo it for the tests that follow."""
    logger = logging.getLogger("taskd")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture(autouse=True)
def no_process_outlives_its_test() -> Iterator[None]:
    """A test that fails before its own cleanup must not leave a `taskd run` behind (one did, for an hour)."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
