"""`taskd run` / `python -m taskd.run`: torchrun's shape, taskd's recovery.

Parses flags into a WorkerSpec (the launcher) and an AgentConfig (the agent), runs the job
with the agent on the launcher's callbacks, prints the summary and exits with the job's
code (0, or the first failing rank's code; 128 + signal for a signal).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from taskd.agent.console import EVENT_LOGGERS, setup_console_logging  # noqa: F401 (taskd run's console)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from taskd.agent.config import AgentConfig
    from taskd.client.credentials import ClientCredentials
    from taskd.launcher import WorkerSpec
    from taskd.run_config import RunConfig

log = logging.getLogger("taskd.run")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """torchrun's flags (both spellings, torchrun's meanings) and taskd's own; see taskd.run_config."""
    from taskd.run_config import add_run_arguments as add

    add(parser)


def agent_settings(config: RunConfig) -> tuple[dict[str, object], dict[str, str]]:
    """The AgentConfig overrides `taskd run` gives (taskd/settings.py's agent settings it has a flag for),
    and where each came from, so that a bad value's error names the flag or variable. None (and an empty
    list) is "not given": the agent then reads its TASKD_* variable, else its default."""
    from taskd.settings import AGENT_SETTINGS

    values: dict[str, object] = {}
    origins: dict[str, str] = {}
    for s in AGENT_SETTINGS:
        if s.run:
            value = getattr(config, s.run)
            values[s.name] = (list(value) or None) if isinstance(value, tuple) else value
            origins[s.name] = config.sources.get(s.run, s.flag)
    return values, origins


def _worker_spec(config: RunConfig) -> WorkerSpec:
    """Every RunConfig field WorkerSpec also has, as it is, and the launcher's own TASKD_* variables."""
    from dataclasses import fields

    from taskd.launcher import WorkerSpec
    from taskd.settings import default, env_text

    shared = {f.name for f in fields(WorkerSpec)} & {f.name for f in fields(config)}
    return WorkerSpec(
        **{name: getattr(config, name) for name in shared if name != "node_rank"}, console=not config.quiet,
        node_rank=None if config.standby else config.node_rank,  # a standby's comes later: set_node_rank
        # live recovery: node 0 hosts the rendezvous store, as torchrun's agent does (docs/pytorch.md)
        rdzv_store=env_text("rdzv_store") or default("rdzv_store"),
        preimport=env_text("preimport"),
    )


def with_rank_rejoin_wait(spec: WorkerSpec, node_rejoin_timeout: float, controller_timeout: float,
                          environ: Mapping[str, str] = os.environ) -> WorkerSpec:
    """A multi-node job's paused live ranks wait for a lost node's replacement as long as the agent does: the
    controller may name the next generation up to `node_rejoin_timeout` after the loss, and the replacement's
    ranks still have to start. Without this a survivor's rank gave up after TASKD_REJOIN_TIMEOUT's 120 s
    default and the job lost its live state. A TASKD_REJOIN_TIMEOUT of the user's own is kept."""
    import dataclasses

    from taskd.worker.env import Var
    from taskd.worker.live import DEFAULT_REJOIN_TIMEOUT

    if spec.nnodes <= 1 or Var.TASKD_REJOIN_TIMEOUT in environ or Var.TASKD_REJOIN_TIMEOUT in spec.extra_env:
        return spec
    wait = max(DEFAULT_REJOIN_TIMEOUT, node_rejoin_timeout + controller_timeout)
    return dataclasses.replace(spec, extra_env={**spec.extra_env, Var.TASKD_REJOIN_TIMEOUT: f"{wait:g}"})


def with_rank_strategies(spec: WorkerSpec, offered: list[str]) -> WorkerSpec:
    """Ranks see the strategies their agent offers (TASKD_STRATEGIES, as under msrun, where the user sets it for
    msrun and every rank inherits it): `taskd.worker.save_on_error()` waits for a dump's save request only when
    `dump` is offered. A TASKD_STRATEGIES already in the ranks' environment is the agent's own, left alone."""
    import dataclasses

    if "TASKD_STRATEGIES" in spec.extra_env:
        return spec
    return dataclasses.replace(spec, extra_env={**spec.extra_env, "TASKD_STRATEGIES": ",".join(offered)})


def _config_errors(problems: list[str]) -> int:
    sys.stderr.write("".join(f"taskd run: error: {p}\n" for p in problems))
    return 2  # a usage error, like argparse's own


def run_main(config: RunConfig) -> int:
    """Run one job; returns the process exit code.

    `taskd run`'s composition root: it builds the launcher, the agent and (with no controller
    address) the embedded controller, and hands the launcher and the controller to the agent.
    What only shows when these are built (a planted log file, an unusable TASKD_* variable) is
    a configuration error too: one line each, exit 2, nothing started.
    """
    import taskd.client  # noqa: F401 (first: its import switches gRPC fork support off while grpc is not loaded)
    from taskd.agent.config import AgentConfig
    from taskd.agent.supervisor import Supervisor
    from taskd.launcher import LocalLauncher, WorkerSpecError
    from taskd.launcher.output import RankLogError

    hosted = config.hosted_controller
    hosts = hosted is not None and not config.standby and config.node_rank == 0
    if hosted is not None and not hosts:  # the job's controller is node 0's (run_config/build.py)
        config = dataclasses.replace(config, server=hosted)
    try:
        spec = _worker_spec(config)
        overrides, origins = agent_settings(config)
        if config.standby:  # no node rank until the controller assigns one (agent/link/node_loss.py)
            overrides["node_rank"] = None
        agent_config = AgentConfig.from_env(origins, launcher="taskd", **overrides)
        spec = with_rank_rejoin_wait(spec, agent_config.node_rejoin_timeout, agent_config.controller_timeout)
        spec = with_rank_strategies(spec, agent_config.offered_strategies)
        credentials = _credentials(config) if agent_config.server is not None or hosts else None
        controller = _controller(config, agent_config, credentials if hosts else None)
        _conceal_credentials(config)
        launcher = LocalLauncher(spec)
    except WorkerSpecError as exc:
        return _config_errors(exc.problems)
    except RankLogError as exc:
        return _config_errors([exc.strerror or str(exc)])
    except (ValueError, OSError) as exc:
        return _config_errors([str(exc)])
    try:
        result = Supervisor(agent_config, launcher.callbacks(), details=launcher, controller=controller,
                            credentials=credentials, snapshot_dir=launcher.snapshots.path,
                            ward_bytes=launcher.snapshots.wards).run()
    finally:
        launcher.close(config.stop_grace)
    return result.exit_code


def _controller(config: RunConfig, agent_config: AgentConfig, hosting: ClientCredentials | None) -> Any:
    """The controller this process runs: none with --server; node 0's for the whole job with a hosted controller
    (`hosting`: the secret every node has), listening where the others reach it; else this node's own."""
    from taskd.controller.service.server import EmbeddedController

    if agent_config.server is not None:
        return None
    if hosting is None:
        return EmbeddedController.for_agent(agent_config.max_restarts)
    from taskd.address import parse_host_port

    assert config.hosted_controller is not None and hosting.token is not None
    _, port = parse_host_port(config.hosted_controller, 0, what="controller", forms="HOST:PORT")
    return EmbeddedController.for_job(f"0.0.0.0:{port}", hosting.token, agent_config.max_restarts,
                                      agent_config.node_rejoin_timeout, agent_config.last_call_timeout)


CREDENTIAL_FLAGS = ("--token-file", "--token_file", "--tls-ca", "--tls_ca", "--tls-cert", "--tls_cert",
                    "--tls-key", "--tls_key")


def _conceal_credentials(config: RunConfig) -> None:
    """Once read, and before any rank starts: no credential path left in this process's command line or
    environment, and its memory closed to the ranks (taskd/process/conceal.py, RELIABILITY.md "Ranks")."""
    from taskd.process.conceal import conceal
    from taskd.worker.env import is_credential_var

    conceal((config.token_file, config.tls_ca, config.tls_cert, config.tls_key), CREDENTIAL_FLAGS, is_credential_var)


def _credentials(config: RunConfig) -> ClientCredentials:
    """--token-file/--tls-*, else TASKD_TOKEN_FILE/TASKD_TLS_*: read now, so that a missing or unreadable file
    stops the run (exit 2, naming the flag or variable) before any rank starts."""
    from taskd.client.credentials import TLS_CA_VAR, TLS_CERT_VAR, TLS_KEY_VAR, TOKEN_FILE_VAR, ClientCredentials

    given = ((config.token_file, "--token-file", TOKEN_FILE_VAR), (config.tls_ca, "--tls-ca", TLS_CA_VAR),
             (config.tls_cert, "--tls-cert", TLS_CERT_VAR), (config.tls_key, "--tls-key", TLS_KEY_VAR))
    paths = [flag_value or os.environ.get(var, "").strip() or None for flag_value, _, var in given]
    names = tuple(flag if flag_value else var for flag_value, flag, var in given)
    credentials = ClientCredentials.from_files(*paths, names=names)  # type: ignore[arg-type]
    if credentials.token is not None and not credentials.token.startswith("tdj1.") and not config.hosted_controller:
        logging.getLogger("taskd").warning(
            "%s holds the controller's shared admin token, which can read and change every job on it: give this job "
            "its own credential (`taskd token --job %s > FILE`, RELIABILITY.md)", names[0], config.job_id)
    return credentials


def main(argv: list[str] | None = None) -> int:
    from taskd.run_config import build_or_exit

    parser = argparse.ArgumentParser(prog="taskd run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    setup_console_logging()
    return run_main(build_or_exit(args))


if __name__ == "__main__":
    sys.exit(main())
