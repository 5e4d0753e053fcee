"""TaskD-compatible layout: taskd.framework.agent.ms_mgr.msrun_plugin.

msrun spawns its ranks with `preexec_fn` (Python code in the forked child). In a process where
gRPC threads run, gRPC's fork handlers then crash about one child in seven; with fork support
off they do not (measured: 0 of 300). The switch only works before grpc is first imported,
which is why it lives here, on the import path msrun takes.
"""

import os
import sys

if "grpc" not in sys.modules:
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
