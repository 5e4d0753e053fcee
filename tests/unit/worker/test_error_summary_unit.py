"""The line a failed step's warning names its error by (taskd/worker/progress.py error_summary): a dump's
exit may stop the rank before its traceback is printed, so this line is the only trace of the error."""

from __future__ import annotations

from taskd.worker.progress import error_summary

MINDSPORE = """
----------------------------------------------------
- Kernel error:
----------------------------------------------------
Launch kernel failed: Default/AllReduce-op0

----------------------------------------------------
- The Function Call Stack: (For framework developers)
"""


def test_mindspore_errors_are_named_by_the_line_under_their_section_titles() -> None:
    assert error_summary(RuntimeError(MINDSPORE)) == "RuntimeError: Launch kernel failed: Default/AllReduce-op0"


def test_other_errors_are_named_by_their_first_line_cut_to_300_characters() -> None:
    assert error_summary(TimeoutError("read timed out\nmore")) == "TimeoutError: read timed out"
    assert error_summary(ValueError("x" * 500)) == "ValueError: " + "x" * 300


def test_an_error_without_a_message_is_named_by_its_type() -> None:
    assert error_summary(ConnectionResetError()) == "ConnectionResetError"
    assert error_summary(RuntimeError("\n---\n- title:\n")) == "RuntimeError"
