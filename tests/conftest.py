"""Fixtures shared by several test files (plain helpers live in support.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def taskd_logging() -> Iterator[None]:
    """`taskd.cli.main` configures the "taskd" logger for a console; undo it for the tests that follow."""
    logger = logging.getLogger("taskd")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved
