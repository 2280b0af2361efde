"""Cluster-wide management views and consumer exclusivity across gateways (cluster mode).

- **Views.** Every ``PUBLISH_EVERY_S`` the gateway writes what its management API shows of
  its own objects (connections, channels, consumers, node figures, message stats: plain
  JSON the admin layer builds, ``ViewSource``) to Redis under a key with a TTL of
  ``VIEW_TTL_MS`` (meta/cluster_views.py); a gateway's API answers with its own objects as
  they are and the others' as last written. So another gateway's objects are at most
  ``PUBLISH_EVERY_S`` (plus a Redis round trip) old, and a dead gateway's vanish within
  ``VIEW_TTL_MS``; a clean stop removes them at once. Off the per-message path: one SET
  per gateway per second, and one Redis read per management request.
- **Requests.** Closing a connection another gateway holds is a request to it over Redis
  (a list per gateway, read with BLPOP, as lease hand-overs are), answered "closed" or
  "absent" (``ask_close``).
- **Consumer claims** (``ConsumerClaims``). A basic.consume in cluster mode claims the
  queue in Redis for this gateway, "x" for an exclusive consumer, "c" otherwise, refused
  while another gateway holds "x", or, for "x", any claim: RabbitMQ's 403 "in exclusive
  use". Claims are renewed every ``CLAIM_RENEW_S`` and lapse after ``CLAIM_FRESH_MS``
  (a gateway killed or cut off); a queue with no consumer left here (its connection
  closed, the consumer cancelled) is released, or lowered from "x" to "c", within
  ``CLAIM_GRACE_S + CLAIM_LOOK_S`` plus a Redis round trip. While Redis cannot be reached
  a consume goes ahead after ``CLAIM_WAIT_S`` with only this gateway's checks (consuming
  carries on without Redis, as publishing does).
"""

from __future__ import annotations

import itertools
import json
import logging
import uuid
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from gateway.amqp.errors import AccessRefused
from meta.cluster_views import ClusterViewStore, ViewRequest
from meta.errors import MetadataUnavailable

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime
    from meta.redis_store import RedisMetadataStore

log = logging.getLogger("mqgw.cluster")

PUBLISH_EVERY_S = 1.0
VIEW_TTL_MS = 3_000  # a view not rewritten for this long is a gateway gone
READ_WAIT_S = 1.0  # a management request waits this long for the others' views at most
REQUEST_LISTEN_S = 1.0  # the blocking read of requests to this gateway (then read again)
ASK_WAIT_S = 2.0  # how long an action waits for the holder's answer
RETRY_S = 0.5
CLAIM_FRESH_MS = 3_000  # a claim not renewed for this long is a gateway gone (< its lease)
CLAIM_RENEW_S = 1.0
CLAIM_LOOK_S = 0.1  # how often the claims are compared with the queues' consumers
# A claim just made is kept this long before it is compared with the queue's consumers: the
# consume that made it adds its consumer after it (the checks that follow, consume-ok).
CLAIM_GRACE_S = 0.3
# A "c" claim written this recently stands for the next non-exclusive consume without a
# Redis call: while it is fresh (CLAIM_FRESH_MS), no other gateway can claim "x".
CLAIM_TRUST_S = 1.5
CLAIM_WAIT_S = 1.0  # a consume waits this long for Redis, then goes on with local checks

CLOSED = "closed"
ABSENT = "absent"


class ViewSource(Protocol):
    """What the admin layer hands down: this gateway's objects as its API shows them."""

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready: "connections", "channels", "consumers" (lists of the API's rows),
        "node" (its /api/nodes entry), "message_stats" (its /api/overview's)."""
        ...

    def close_connection(self, name: str, reason: str) -> bool:
        """Close connection ``name`` here with 320 CONNECTION_FORCED; False if not here."""
        ...


class ClusterViews:
    """The view publisher and request server of one gateway (ClusterLink runs it)."""

    def __init__(
        self,
        meta: RedisMetadataStore,
        gateway_id: str,
        queues: Callable[[], Iterable[QueueRuntime]],
    ) -> None:
        self.store = ClusterViewStore(meta)
        self.gateway_id = gateway_id
        self.source: ViewSource | None = None  # set by the admin app (no admin: not shown)
        self.claims = ConsumerClaims(self.store, gateway_id, queues)
        self.published = 0
        self._requests = itertools.count(1)
        self._run_id = uuid.uuid4().hex[:12]  # request ids stay unique across restarts
        self._warned = False

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._publish)
                tg.start_soon(self._serve)
                tg.start_soon(self.claims.run)
        finally:
            # A clean stop: gone from the others' views at once (else after VIEW_TTL_MS).
            with anyio.move_on_after(1.0, shield=True), suppress(MetadataUnavailable):
                await self.store.drop_view(self.gateway_id)
                await self.claims.release_all()

    async def _publish(self) -> None:
        while True:
            if self.source is not None:
                view = json.dumps(self.source.snapshot(), separators=(",", ":"))
                try:
                    await self.store.write_view(self.gateway_id, view, VIEW_TTL_MS)
                    self.published += 1
                    if self._warned:
                        log.info("cluster: management views published again")
                        self._warned = False
                except MetadataUnavailable as error:
                    if not self._warned:
                        log.warning("cluster: management views not published: %s", error)
                        self._warned = True
            await anyio.sleep(PUBLISH_EVERY_S)

    async def others(self) -> dict[str, dict[str, Any]]:
        """The other live gateways' views, by gateway; {} (logged) while Redis is away."""
        try:
            with anyio.fail_after(READ_WAIT_S):
                views = await self.store.read_views()
        except (MetadataUnavailable, TimeoutError) as error:
            log.warning("cluster: other gateways' views not read (%s)", error or "timed out")
            return {}
        found: dict[str, dict[str, Any]] = {}
        for gateway, view in views.items():
            if gateway == self.gateway_id:
                continue  # this gateway answers with its objects as they are now
            try:
                parsed = json.loads(view)
            except ValueError:
                log.warning("cluster: unreadable view of gateway %s ignored", gateway)
                continue
            if isinstance(parsed, dict):
                found[gateway] = parsed
        return found

    async def ask_close(self, gateway: str, name: str, reason: str) -> str | None:
        """Ask ``gateway`` to close its connection ``name``: CLOSED, ABSENT, or None when
        it did not answer within ``ASK_WAIT_S``. Raises MetadataUnavailable."""
        request_id = f"{self.gateway_id}/{self._run_id}/{next(self._requests)}"
        request = ViewRequest(request_id, "close", name, reason)
        return await self.store.ask(gateway, request, ASK_WAIT_S)

    async def _serve(self) -> None:
        """Answer the other gateways' requests about objects held here."""
        while True:
            try:
                for request in await self.store.requests(self.gateway_id, REQUEST_LISTEN_S):
                    await self.store.answer(request.request_id, self._act(request))
            except MetadataUnavailable as error:
                log.warning("cluster: management requests: %s", error)
                await anyio.sleep(RETRY_S)

    def _act(self, request: ViewRequest) -> str:
        source = self.source
        if request.action != "close" or source is None:
            return ABSENT
        if not source.close_connection(request.name, request.reason):
            return ABSENT
        log.info("cluster: connection %r closed at another gateway's request", request.name)
        return CLOSED


@dataclass
class _Claim:
    queue: QueueRuntime
    exclusive: bool  # what Redis holds for this gateway
    claimed_at: float  # the last consume that claimed it
    written_at: float  # the last write that Redis acknowledged


class ConsumerClaims:
    """This gateway's consumer claims (see the module doc)."""

    def __init__(
        self,
        store: ClusterViewStore,
        gateway_id: str,
        queues: Callable[[], Iterable[QueueRuntime]],
    ) -> None:
        self.store = store
        self.gateway_id = gateway_id
        self.queues = queues  # every queue this gateway attached
        self._held: dict[tuple[str, str], _Claim] = {}
        # Claims and renewals are written one at a time: a renewal computed before a
        # consume's claim cannot overwrite it with what it had seen.
        self._lock = anyio.Lock()
        self.unchecked = 0  # consumes let through unchecked while Redis was away

    async def claim(self, queue: QueueRuntime, exclusive: bool) -> None:
        """Before a consumer is added here: raises 403 ACCESS_REFUSED "in exclusive use"
        when another gateway has an exclusive consumer on the queue, or (``exclusive``) any
        consumer."""
        vhost, name = queue.definition.vhost, queue.name
        key = (vhost, name)
        now = anyio.current_time()
        held = self._held.get(key)
        if (
            held is not None
            and held.queue is queue
            and not exclusive
            and now - held.written_at < CLAIM_TRUST_S
        ):
            held.claimed_at = now
            return
        try:
            with anyio.fail_after(CLAIM_WAIT_S):
                async with self._lock:
                    other = await self.store.claim(
                        self.gateway_id, vhost, name, exclusive, CLAIM_FRESH_MS
                    )
                    if other is None:
                        held = self._held.get(key)
                        kept = held is not None and held.queue is queue and held.exclusive
                        self._held[key] = _Claim(queue, exclusive or kept, now, now)
        except (MetadataUnavailable, TimeoutError) as error:
            self.unchecked += 1
            log.warning("cluster: consume on queue %r not checked against other gateways "
                        "(%s)", name, error or "timed out")  # fmt: skip
            return
        if other is not None:
            raise AccessRefused(f"queue '{name}' in vhost '{vhost}' in exclusive use", 60, 20)

    async def run(self) -> None:
        whole_at = 0.0
        while True:
            await anyio.sleep(CLAIM_LOOK_S)
            now = anyio.current_time()
            try:
                with anyio.fail_after(CLAIM_WAIT_S):
                    async with self._lock:
                        if now >= whole_at:  # every queue, not just those claimed
                            whole_at = now + CLAIM_RENEW_S
                            self._adopt()
                        await self._look()
            except (MetadataUnavailable, TimeoutError) as error:
                log.warning("cluster: consumer claims not renewed: %s", str(error) or "timed out")
                await anyio.sleep(RETRY_S)

    def _adopt(self) -> None:
        """Claim, at the next ``_look``, the queues with consumers here and no claim: one
        whose claim was released before its consumer came (a consume slower than
        ``CLAIM_GRACE_S``), or written while Redis was away."""
        for queue in self.queues():
            key = (queue.definition.vhost, queue.name)
            held = self._held.get(key)
            if queue.consumers and not queue.deleted and (held is None or held.queue is not queue):
                self._held[key] = _Claim(queue, queue.has_exclusive_consumer, -1e9, -1e9)

    async def _look(self) -> None:
        """Release the claims of queues without consumers here, lower "x" to "c" where the
        exclusive consumer went, renew the others every ``CLAIM_RENEW_S``."""
        now = anyio.current_time()
        release: list[tuple[str, str]] = []
        renew: dict[tuple[str, str], bool] = {}
        for key, held in self._held.items():
            exclusive = held.exclusive
            if now - held.claimed_at >= CLAIM_GRACE_S:
                queue = held.queue
                if queue.deleted or not queue.consumers:
                    release.append(key)
                    continue
                exclusive = queue.has_exclusive_consumer
            if exclusive != held.exclusive or now - held.written_at >= CLAIM_RENEW_S:
                renew[key] = exclusive
        if release:
            await self.store.release_claims(self.gateway_id, release)
            for key in release:
                del self._held[key]
        if renew:
            in_the_way = await self.store.renew_claims(self.gateway_id, renew, CLAIM_FRESH_MS)
            for key, exclusive in renew.items():
                self._held[key].exclusive = exclusive
                self._held[key].written_at = now
            for (vhost, name), other in in_the_way.items():
                # Only after this gateway's claim lapsed (Redis out of reach longer than
                # CLAIM_FRESH_MS): both keep their consumers; said, not undone.
                log.warning("cluster: queue %r in vhost %r: consumers here and on gateway %s "
                            "despite an exclusive consumer", name, vhost, other)  # fmt: skip

    async def release_all(self) -> None:
        """At a stop: every claim of this gateway goes."""
        held = list(self._held)
        self._held.clear()
        await self.store.release_claims(self.gateway_id, held)
