"""`taskd run --standby`: a spare node needs the job's controller; its node rank is not checked (it has none yet)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from taskd.run_config import RunConfig, RunConfigError, add_run_arguments


def parse(argv: list[str]) -> RunConfig:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return RunConfig.from_args(parser.parse_args(argv), environ={})


def test_standby_is_a_switch_that_needs_a_server(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    config = parse(["--standby", "--nnodes", "2", "--server", "127.0.0.1:1", str(script)])
    assert config.standby and config.nnodes == 2
    assert not parse(["--nnodes", "2", "--server", "127.0.0.1:1", str(script)]).standby
    with pytest.raises(RunConfigError, match="--standby joins a running job as a spare node: it needs"):
        parse(["--standby", str(script)])


def test_a_standbys_node_rank_is_ignored(tmp_path: Path) -> None:
    """Under Slurm an extra node's SLURM_NODEID is beyond the job's nodes: not an error for a standby."""
    script = tmp_path / "train.py"
    script.write_text("")
    assert parse(["--standby", "--nnodes", "2", "--node-rank", "3", "--server", "127.0.0.1:1", str(script)]).standby
    with pytest.raises(RunConfigError, match="node-rank"):
        parse(["--nnodes", "2", "--node-rank", "3", "--server", "127.0.0.1:1", str(script)])
