"""TaskD's agent API, the entry point MindSpore's msrun (2.10) tries before `MSRunPlugin`.

msrun calls `init_taskd_agent({"Framework": "MindSpore"})`, then `register_func(name, func)` for its
four callbacks, then `start_taskd_agent()` once its scheduler runs. A False from `init_taskd_agent`
or an exception sends msrun to its older path (`MSRunPlugin`), so a refusal here is logged with
its reason. Behind these functions is taskd's own agent: the same `MSRunPlugin` object, with the
embedded controller when no MINDX_SERVER_IP is set; TaskD's proxy and manager are not involved.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import taskd.client  # noqa: F401 (first: its import switches gRPC fork support off before grpc loads)
from taskd.address import controller_target
from taskd.framework.agent.ms_mgr.msrun_plugin import MSRunPlugin

log = logging.getLogger("taskd.agent")

# TaskD's configuration keys (taskd/python/framework/common/type.py upstream).
FRAMEWORK_KEY = "Framework"
UPSTREAM_ADDR_KEY = "UpstreamAddr"
UPSTREAM_PORT_KEY = "UpstreamPort"
SERVER_RANK_KEY = "ServerRank"
KNOWN_KEYS = (FRAMEWORK_KEY, UPSTREAM_ADDR_KEY, UPSTREAM_PORT_KEY, SERVER_RANK_KEY)
FRAMEWORKS = ("MindSpore", "PyTorch")
DEFAULT_UPSTREAM_PORT = 8899  # taskd's controller port (TaskD's 9602 is its local proxy, which taskd has none of)

_lock = threading.Lock()
_agent: MSRunPlugin | None = None
_started = False


class _Refused(ValueError):
    """A configuration init_taskd_agent does not take; its text is the logged reason."""


def init_taskd_agent(config: Mapping[str, Any] | None = None, cls: object = None) -> bool:
    """Build the agent msrun hands its job to; False, with the reason logged, on a bad `config`.

    `Framework` must be "MindSpore" (taskd's PyTorch agent is `taskd run`). `ServerRank` (default
    MS_NODE_RANK, as TaskD) is this node's rank; unset, the agent takes msrun's `--node_rank`.
    `UpstreamAddr` / `UpstreamPort` name the controller (taskd's agent talks to it directly), in
    place of MINDX_SERVER_IP. `cls` is TaskD's PyTorch agent instance and must be None here.
    """
    global _agent, _started
    try:
        settings = _settings(config, cls)
    except _Refused as exc:
        log.error("init_taskd_agent: %s", exc)
        return False
    with _lock:
        if _started:
            log.error("init_taskd_agent: the agent already started; one agent per process")
            return False
        _agent, _started = MSRunPlugin(**settings), False
    log.info("init_taskd_agent: taskd's agent for MindSpore%s", "".join(
        f", {k} {v}" for k, v in settings.items()))
    return True


def register_func(operator: str, func: Callable[..., Any]) -> bool:
    """Hand one of the launcher's callbacks (KILL_WORKER, START_ALL_WORKER, ...) to the agent."""
    agent = _agent
    if agent is None:
        log.error("register_func(%r): init_taskd_agent() was not called (or refused)", operator)
        return False
    try:
        agent.register_callbacks(operator, func)
    except (TypeError, ValueError) as exc:
        log.error("register_func: %s", exc)
        return False
    return True


def start_taskd_agent() -> None:
    """Run the job to its end: returns when it succeeded, else `sys.exit(code)` (msrun's exit code)."""
    global _started
    with _lock:
        agent = _agent
        if agent is None:
            log.error("start_taskd_agent: init_taskd_agent() was not called (or refused)")
            return None
        if _started:
            raise RuntimeError("start_taskd_agent() was already called in this process")
        _started = True
    agent.start()
    return None


def _settings(config: Mapping[str, Any] | None, cls: object) -> dict[str, Any]:
    """TaskD's keys -> the plugin's settings, each checked; unknown keys are logged and ignored (as TaskD)."""
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise _Refused(f"config must be a dict, not {type(config).__name__}")
    framework = config.get(FRAMEWORK_KEY)
    if framework == "PyTorch":
        raise _Refused("Framework 'PyTorch': taskd's PyTorch agent is `taskd run` (a drop-in for torchrun); "
                       "init_taskd_agent backs MindSpore's msrun only")
    if framework != "MindSpore":
        raise _Refused(f"Framework must be one of {', '.join(FRAMEWORKS)}, not {framework!r}")
    if cls is not None:
        raise _Refused(f"cls is TaskD's PyTorch agent instance; with Framework 'MindSpore' it must be None, "
                       f"not {type(cls).__name__}")
    unknown = sorted(str(k) for k in config if k not in KNOWN_KEYS)
    if unknown:
        log.warning("init_taskd_agent: ignoring unknown config keys %s (known: %s)", unknown, ", ".join(KNOWN_KEYS))
    settings: dict[str, Any] = {}
    rank = config.get(SERVER_RANK_KEY, os.environ.get("MS_NODE_RANK"))
    if rank is not None:
        settings["node_rank"] = _digits(rank, SERVER_RANK_KEY if SERVER_RANK_KEY in config else "MS_NODE_RANK")
    addr, port = config.get(UPSTREAM_ADDR_KEY), config.get(UPSTREAM_PORT_KEY)
    if port is not None and addr is None:
        raise _Refused(f"{UPSTREAM_PORT_KEY} {port!r} without {UPSTREAM_ADDR_KEY}: give the controller's host too")
    if addr is not None:
        number = DEFAULT_UPSTREAM_PORT if port is None else _digits(port, UPSTREAM_PORT_KEY)
        if not isinstance(addr, str) or not addr.strip():
            raise _Refused(f"{UPSTREAM_ADDR_KEY} must be a host name or IP address, not {addr!r}")
        host = addr.strip()
        target = f"[{host}]:{number}" if ":" in host and not host.startswith("[") else f"{host}:{number}"
        try:
            settings["server"] = controller_target(target)
        except ValueError as exc:
            raise _Refused(f"{UPSTREAM_ADDR_KEY}/{UPSTREAM_PORT_KEY}: {exc}") from None
    return settings


def _digits(value: object, name: str) -> int:
    """TaskD checks `str.isdigit()`; an int is taken as well."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if not text.isdigit():
        raise _Refused(f"{name} must be a non-negative integer, not {value!r}")
    return int(text)


__all__ = ["init_taskd_agent", "register_func", "start_taskd_agent"]
