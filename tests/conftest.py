"""Fixtures shared by several test files (plain helpers live in the package support/)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import STARTED


@pytest.fixture(scope="session", autouse=True)
def session_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """$TMPDIR of this process and of every process a test starts: one directory, removed when the session ends.

    Processes the tests SIGKILL cannot clean up after themselves: an msrun killed in a test's teardown
    leaves the `taskd-heartbeat-*` directory its taskd agent made in $TMPDIR. They now land here.
    """
    tmp_path_factory.getbasetemp()  # pytest's own temp dirs stay where they were (kept for inspection)
    path = Path(tempfile.mkdtemp(prefix="taskd-tests-"))
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = None  # gettempdir() reads $TMPDIR again
    try:
        yield path
    finally:
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        tempfile.tempdir = saved_tempdir
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Certificates for 127.0.0.1 (support/pki.py); the test skips when the cryptography package is missing."""
    from support.pki import make_pki  # imported here: it skips the test, not the session, without cryptography

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def no_current_manager() -> Iterator[None]:
    """No process-wide client manager before or after the test (the client's unit and e2e tests)."""
    from taskd.client import current
    from taskd.client.manager import DLRecoverManager

    current.set_manager(None)
    DLRecoverManager.reset_instance()
    yield
    current.set_manager(None)
    DLRecoverManager.reset_instance()


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
