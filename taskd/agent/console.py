"""taskd's console: one `[taskd HH:MM:SS] message` line per event on stderr, for `taskd run` and under msrun."""

from __future__ import annotations

import logging
import sys

# Loggers whose INFO lines are the user's "one line per event"; the rest speak up at WARNING.
EVENT_LOGGERS = ("taskd.agent", "taskd.run")
CONSOLE_FORMAT = logging.Formatter("[taskd %(asctime)s] %(message)s", "%H:%M:%S")


def setup_console_logging(verbose: bool = False, *, only_if_unconfigured: bool = False) -> None:
    """Send taskd's events to stderr.

    `taskd run` owns its process: it replaces taskd's handlers and shows INFO only from
    EVENT_LOGGERS (DEBUG everywhere with `verbose`). Inside msrun (`only_if_unconfigured`) the
    host process may have set up logging already: then nothing changes; otherwise taskd's INFO
    lines get a console handler of their own.
    """
    root = logging.getLogger("taskd")
    if only_if_unconfigured and (root.handlers or logging.getLogger().handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(CONSOLE_FORMAT)
    root.handlers[:] = [handler]
    if only_if_unconfigured:
        root.setLevel(logging.INFO)
        return
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    for name in EVENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)
