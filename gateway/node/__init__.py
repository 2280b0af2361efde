"""The gateway node, the composition root: one store, one metadata store, its vhosts, the push
scheduler, the connections and the node's services (``node.py``), the users it authenticates
against (``users.py``) and the metadata change feed applied to all of them
(``metadata_sync.py``). The node's jobs, each in its own module: resource alarms
(``resources.py``), the once-a-second housekeeping (``housekeeping.py``), the dead-letter and
backoff outbox (``hand_over.py``), consumer timeouts (``consumer_timeouts.py``) and admission
per address (``connections.py``)."""

from gateway.node.node import Node

__all__ = ["Node"]
