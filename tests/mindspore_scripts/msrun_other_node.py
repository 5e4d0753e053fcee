"""msrun as a node that is not the master, run on the master's own machine (two-node tests on one host).

msrun decides whether it is the master node, and so whether it starts the scheduler, with
``_is_local_ip(--master_addr)`` in ``mindspore.parallel.cluster.process_entity._api``. On one machine
every node would answer True and start a scheduler of its own. This wrapper makes that check answer
False, then runs msrun's own entry point (``mindspore.parallel.cluster.run.main``, what the ``msrun``
console script calls) with the same command-line arguments, so the node only spawns its workers.
"""

from __future__ import annotations

import sys

from mindspore.parallel.cluster.process_entity import _api


def _never_local(_address: str) -> bool:
    return False


_api._is_local_ip = _never_local  # looked up as a module global when _ProcessManager is built

if __name__ == "__main__":
    from mindspore.parallel.cluster.run import main

    sys.argv[0] = "msrun"
    sys.exit(main())
