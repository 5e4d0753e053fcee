"""What `conceal` writes over the agent's argument and environment areas (issue 31, F4): pure byte functions."""

from __future__ import annotations

from taskd.process.conceal import blanked, without_values
from taskd.worker.env import is_credential_var

FLAGS = ("--token-file", "--token_file", "--tls-key", "--tls_key")


def argv(*args: str) -> bytes:
    return b"".join(a.encode() + b"\0" for a in args)


def test_a_credential_flag_and_its_value_go_and_the_rest_moves_up() -> None:
    block = argv("python", "-m", "taskd.run", "--token-file", "/s/token", "--nproc-per-node", "2", "train.py")
    out = without_values(block, ["/s/token"], FLAGS)
    assert len(out) == len(block)
    assert out.rstrip(b"\0") + b"\0" == argv("python", "-m", "taskd.run", "--nproc-per-node", "2", "train.py")
    assert b"/s/token" not in out and b"--token-file" not in out


def test_every_form_argparse_accepts_is_removed() -> None:
    block = argv("taskd", "--token_file=/s/token", "--tok", "/s/token", "--tls-key", "/s/key", "x.py", "/s/token2")
    out = without_values(block, ["/s/token", "/s/key"], FLAGS)
    assert out.rstrip(b"\0") + b"\0" == argv("taskd", "x.py", "/s/token2")


def test_a_value_that_is_not_after_a_credential_flag_goes_alone_and_no_value_changes_nothing() -> None:
    block = argv("taskd", "--job-id", "/s/token", "x.py")
    assert without_values(block, ["/s/token"], FLAGS).rstrip(b"\0") + b"\0" == argv("taskd", "--job-id", "x.py")
    assert without_values(block, [], FLAGS) == block
    assert without_values(block, ["/elsewhere"], FLAGS) == block


def test_credential_variables_are_blanked_in_place_and_every_other_entry_keeps_its_offset() -> None:
    block = b"HOME=/root\0TASKD_TOKEN_FILE=/s/token\0PATH=/bin\0TASKD_TLS_KEY=/s/key\0RANK=0\0"
    out = blanked(block, is_credential_var)
    assert len(out) == len(block) and b"/s/" not in out and b"TASKD_" not in out
    for entry in (b"HOME=/root", b"PATH=/bin", b"RANK=0"):
        assert out.index(entry) == block.index(entry)
