"""The recover client: an agent's link to the recovery controller (`taskd server` or ClusterD).

Parts: `rpc` (channels, calls with deadlines), `credentials` (token, TLS), `retry` (when to re-send),
`subscription` (the signal stream), `dispatch` (action -> handler), `arguments` (validation),
`manager` (the `DLRecoverManager` facade), `current` (TaskD's module functions). docs/client.md.
"""

import os
import sys

# Why here: msrun spawns its ranks with `preexec_fn` (Python code in the forked child). In a process
# where gRPC threads run (this client, an embedded controller), gRPC's fork handlers then crash about
# one child in seven; with fork support off they do not (measured: 0 of 300; docs/mindspore.md). The
# switch only works before grpc is first imported, and every module of this package imports grpc,
# so the package itself sets it first. An explicit value in the environment wins.
if "grpc" not in sys.modules:
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from taskd.client.credentials import ClientCredentials  # noqa: E402
from taskd.client.errors import (  # noqa: E402
    AuthenticationError,
    ConfigurationError,
    FencedError,
    RecoverClientError,
    ServerUnreachable,
)
from taskd.client.manager import DLRecoverManager, RecoverClient  # noqa: E402
from taskd.client.signals import RecoverSignal  # noqa: E402

__all__ = [
    "AuthenticationError",
    "ClientCredentials",
    "ConfigurationError",
    "DLRecoverManager",
    "FencedError",
    "RecoverClient",
    "RecoverClientError",
    "RecoverSignal",
    "ServerUnreachable",
]
