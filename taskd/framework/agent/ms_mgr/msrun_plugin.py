"""TaskD's import path of `MSRunPlugin`, with taskd's embedded controller bound in.

The plugin itself is `taskd.agent.plugin.MSRunPlugin`; this shim is a composition root: when no
MINDX_SERVER_IP is set, `MSRunPlugin()` (as msrun builds it) runs an embedded controller.
"""

from __future__ import annotations

from typing import Any

import taskd.client  # noqa: F401 (first: its import switches gRPC fork support off before grpc loads)
from taskd.agent.config import AgentConfig
from taskd.agent.plugin import CALLBACKS, ControllerFactory
from taskd.agent.plugin import MSRunPlugin as AgentPlugin
from taskd.agent.rank_control import LauncherDetails


def embedded_controller(config: AgentConfig) -> Any:
    """A controller on a free loopback port, in memory, with a per-run token, living as long as the agent."""
    from taskd.controller.server import EmbeddedController

    return EmbeddedController.for_agent(config.max_restarts)


class MSRunPlugin(AgentPlugin):
    """taskd.agent.plugin.MSRunPlugin with `embedded_controller` as its default controller factory."""

    def __init__(self, details: LauncherDetails | None = None,
                 controller_factory: ControllerFactory | None = embedded_controller, **settings: Any) -> None:
        super().__init__(details, controller_factory, **settings)


__all__ = ["CALLBACKS", "MSRunPlugin", "embedded_controller"]
