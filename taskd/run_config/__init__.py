"""`taskd run`'s configuration: torchrun's command line with torchrun's meanings, plus Slurm and Kubernetes.

    parser = argparse.ArgumentParser(prog="taskd run")
    add_run_arguments(parser)
    config = RunConfig.from_args(parser.parse_args(argv))   # RunConfigError lists every problem

See docs/pytorch.md for what each torchrun flag does under taskd.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping

from taskd.run_config.config import RunConfig
from taskd.run_config.flags import NOTICES, add_run_arguments
from taskd.run_config.nodelist import expand_nodelist, first_host
from taskd.run_config.parse import RunConfigError, count_gpus, parse_nnodes, parse_nproc, parse_std

log = logging.getLogger("taskd.run")


def build_or_exit(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> RunConfig:
    """The CLI's step: a RunConfig, or `taskd run`'s usage and every problem on stderr and exit 2 (as argparse)."""
    try:
        config = RunConfig.from_args(args, environ)
    except RunConfigError as exc:
        usage = getattr(args, "_run_usage", None)
        sys.stderr.write((usage() if usage else "") + "".join(f"taskd run: error: {p}\n" for p in exc.problems))
        raise SystemExit(2) from None
    for notice in config.notices:
        log.warning("notice: %s", notice)
    if config.environment_line():
        log.info("%s", config.environment_line())
    return config


__all__ = ["NOTICES", "RunConfig", "RunConfigError", "add_run_arguments", "build_or_exit", "count_gpus",
           "expand_nodelist", "first_host", "parse_nnodes", "parse_nproc", "parse_std"]
