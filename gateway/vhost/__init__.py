"""A virtual host on this gateway: its router, its queues' runtimes and its metadata calls
kept in step (``host.py``), and the outbox that routes its dead letters again
(``dead_letter_outbox.py``)."""

from gateway.vhost.host import VirtualHost
from gateway.vhost.meta_calls import amqp_error, meta_call

__all__ = ["VirtualHost", "amqp_error", "meta_call"]
