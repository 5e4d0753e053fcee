"""The settings of `taskd server` (and of `taskd status`/`token`/`migrate`), rows of taskd's settings table.

`ControllerConfig`'s defaults (and `MachineConfig`'s, its recovery timeouts), `taskd server`'s argparse flags
(`add_server_flags`: the same flags, defaults, metavars and --help lines as before the table), `FLAGS` (which
flag each field's errors name) and the one variable `taskd server` reads (TASKD_TOKEN_FILE) come from
`SERVER_SETTINGS`. A setting `taskd server` shares with the agent (`same`: the restart budget, the join and
rejoin timeouts) takes that row's default from taskd/settings.py. tests/unit/test_server_settings.py checks
every config field and flag against the rows.

Adding a `taskd server` flag is one row here plus its `ControllerConfig` field (``name: T = server_default(...)``).

The controller's client commands, `taskd status`, `taskd token` and `taskd migrate`, hold no config: their flags
are `COMMAND_FLAGS`' rows (`add_command_flags`), and a flag shared with `taskd run` (`same`: --server and the
credential paths) takes its row's variable, when set, as its default.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskd.settings import env_text, setting
from taskd.vocabulary import DEFAULT_PORT

TOKEN_ENV = setting("token_file").env  # the same variable as the clients' (taskd/settings.py)


@dataclass(frozen=True)
class ServerSetting:
    """One setting of `taskd server`. `help` may name its default as ``{default}``."""

    field: str  # the ControllerConfig field ("": a flag of the command alone, e.g. --log-level)
    flag: str  # "" for a field only a program sets (EmbeddedController callers)
    kind: type  # int, float, str or bool (a bool flag is set by its presence)
    default: Any
    help: str | None = None
    metavar: str | None = None
    env: str = ""  # the variable the flag's default is read from
    same: str = ""  # the agent's setting (taskd/settings.py) it is: its default and bound are that row's
    choices: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """How a bad value's error names where it came from."""
        return f"{self.flag} or {self.env}" if self.env else self.flag

    def help_text(self) -> str | None:
        if self.help is None:
            return None
        shown = f"{self.default:g}" if isinstance(self.default, float) else str(self.default)
        return self.help.format(default=shown)


def _shared(field: str, same: str, flag: str, help_: str, metavar: str) -> ServerSetting:
    """A setting of the agent's that the controller holds too: one default, in taskd/settings.py."""
    agent = setting(same)
    assert (agent.server_field, agent.server_flag) == (field, flag), f"{same}: server_field/server_flag disagree"
    return ServerSetting(field, flag, agent.kind, agent.default, help_, metavar, same=same)


S = ServerSetting
SERVER_SETTINGS: tuple[ServerSetting, ...] = (
    S("listen", "--listen", str, f"127.0.0.1:{DEFAULT_PORT}", "address to serve on: HOST:PORT, [IPV6]:PORT, a bare "
      "IPv6 address or HOST (default {default}; port 0 = any free port)", "HOST:PORT"),
    S("state_path", "--state", str, None, "SQLite state file (default: $XDG_DATA_HOME/taskd/controller.sqlite3); "
      "':memory:' keeps nothing", "PATH"),
    S("keepalive_interval", "--keepalive-interval", float, 5.0, None, "SECONDS"),
    S("stop_timeout", "--stop-timeout", float, 60.0, "wait for every agent's stop-complete", "SECONDS"),
    S("strategy_timeout", "--strategy-timeout", float, 60.0, "wait for every agent's supported strategies", "SECONDS"),
    S("recover_timeout", "--recover-timeout", float, 300.0, "wait for every agent's recover status", "SECONDS"),
    S("resume_timeout", "--resume-timeout", float, 120.0, "after a controller restart, wait this long for the agents "
      "of a job caught mid-round to resubscribe before its round goes on without the missing ones", "SECONDS"),
    S("settle_window", "--settle-window", float, 30.0, "a fault this soon after a successful recover counts as that "
      "recover failing", "SECONDS"),
    S("agent_loss_timeout", "--agent-loss-timeout", float, 30.0, "an agent without a signal stream (registered and "
      "never subscribed, or after a controller restart) that does not subscribe (nor report that it finished) within "
      "this is lost: its node-loss round starts (default {default})", "SECONDS"),
    S("agent_loss_grace", "--agent-loss-grace", float, 5.0, "an agent whose signal stream ended and that does not "
      "resubscribe within this (at most --agent-loss-timeout) is lost (default {default})", "SECONDS"),
    _shared("node_rejoin_timeout", "node_rejoin_timeout", "--node-rejoin-timeout", "after a node's agent is lost, wait "
            "this long for a replacement agent of that node rank (`taskd run --node-rank R`, a restarted pod, or a "
            "`taskd run --standby` agent) before the job fails (default {default}: a pod rescheduled with its image "
            "pulled)", "SECONDS"),
    S("agent_ping_interval", "--agent-ping-interval", float, 5.0, "PING an agent's connection after this long without "
      "a word on it (default {default})", "SECONDS"),
    S("agent_ping_timeout", "--agent-ping-timeout", float, 10.0, "a PING unanswered this long closes the agent's "
      "connection, so its stream ends: how a SIGSTOPped or cut-off agent is found, within interval + timeout + "
      "--agent-loss-grace (default {default}; a busy agent still answers)", "SECONDS"),
    S("max_standbys", "--max-standbys", int, 64, "standby agents (`taskd run --standby`) one job may have waiting "
      "(default {default}); one more is refused", "N"),
    _shared("join_timeout", "join_timeout", "--join-timeout", "a job whose nodes have not all registered this long "
            "after its first agent did fails (naming the missing nodes) and the agents that joined are told to exit; "
            "torchrun's rendezvous join_timeout (default {default})", "SECONDS"),
    _shared("last_call_timeout", "last_call_timeout", "--last-call-timeout", "a `--nnodes MIN:MAX` job whose first "
            "MIN nodes registered starts this long after with the nodes present, and grows when more arrive; "
            "torchrun's rendezvous last_call_timeout (default {default})", "SECONDS"),
    _shared("default_max_restarts", "max_restarts", "--max-restarts", "restart budget of a job that does not send its "
            "own", "N"),
    S("max_jobs", "--max-jobs", int, 10000, "jobs kept at once (default {default}); a full table evicts the finished "
      "job idle the longest, and refuses a new job only when all N are still running", "N"),
    S("finished_job_retention", "--finished-job-retention", float, 3600.0, "forget a finished job (and its history) "
      "once no agent has streamed or called for it this long (default {default})", "SECONDS"),
    S("unregistered_job_timeout", "--unregistered-job-timeout", float, 300.0, "drop a job that no agent has "
      "registered for this long after its Init (default {default})", "SECONDS"),
    S("token_file", "--token-file", str, None, f"every call must carry the token in this file (default ${TOKEN_ENV}); "
      f"clients read it from {TOKEN_ENV} or their --token-file. Needed to serve a non-loopback address", "PATH",
      env=TOKEN_ENV),
    S("tls_cert", "--tls-cert", str, None, "serve TLS with this certificate (chain)", "PEM"),
    S("tls_key", "--tls-key", str, None, "the private key of --tls-cert", "PEM"),
    S("tls_client_ca", "--tls-client-ca", str, None, "require client certificates signed by this CA (mTLS)", "PEM"),
    S("insecure", "--insecure", bool, False, "serve a non-loopback address without a token: anyone who can reach it "
      "can read, fail or stop every job. For ClusterD-wire clients that send no token, on a trusted network"),
    S("max_node_count", "--max-node-count", int, 65536, "refuse jobs with more nodes (default {default})", "N"),
    S("max_ranks", "--max-ranks", int, 100_000, "refuse jobs with more ranks, and bound the rank ids and list sizes of "
      "a job whose Init gives no ranksPerNode (ClusterD-wire clients) by it (default {default})", "N"),
    S("max_job_bytes", "--max-job-bytes", int, 64 * 2**20, "bytes one job may hold in the state file, its snapshot "
      "and history (default {default}; 0 = no quota): a change past it is refused (413) and nothing changes", "BYTES"),
    S("max_job_log_lines", "--max-job-log-lines", int, 200, "history log lines per job every 10 s (default {default}; "
      "0 = no limit); the lines held back are counted in the job's next one", "N"),
    S("max_connections", "--max-connections", int, None, "connections accepted at once (default: the open-file limit, "
      "raised to its hard limit, minus a reserve)", "N"),
    S("max_connections_per_peer", "--max-connections-per-peer", int, 64, "connections with a call in flight per "
      "client IP (default {default}; 0 = no limit; loopback clients are exempt unless --limit-loopback)", "N"),
    S("max_connections_per_credential", "--max-connections-per-credential", int, None, "connections one credential "
      "(a job's, or the admin token) may hold, idle or not (default: a quarter of --max-connections; 0 = no limit); "
      "past it its longest-idle one is closed, or the call refused when all have calls in flight", "N"),
    S("max_streams_per_peer", "--max-streams-per-peer", int, 256, "open signal streams per client IP (default "
      "{default}; 0 = no limit)", "N"),
    S("calls_per_second_per_peer", "--max-calls-per-second", float, 200.0, "calls per second per client IP (default "
      "{default}; 0 = no limit)", "RATE"),
    S("call_burst_per_peer", "--call-burst", int, 400, "calls a client IP may make at once above the rate (default "
      "{default})", "N"),
    S("limit_loopback", "--limit-loopback", bool, False, "apply the per-client limits to clients on this host too"),
    S("idle_timeout", "--idle-timeout", float, 600.0, "close a connection without a call for this long (default "
      "{default})", "SECONDS"),
    S("handshake_timeout", "--handshake-timeout", float, 10.0, "close a connection still without its handshake "
      "(default {default})", "SECONDS"),
    S("auth_timeout", "--auth-timeout", float, 5.0, "close a connection that carried no call with the token this long "
      "after it opened (default {default}; 0 = never)", "SECONDS"),
    S("metrics_listen", "--metrics-listen", str, None, "serve Prometheus metrics at http://HOST:PORT/metrics (port "
      "9464 if none; needs pip install 'taskd[metrics]'; docs/operations.md lists them)", "HOST[:PORT]"),
    S("", "--log-level", str, "INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR")),
    # a program's only (EmbeddedController callers): gRPC's queue bounds (ControllerConfig says why) and the
    # seconds a stopping server gives the calls in flight
    S("subscriber_queue_size", "", int, 1024),
    S("max_pending_requests", "", int, 20000),
    S("max_pending_requests_hard_limit", "", int, 60000),
    S("max_unrequested_seconds", "", int, 300),
    S("grace", "", float, 5.0),
)
del S

BY_FIELD: Mapping[str, ServerSetting] = {s.field: s for s in SERVER_SETTINGS if s.field}
FLAGS: Mapping[str, str] = {s.field: s.label for s in SERVER_SETTINGS if s.field and s.flag}
"""ControllerConfig field -> how its errors name the flag (or variable) it comes from."""


def _check(rows: tuple[ServerSetting, ...]) -> None:
    """At import: one row per field and per flag, a default of the row's kind."""
    fields = [s.field for s in rows if s.field]
    flags = [s.flag for s in rows if s.flag]
    assert len(set(fields)) == len(fields), f"a ControllerConfig field given twice in {fields}"
    assert len(set(flags)) == len(flags), f"a flag given twice in {flags}"
    for s in rows:
        assert s.kind in (int, float, str, bool), f"{s.field or s.flag}: kind {s.kind!r}"
        assert s.default is None or isinstance(s.default, s.kind), f"{s.field}: default {s.default!r} is not {s.kind}"
        assert s.field or s.flag, "a row sets a field, a flag or both"


_check(SERVER_SETTINGS)


def server_default(field: str) -> Any:
    """A ControllerConfig (or MachineConfig) field's default: `stop_timeout: float = server_default("stop_timeout")`."""
    try:
        return BY_FIELD[field].default
    except KeyError:
        raise KeyError(f"no taskd server setting {field!r} in taskd/server_settings.py") from None


def flag_dest(flag: str) -> str:
    """"--max-calls-per-second" -> "max_calls_per_second": the argparse name of a flag."""
    return flag.split()[0].lstrip("-").replace("-", "_")


def add_server_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """`taskd server`'s flags, in the table's order; a row's variable, when set, is its flag's default."""
    environ = os.environ if environ is None else environ
    for s in SERVER_SETTINGS:
        if not s.flag:
            continue
        if s.kind is bool:
            parser.add_argument(s.flag, action="store_true", help=s.help_text())
            continue
        kwargs: dict[str, Any] = {"default": (environ.get(s.env) or None) if s.env else s.default,
                                  "help": s.help_text()}
        if s.kind is not str:
            kwargs["type"] = s.kind
        if s.metavar:
            kwargs["metavar"] = s.metavar
        if s.choices:
            kwargs["choices"] = list(s.choices)
        parser.add_argument(s.flag, **kwargs)


# ---------------------------------------------------------------------------- taskd status / token / migrate

COMMANDS = ("status", "token", "migrate")


@dataclass(frozen=True)
class CommandFlag:
    """One flag of `taskd status`, `taskd token` or `taskd migrate`. `help` may name ``{default}`` and ``{env}``
    (the variable of `same`, the row of taskd/settings.py whose variable, when set, is the flag's default)."""

    command: str  # one of COMMANDS
    flag: str
    kind: type  # int, float, str or bool (a bool flag is set by its presence)
    default: Any = None
    help: str | None = None
    metavar: str | None = None
    same: str = ""
    required: bool = False
    one_of: str = ""  # a required choice: exactly one of the command's flags with this name is given

    def help_text(self) -> str | None:
        if self.help is None:
            return None
        shown = f"{self.default:g}" if isinstance(self.default, float) else str(self.default)
        return self.help.format(default=shown, env=setting(self.same).env if self.same else "")


C = CommandFlag
_STATUS_SERVER = ("controller address host[:port] (default ${env}; else every `taskd run` of this user on this host "
                  f"that runs its own controller, else 127.0.0.1:{DEFAULT_PORT})")
COMMAND_FLAGS: tuple[CommandFlag, ...] = (
    C("status", "--server", str, help=_STATUS_SERVER, metavar="ADDR", same="server"),
    C("status", "--job", str, help="only this job", metavar="ID"),
    C("status", "--json", bool, False, "machine-readable output"),
    C("status", "--timeout", float, 5.0, "how long to wait for the controller's answer (default {default})",
      "SECONDS"),
    C("status", "--token-file", str, help="send the token in this file (default ${env})", metavar="PATH",
      same="token_file"),
    C("status", "--tls-ca", str, help="connect with TLS, trusting this CA (default ${env})", metavar="PEM",
      same="tls_ca"),
    C("status", "--tls-cert", str, help="client certificate for mTLS (default ${env})", metavar="PEM",
      same="tls_cert"),
    C("status", "--tls-key", str, help="its private key (default ${env})", metavar="PEM", same="tls_key"),
    C("token", "--job", str, help="the job the credential is for (its --job-id / MINDX_TASK_ID, what its agents "
      "send as jobId)", metavar="ID", required=True),
    C("token", "--token-file", str, help="the controller's admin token, as given to `taskd server --token-file` "
      "(default ${env})", metavar="PATH", same="token_file"),
    C("migrate", "--job", str, help="the job (its --job-id / MINDX_TASK_ID)", metavar="ID", required=True),
    C("migrate", "--rank", int, help="the global rank to move to a warm spare on its node, at the job's next step "
      "boundary", metavar="R", one_of="which"),
    C("migrate", "--node", int, help="the node whose every rank moves to a standby agent (`taskd run --standby`) at "
      "the job's next step boundary (maintenance: drain the node)", metavar="N", one_of="which"),
    C("migrate", "--server", str, help=f"controller host[:port] (default ${{env}}, else 127.0.0.1:{DEFAULT_PORT})",
      metavar="ADDR", same="server"),
    C("migrate", "--timeout", float, 120.0, "how long to wait for the migration's outcome (default {default})",
      "SECONDS"),
    C("migrate", "--token-file", str, help="the admin token or the job's credential (`taskd token --job ID`) "
      "(default ${env})", metavar="PATH", same="token_file"),
    C("migrate", "--tls-ca", str, help="connect with TLS, trusting this CA (default ${env})", metavar="PEM",
      same="tls_ca"),
    C("migrate", "--tls-cert", str, help="client certificate for mTLS (default ${env})", metavar="PEM",
      same="tls_cert"),
    C("migrate", "--tls-key", str, help="its private key (default ${env})", metavar="PEM", same="tls_key"),
)
del C


def _check_commands(rows: tuple[CommandFlag, ...]) -> None:
    """At import: one row per command and flag, a known command, a default of the row's kind, a known `same`."""
    keys = [(s.command, s.flag) for s in rows]
    assert len(set(keys)) == len(keys), f"a flag given twice in {keys}"
    for s in rows:
        assert s.command in COMMANDS, f"{s.flag}: command {s.command!r} is not one of {COMMANDS}"
        assert s.kind in (int, float, str, bool), f"{s.command} {s.flag}: kind {s.kind!r}"
        assert s.default is None or isinstance(s.default, s.kind), f"{s.command} {s.flag}: default {s.default!r}"
        assert not s.same or setting(s.same).env, f"{s.command} {s.flag}: {s.same} has no variable"
        assert not (s.required and s.one_of), f"{s.command} {s.flag}: a choice's flags are required together"


_check_commands(COMMAND_FLAGS)


def command_flags(command: str) -> tuple[CommandFlag, ...]:
    """A command's rows, in --help's order."""
    rows = tuple(s for s in COMMAND_FLAGS if s.command == command)
    if not rows:
        raise KeyError(f"no command {command!r} in taskd/server_settings.py; known: {', '.join(COMMANDS)}")
    return rows


def add_command_flags(parser: argparse.ArgumentParser, command: str, environ: Mapping[str, str] | None = None) -> None:
    """`taskd COMMAND`'s flags, in the table's order; a row's `same` variable, when set, is its flag's default."""
    choices: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for s in command_flags(command):
        target: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup = parser
        if s.one_of:
            if s.one_of not in choices:
                choices[s.one_of] = parser.add_mutually_exclusive_group(required=True)
            target = choices[s.one_of]
        if s.kind is bool:
            target.add_argument(s.flag, action="store_true", help=s.help_text())
            continue
        kwargs: dict[str, Any] = {"default": (env_text(s.same, environ) or None) if s.same else s.default,
                                  "help": s.help_text(), "metavar": s.metavar}
        if s.kind is not str:
            kwargs["type"] = s.kind
        if s.required:
            kwargs["required"] = True
        target.add_argument(s.flag, **kwargs)


__all__ = ["BY_FIELD", "COMMANDS", "COMMAND_FLAGS", "FLAGS", "SERVER_SETTINGS", "TOKEN_ENV", "CommandFlag",
           "ServerSetting", "add_command_flags", "add_server_flags", "command_flags", "flag_dest", "server_default"]
