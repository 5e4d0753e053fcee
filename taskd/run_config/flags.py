"""`taskd run`'s flags: torchrun's, in both spellings and with torchrun's meanings, plus taskd's own.

Every flag is a row of taskd/settings.py (its spellings, metavar, --help line and, for a torchrun flag that means
less under taskd, its notice); this module only lays the rows out in --help's groups. The parser only maps flags
to names: every flag is read as text (default None = "not given") and RunConfig.from_args parses and checks them
all at once, so one run reports every problem and can tell a flag the user typed from a default or a value taken
from the environment.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from taskd.settings import SETTINGS, Setting, setting

# --help's groups, each a list of rows of taskd/settings.py in the order --help shows them.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("job size (torchrun)", ("node_count", "ranks_per_node", "node_rank", "standby")),
    ("where the job meets (torchrun)", ("standalone", "rdzv_endpoint", "rdzv_id", "rdzv_backend", "rdzv_conf",
                                        "master_addr", "master_port", "local_addr", "server", "metrics_listen",
                                        "token_file", "tls_ca", "tls_cert", "tls_key", "job_id")),
    ("what to run (torchrun)", ("module", "no_python", "run_path", "role")),
    ("logs (torchrun)", ("log_dir", "redirects", "tee", "local_ranks_filter", "quiet")),
    ("recovery", ("max_restarts", "monitor_interval", "stop_grace", "shutdown_timeout", "strategies",
                  "heartbeat_timeout", "straggler_factor", "straggler_interval", "migrate_stragglers", "drain_file",
                  "dump_timeout",
                  "warm_spares", "warm_spare_mode", "snapshot_memory", "snapshot_persist_dir", "snapshot_persist_every",
                  "snapshot_persist_keep")),
    ("accepted for torchrun's command lines (a notice says what taskd does)",
     ("start_method", "event_log_handler", "logs_specs", "numa_binding", "signals_to_handle",
      "duplicate_stdout_filters", "duplicate_stderr_filters", "virtual_local_rank")),
)
RUN_FLAGS: tuple[Setting, ...] = tuple(setting(name) for _, names in GROUPS for name in names)
"""Every row with a `taskd run` flag, in --help's order."""

# One line each for flags that have no effect under taskd; printed when such a flag is given (the table's order).
NOTICES: Mapping[str, str] = {s.dest: s.notice for s in SETTINGS if s.notice}


def _check_groups() -> None:
    """At import: every row with a flag is in exactly one group."""
    laid_out = [s.name for s in RUN_FLAGS]
    flagged = {s.name for s in SETTINGS if s.flags}
    assert len(laid_out) == len(set(laid_out)), "a row in two of --help's groups"
    assert set(laid_out) == flagged, f"rows with a flag and no --help group: {flagged ^ set(laid_out)}"


_check_groups()


def add_flag(group: argparse._ArgumentGroup, s: Setting) -> None:
    """A row's flag under the spellings its row gives; None by default, so that "not given" is visible."""
    kwargs: dict[str, object] = {"default": None, "dest": s.dest, "help": s.help_text()}
    if s.kind is bool:
        kwargs["action"] = "store_true"
    elif s.metavar:
        kwargs["metavar"] = s.metavar
    group.add_argument(*s.flags, **kwargs)  # type: ignore[arg-type]


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Every torchrun flag plus taskd's own; `parser.set_defaults(_run_usage=...)` lets errors print this usage."""
    for title, names in GROUPS:
        group = parser.add_argument_group(title)
        for name in names:
            add_flag(group, setting(name))
    parser.add_argument("script", metavar="SCRIPT", help="a Python script, a module (-m) or a command (--no-python)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS")
    parser.set_defaults(_run_usage=parser.format_usage)


# The flag a dest came from, for error messages (the dash spelling, as --help shows it; `-m/--module`).
FLAG_NAMES = {"script": "SCRIPT", **{s.dest: "/".join(s.flags[:2]) for s in RUN_FLAGS if not s.flags[0][1] == "-"}}


def flag_name(dest: str) -> str:
    return FLAG_NAMES.get(dest, "--" + dest.replace("_", "-"))
