"""TaskD's module-level API: the report functions and the process's current manager.

TaskD's functions find `DLRecoverManager`'s one instance; so do these. An agent that holds a plain
`RecoverClient` hands it over with `set_manager`, which takes precedence. With neither, the first
call builds the instance from the environment, as TaskD's `get_recover_manager_instance` does.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from taskd.address import LOCAL_PROXY_ADDRESS, local_proxy_enabled
from taskd.client.arguments import env_int
from taskd.client.errors import ConfigurationError
from taskd.client.manager import DEFAULT_ROLE, DLRecoverManager, RecoverClient
from taskd.proto import recover_pb2
from taskd.settings import env_item, env_text

logger = logging.getLogger(__name__)
_lock = threading.Lock()
_override: RecoverClient | None = None


def manager_from_env(environ: Mapping[str, str] | None = None, **kwargs: Any) -> DLRecoverManager:
    """Build (or re-configure) the process's DLRecoverManager from MINDX_TASK_ID and MINDX_SERVER_IP.

    Optional: TASKD_NODE_RANK, TASKD_NNODES, TASKD_NPROC_PER_NODE (the names the agent reads; the older
    TASKD_NODE_COUNT and TASKD_RANKS_PER_NODE are still read when those are unset) fill ClientInfo's fields;
    TASKD_TOKEN_FILE and TASKD_TLS_* give the credentials (see ClientCredentials.from_env). As in TaskD,
    LOCAL_PROXY_ENABLE=on sends everything to the node's proxy at 127.0.0.1:8899 instead of MINDX_SERVER_IP
    (which must still be set).
    """
    env = os.environ if environ is None else environ
    job_id, server = env_text("job_id", env), env_text("server", env)  # the agent's variables (taskd/settings.py)
    if server and local_proxy_enabled(env):
        logger.info("LOCAL_PROXY_ENABLE=on: the recover client talks to the local proxy %s, not MINDX_SERVER_IP %s",
                    LOCAL_PROXY_ADDRESS, server)
        server = LOCAL_PROXY_ADDRESS
    missing = [name for name, value in (("MINDX_TASK_ID", job_id), ("MINDX_SERVER_IP", server)) if not value]
    if missing:
        raise ConfigurationError(
            f"no recover manager was set and {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
            "not set: call set_manager(), or export MINDX_TASK_ID (job id) and MINDX_SERVER_IP (host or host:port)"
        )
    info = recover_pb2.ClientInfo(
        jobId=job_id,
        role=DEFAULT_ROLE,
        nodeRank=_count(env, "node_rank"),
        nodeCount=_count(env, "node_count"),
        ranksPerNode=_count(env, "ranks_per_node"),
    )
    if environ is not None and "credentials" not in kwargs:
        from taskd.client.credentials import ClientCredentials

        kwargs["credentials"] = ClientCredentials.from_env(environ)
    return DLRecoverManager(info, server, **kwargs)


def _count(env: Mapping[str, str], name: str) -> int:
    """A ClientInfo count from the agent's variable for setting `name` (or its older name); 0 when unset."""
    var, text = env_item(name, env)
    return env_int({var: text}, var, 0) if var else 0


def set_manager(manager: RecoverClient | None) -> None:
    """Make `manager` the one the module functions use, ahead of DLRecoverManager's instance (None forgets it)."""
    global _override
    if manager is not None and not isinstance(manager, RecoverClient):
        raise TypeError(f"expected a DLRecoverManager or RecoverClient, got {type(manager).__name__}")
    with _lock:
        _override = manager


def get_manager() -> RecoverClient:
    """The manager set with set_manager, else DLRecoverManager's instance, else one built from the environment."""
    with _lock:
        if _override is not None:
            return _override
        return DLRecoverManager.instance or manager_from_env()


get_recover_manager_instance = get_manager  # TaskD's name
init_grpc_recover_manager = manager_from_env  # TaskD's name


def report_stop_complete(code: int, msg: str, fault_ranks: dict) -> int:
    """TaskD's function: see DLRecoverManager.report_stop_complete."""
    return get_manager().report_stop_complete(code, msg, fault_ranks)


def report_recover_strategy(fault_ranks: dict, strategy_list: list) -> int:
    """TaskD's function: see DLRecoverManager.report_recover_strategy."""
    return get_manager().report_recover_strategy(fault_ranks, strategy_list)


def report_recover_status(code: int, msg: str, fault_ranks: dict, strategy: str) -> int:
    """TaskD's function: see DLRecoverManager.report_recover_status."""
    return get_manager().report_recover_status(code, msg, fault_ranks, strategy)


def report_process_fault(fault_ranks: dict, fault_codes: dict | None = None) -> int:
    """TaskD's function (and signature): see DLRecoverManager.report_process_fault."""
    return get_manager().report_process_fault(fault_ranks, fault_codes)


def report_finished(exit_code: int, message: str = "") -> int:
    """See DLRecoverManager.report_finished."""
    return get_manager().report_finished(exit_code, message)
