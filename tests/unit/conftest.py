"""The unit tier enforces its own rule: no test under tests/unit/ starts a process or opens a network socket.

The hooks (tier_guard.py) wrap the import of each test module and each test's setup, body and
teardown; pytest runs a conftest's collection and runtest hooks only for the tests beneath it, so
tests/e2e/ is untouched.
"""

from tier_guard import (
    pytest_make_collect_report,
    pytest_runtest_call,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)

__all__ = ["pytest_make_collect_report", "pytest_runtest_call", "pytest_runtest_setup", "pytest_runtest_teardown"]
