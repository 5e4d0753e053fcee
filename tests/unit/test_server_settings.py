"""`taskd server`'s settings are rows of the table (taskd/server_settings.py): ControllerConfig's and MachineConfig's
defaults, the argparse flags (default, type, metavar, help) and the flag names errors give all come from the rows,
and `taskd server` reads its one variable (TASKD_TOKEN_FILE) through the table; `taskd status`, `token` and
`migrate`'s flags are rows too (`COMMAND_FLAGS`), and docs/controller.md's table of them is generated."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from taskd.controller.cli_commands import add_server_arguments, server_config
from taskd.controller.config import FLAGS, ControllerConfig
from taskd.server_settings import (
    COMMANDS,
    SERVER_SETTINGS,
    TOKEN_ENV,
    CommandFlag,
    ServerSetting,
    _check,
    _check_commands,
    add_command_flags,
    add_server_flags,
    command_flags,
    flag_dest,
    server_default,
)
from taskd.settings import setting

ROOT = Path(__file__).resolve().parents[2]
FIELDS = [s for s in SERVER_SETTINGS if s.field]
PROGRAMMATIC = {"extra_options", "token"}  # a list (default_factory) and a secret handed in-process: no row


def _parser(environ: dict[str, str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskd server")
    if environ is None:
        add_server_arguments(parser)
    else:
        add_server_flags(parser, environ)
    return parser


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings and a.dest != "help"}


@pytest.mark.parametrize("s", FIELDS, ids=lambda s: s.field)
def test_controller_config_defaults_are_the_tables(s: ServerSetting) -> None:
    [f] = [f for f in dataclasses.fields(ControllerConfig) if f.name == s.field]
    assert f.default == s.default == server_default(s.field)


def test_every_controller_config_field_has_a_row() -> None:
    names = {f.name for f in dataclasses.fields(ControllerConfig)} - PROGRAMMATIC
    assert names == {s.field for s in FIELDS}


def test_a_setting_shared_with_the_agent_has_one_default() -> None:
    shared = [s for s in SERVER_SETTINGS if s.same]
    assert {s.same for s in shared} == {"max_restarts", "join_timeout", "node_rejoin_timeout", "last_call_timeout"}
    for s in shared:
        assert s.default == setting(s.same).default and setting(s.same).server_flag == s.flag


@pytest.mark.parametrize("s", [s for s in SERVER_SETTINGS if s.flag], ids=lambda s: s.flag)
def test_each_flag_is_the_rows(s: ServerSetting) -> None:
    action = _actions(_parser({}))[s.flag]
    assert action.help == s.help_text() and (action.metavar or None) == s.metavar
    assert action.default == s.default
    if s.field:
        assert FLAGS[s.field].split()[0] == s.flag


def test_the_parser_has_a_flag_for_each_row_and_no_other() -> None:
    assert list(_actions(_parser({}))) == [s.flag for s in SERVER_SETTINGS if s.flag], "in the table's order"


def test_the_help_names_the_default_from_the_row() -> None:
    [row] = [s for s in SERVER_SETTINGS if s.field == "agent_loss_timeout"]
    assert row.help_text().endswith("(default 30)")
    assert "(default 600)" in _actions(_parser({}))["--idle-timeout"].help


def test_the_token_file_variable_is_read_by_the_table_and_named_in_errors() -> None:
    assert _parser({TOKEN_ENV: "/run/token"}).parse_args([]).token_file == "/run/token"
    assert _parser({TOKEN_ENV: ""}).parse_args([]).token_file is None
    assert FLAGS["token_file"] == f"--token-file or {TOKEN_ENV}"


def test_flags_reach_their_fields() -> None:
    config = server_config(_parser({}).parse_args(["--max-restarts", "7", "--max-calls-per-second", "5", "--state",
                                                   ":memory:", "--insecure"]))
    assert (config.default_max_restarts, config.calls_per_second_per_peer) == (7, 5.0)
    assert (config.state_path, config.insecure) == (":memory:", True)


def test_the_table_refuses_a_contradiction_at_import() -> None:
    for rows in ((ServerSetting("a", "--a", int, 1), ServerSetting("a", "--b", int, 1)),
                 (ServerSetting("a", "--a", int, 1), ServerSetting("b", "--a", int, 1)),
                 (ServerSetting("a", "--a", int, 1.5),), (ServerSetting("", "", int, 1),)):
        with pytest.raises(AssertionError):
            _check(rows)


# ------------------------------------------------------------------ `taskd status`, `taskd token`, `taskd migrate`

def _command(command: str, environ: dict[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"taskd {command}")
    add_command_flags(parser, command, environ)
    return parser


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_flag_is_its_row_and_there_is_no_other(command: str) -> None:
    """Built from the rows: the flags in the table's order, each with its row's default, type, metavar and help."""
    actions = _actions(_command(command, {}))
    rows = command_flags(command)
    assert list(actions) == [s.flag for s in rows]
    for s in rows:
        action = actions[s.flag]
        assert (action.default, action.help, action.metavar, action.required) == (
            s.default, s.help_text(), s.metavar, s.required), s.flag
        assert action.type is (None if s.kind in (str, bool) else s.kind), s.flag


def test_the_command_timeouts_are_the_rows() -> None:
    """status's ListJobs deadline and migrate's wait for the outcome: two settings, each one row."""
    assert _command("status", {}).parse_args([]).timeout == 5.0
    migrate = _command("migrate", {}).parse_args(["--job", "j", "--rank", "1"])
    assert (migrate.timeout, migrate.rank, migrate.node) == (120.0, 1, None)
    assert _actions(_command("migrate", {}))["--timeout"].help.endswith("(default 120)")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_shared_flag_takes_its_rows_variable_as_default(command: str) -> None:
    shared = [s for s in command_flags(command) if s.same]
    environ = {setting(s.same).env: f"/from/{s.same}" for s in shared}
    required = {"status": [], "token": ["--job", "j"], "migrate": ["--job", "j", "--node", "0"]}[command]
    args = _command(command, environ).parse_args(required)
    assert {s.flag: getattr(args, flag_dest(s.flag)) for s in shared} == {s.flag: f"/from/{s.same}" for s in shared}
    assert {"token_file"} <= {s.same for s in shared}
    unset = _command(command, {}).parse_args(required)
    assert all(getattr(unset, flag_dest(s.flag)) is None for s in shared)


def test_migrate_needs_exactly_one_of_rank_and_node(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--job", "j"], ["--job", "j", "--rank", "1", "--node", "2"]):
        with pytest.raises(SystemExit):
            _command("migrate", {}).parse_args(argv)
    assert "one of the arguments --rank --node is required" in capsys.readouterr().err


def test_the_command_table_refuses_a_contradiction_at_import() -> None:
    for rows in ((CommandFlag("status", "--a", int), CommandFlag("status", "--a", int)),
                 (CommandFlag("stats", "--a", int),), (CommandFlag("status", "--a", int, 1.5),),
                 (CommandFlag("status", "--a", str, same="standby"),),
                 (CommandFlag("status", "--a", int, required=True, one_of="x"),)):
        with pytest.raises(AssertionError):
            _check_commands(rows)
    with pytest.raises(KeyError, match="no command 'stat'"):
        command_flags("stat")


def test_the_command_flag_table_is_generated_from_the_current_rows(tmp_path: Path) -> None:
    from taskd.controller import command_table

    text = (ROOT / "docs" / "controller.md").read_text(encoding="utf-8")
    assert command_table.update_doc(text) == text, "run: python -m taskd.controller.command_table --write " \
        "docs/controller.md"
    row = "| `taskd migrate` | `--timeout SECONDS` | 120 |"
    assert row in text
    stale = tmp_path / "controller.md"
    stale.write_text(text.replace(row, row.replace("120", "60")), encoding="utf-8")
    assert command_table.main(["--check", str(stale)]) == 1
    assert command_table.main(["--write", str(stale)]) == 0 and stale.read_text(encoding="utf-8") == text


@pytest.mark.parametrize("command", COMMANDS)
def test_taskd_builds_the_commands_parser_from_its_rows(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """taskd/cli.py's subcommand has the rows' flags and defaults, and no hand-written one beside them."""
    from taskd.cli import build_parser

    for s in command_flags(command):
        if s.same:
            monkeypatch.delenv(setting(s.same).env, raising=False)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    actions = _actions(sub)
    assert [(flag, a.default, a.help) for flag, a in actions.items()] == [
        (s.flag, s.default, s.help_text()) for s in command_flags(command)]
