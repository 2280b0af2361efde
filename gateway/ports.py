"""What a lower layer may ask of the layers above it, as small Protocols.

The gateway's layers call only downward (docs/architecture.md): features, observe, controls
and the cluster link run inside a vhost, a connection or the node, but they must not import
them. Each asks instead for the little it uses, named here, as the queue layer reaches
sessions only through ``queues/consumer.py``. ``VirtualHost``, ``Session``, ``ChannelState``
and ``Node`` satisfy these structurally; mypy checks it where they are handed down.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gateway.queues.rate_limit import Limits
from gateway.queues.runtime import QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.routing import Router
from meta.change_feed import Change
from meta.store import MetadataStore
from storage import Record, StorePort

if TYPE_CHECKING:
    from gateway.features.direct_reply import DirectReplies


class VhostPort(Protocol):
    """A vhost as the delayed exchange, redelivery backoff and the firehose use it: route
    with its router, find its queues, append a batch, wake the dead-letter outbox."""

    @property
    def name(self) -> str: ...

    @property
    def router(self) -> Router: ...

    @property
    def queues(self) -> Mapping[str, QueueRuntime]: ...

    @property
    def queues_by_id(self) -> Mapping[int, QueueRuntime]: ...

    async def append(self, records: list[Record], wait_durable: bool = False) -> None: ...

    def on_dead_letter(self) -> None: ...


class ConnectionPort(Protocol):
    """A client connection as broadcast consumption and the controls see it."""

    @property
    def id(self) -> str:
        """Unique on this gateway (log lines, anonymous subscriptions)."""
        ...

    @property
    def name(self) -> str:
        """The management API's connection name (``peer -> local``)."""
        ...

    @property
    def peer(self) -> str:
        """The client's ``host:port``."""
        ...

    @property
    def client_properties(self) -> Mapping[str, Any]: ...

    @property
    def vhost_name(self) -> str:
        """The vhost it opened ("" before connection.open)."""
        ...

    # Written by the controls: ``stopped`` and ``limits`` are read by Consumer.has_credit on
    # every delivery, ``publish_limits`` by the session after each batch of publishes.
    stopped: bool
    limits: Limits | None
    publish_limits: Limits | None


class ControlledNode(Protocol):
    """The node as the consumption controls use it."""

    @property
    def name(self) -> str: ...

    @property
    def meta(self) -> MetadataStore: ...

    @property
    def scheduler(self) -> PushScheduler: ...

    @property
    def clustered(self) -> bool:
        """Connections of other gateways outlive this one (their controls stay)."""
        ...

    @property
    def sessions(self) -> Collection[ConnectionPort]:
        """The open client connections of this gateway."""
        ...

    def all_queues(self) -> Sequence[QueueRuntime]:
        """Every queue this gateway has attached."""
        ...


class ClusterNode(Protocol):
    """The node as the cluster link uses it: hand it the metadata feed's changes (or a
    whole reload after a gap), find queues to take or give up delivery leases."""

    @property
    def name(self) -> str: ...

    @property
    def store(self) -> StorePort: ...

    @property
    def scheduler(self) -> PushScheduler: ...

    async def apply_change(self, change: Change) -> None: ...

    async def reload_metadata(self) -> None: ...

    def all_queues(self) -> Sequence[QueueRuntime]: ...

    def queue_by_id(self, queue_id: int) -> QueueRuntime | None: ...

    @property
    def direct_replies(self) -> DirectReplies[Any]:
        """Its direct reply-to consumers (the reply relay delivers to them)."""
        ...
