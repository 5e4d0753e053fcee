"""The tests of tests/e2e/launcher/test_launcher_torchrun.py that start no process and open no network
socket (the unit tier).

Split from it by move_tests.py; its subject: The launcher gives a torch script what torchrun gives
it: environment, @record error files, output routing.
"""

from __future__ import annotations

import json
from pathlib import Path

from taskd.launcher.error_file import read_error_file
from taskd.launcher.output import RankLog, RankOutput


def test_error_file_forms_and_refusals(tmp_path: Path):
    new_form = tmp_path / "new.json"
    new_form.write_text(json.dumps({"message": "RuntimeError: x", "timestamp": "12"}))
    error = read_error_file(str(new_form))
    assert (error.exception, error.traceback, error.timestamp) == ("RuntimeError: x", "", 12)
    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    assert read_error_file(str(junk)) is None
    assert read_error_file(str(tmp_path / "missing.json")) is None
    link = tmp_path / "link.json"
    link.symlink_to(new_form)
    assert read_error_file(str(link)) is None  # O_NOFOLLOW: never read through a planted link


def test_prefix_rule_without_torch(tmp_path: Path, capsys):
    output = RankOutput(RankLog(None), "[rank3]: ", console=True)
    output.feed(b"[rank3]: from torch\n[rank3]:[W init.cpp] warning\nmine\n[rank30]: not mine\n")
    output.finish()
    assert capsys.readouterr().out.splitlines() == [
        "[rank3]: from torch", "[rank3]:[W init.cpp] warning", "[rank3]: mine", "[rank3]: [rank30]: not mine"]
