"""A private RabbitMQ node for differential tests (Debian's rabbitmq-server, 3.10).

The launcher lives in ``bench/servers.py`` (the side-by-side benchmark starts the same node);
see there. If RabbitMQ cannot start, ``start`` raises: differential tests must fail, never skip.
"""

from __future__ import annotations

from bench.rabbitmq_node import EPMD, RABBITMQ_SERVER, RabbitMQProcess
from bench.servers import free_port

__all__ = ["EPMD", "RABBITMQ_SERVER", "RabbitMQProcess", "free_port"]
