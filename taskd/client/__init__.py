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
# so the package itself sets it first. An explicit value in the environment wins. Once grpc is imported
# and initialised (done here at once, so that nothing of gRPC reads the variable later) it is taken out
# again: the ranks and the scheduler inherit this environment and must not see it (issue 18; measured
# with it removed: 0 of 150 preexec_fn children crashed, none saw it; tests/e2e/client/test_grpc_fork_env.py).
_FORK_VAR = "GRPC_ENABLE_FORK_SUPPORT"
_fork_var_set_here = "grpc" not in sys.modules and _FORK_VAR not in os.environ
if _fork_var_set_here:
    os.environ[_FORK_VAR] = "false"

import grpc  # noqa: E402

if _fork_var_set_here:
    try:
        from grpc._cython import cygrpc as _cygrpc

        _cygrpc.fork_handlers_and_grpc_init()  # what a first channel or server would do
    except (ImportError, AttributeError):  # a grpcio without it: a channel's construction does the same
        grpc.insecure_channel("127.0.0.1:1").close()
    os.environ.pop(_FORK_VAR, None)

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
