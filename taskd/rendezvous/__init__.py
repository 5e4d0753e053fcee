"""The rendezvous store that outlives every rank (live recovery).

Under torchrun and plain ``init_process_group``, rank 0 hosts the ``MASTER_ADDR:MASTER_PORT``
TCPStore, so losing rank 0 loses the store and no group can be rebuilt. :class:`StoreHost` runs it
in a small child process of its owner (node 0's ``taskd run``) instead; ranks then connect as
clients (``TORCHELASTIC_USE_AGENT_STORE=True``, see :func:`store_env`). :class:`AgentStore` decides
whether a node's ranks get one and restarts it for each whole-job start.
"""

from taskd.rendezvous.host import MODES, AgentStore, torch_importable
from taskd.rendezvous.live_binding import uses_live_binding, wrapped_python
from taskd.rendezvous.store import StoreHost, StoreHostError, listen, store_env

__all__ = ["MODES", "AgentStore", "StoreHost", "StoreHostError", "listen", "store_env", "torch_importable",
           "uses_live_binding", "wrapped_python"]
