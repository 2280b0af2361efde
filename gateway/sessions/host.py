"""What a connection may ask of the node it runs in: ``SessionHost``.

A session is built by the node and lives inside it, but it must not import it (the node is
the layer above, docs/architecture.md). It asks for the node's services through this
Protocol instead; ``Node`` satisfies it, which mypy checks where the server hands a node to
``serve_connection``. Keep it to what sessions really use: a member here is a coupling.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableSet
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.cluster.backlog import RemoteBacklog
    from gateway.cluster.link import ClusterLink
    from gateway.config.settings import GatewaySettings
    from gateway.controls import Controls
    from gateway.features.broadcast import Broadcasts
    from gateway.features.direct_reply import DirectReplies
    from gateway.features.log_timer import LogTimer
    from gateway.observe.stats import NodeStats
    from gateway.observe.tracing import Tracing
    from gateway.queues.runtime import QueueRuntime
    from gateway.queues.scheduler import PushScheduler
    from gateway.resources.alarms import Alarms
    from gateway.sessions.access import Access
    from gateway.sessions.channel_state import ChannelState
    from gateway.sessions.session import Session
    from gateway.vhost import VirtualHost
    from meta.models import User
    from meta.store import MetadataStore
    from storage import StoredMessage, StorePort


class SessionHost(Protocol):
    # What the node is made of, as sessions read it.
    @property
    def name(self) -> str: ...
    @property
    def settings(self) -> GatewaySettings: ...
    @property
    def store(self) -> StorePort: ...
    @property
    def meta(self) -> MetadataStore: ...
    @property
    def vhosts(self) -> Mapping[str, VirtualHost]: ...
    @property
    def scheduler(self) -> PushScheduler: ...
    @property
    def access(self) -> Access: ...
    @property
    def controls(self) -> Controls: ...
    @property
    def alarms(self) -> Alarms: ...
    @property
    def stats(self) -> NodeStats: ...
    @property
    def tracing(self) -> Tracing | None: ...
    @property
    def broadcasts(self) -> Broadcasts: ...
    @property
    def direct_replies(self) -> DirectReplies[ChannelState]: ...
    @property
    def timer(self) -> LogTimer: ...
    @property
    def cluster(self) -> ClusterLink | None: ...
    @property
    def remote_backlog(self) -> RemoteBacklog | None: ...

    # What sessions keep up to date in it.
    @property
    def sessions(self) -> MutableSet[Session]: ...
    @property
    def owners_to_clean(self) -> MutableSet[str]: ...

    open_connections: int
    next_resource_look: int

    def admit(self, session: Session) -> bool: ...
    def next_connection_number(self) -> int: ...
    async def authenticate(self, username: str, password: bytes) -> User | None: ...
    def known_user(self, name: str) -> User | None: ...
    async def get_user(self, name: str) -> User | None: ...
    def block_reason(self) -> str: ...
    async def look_at_resources(self, end_offset: int) -> None: ...
    def back_off(
        self, vhost: VirtualHost, queue: QueueRuntime, partition: int, message: StoredMessage
    ) -> None: ...
