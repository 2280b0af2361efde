"""Keep a gateway's caches in step with metadata changed elsewhere (cluster mode).

The change feed (meta/change_feed.py) brings every change, this gateway's own included, so
each one is applied idempotently: a queue already attached is not attached again, a binding
already routed is not added twice, a deletion of something unknown does nothing. Deleting a
queue's store data is the business of the gateway that deleted it; the others only drop
their runtime. ``reload`` rebuilds everything from the store after a gap in the feed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, MutableMapping
from typing import Any, Protocol

from gateway.features.queue_kinds import scale_refusal
from gateway.sessions import taps
from gateway.sessions.host import SessionHost
from gateway.vhost import VirtualHost, keyed_routes
from meta.change_feed import Change
from meta.models import (
    BindingDef,
    Deletions,
    ExchangeDef,
    GrayEnd,
    GrayRule,
    QueueDef,
    VHost,
    VHostLimits,
)

log = logging.getLogger("mqgw.cluster")
# Node-wide changes applied by ``_apply_limits_or_gray``.
_LIMITS_AND_GRAY = frozenset(
    {
        "vhost_limits.set",
        "vhost_limits.cleared",
        "gray_rule.set",
        "gray_rule.deleted",
        "gray_end.set",
        "gray_end.deleted",
    }
)


class SyncedNode(SessionHost, Protocol):
    """The node as the change feed keeps it in step: what a session sees of it (the firehose
    taps are set through that), and its vhosts, users and limits to reload. ``Node``
    satisfies it; naming it here keeps this module from importing the node that calls it."""

    @property
    def vhost_limits(self) -> MutableMapping[str, VHostLimits]: ...

    async def refresh_users(self) -> None: ...

    async def load_vhost_limits(self) -> None: ...

    async def open_vhost(self, name: str) -> VirtualHost: ...

    async def forget_vhost(self, name: str) -> None: ...


async def apply_change(node: SyncedNode, change: Change) -> None:
    if await _apply_to_node(node, change):
        return
    vhost = node.vhosts.get(change.vhost)
    if vhost is None:
        return  # a vhost we do not have (yet): its vhost.added reloads it whole
    await _apply_to_vhost(node, vhost, change)


async def _apply_to_node(node: SyncedNode, change: Change) -> bool:
    """A change to what the node holds beside a vhost's topology (users, controls, limits,
    gray rules, placement, the vhosts themselves); False: a change inside a vhost."""
    kind = change.kind
    if kind.startswith(("user.", "permission.")):
        await node.access.load()
        await node.refresh_users()
    elif kind.startswith("control."):
        await node.controls.reload()
    elif kind in _LIMITS_AND_GRAY:
        _apply_limits_or_gray(node, change)
    elif kind == "placement.set":  # a queue's partitions placed on broker groups
        if node.cluster is not None and node.cluster.placement is not None:
            node.cluster.placement.changed(change)
    elif kind == "vhost.added":
        if change.vhost not in node.vhosts:
            await node.open_vhost(change.vhost)
    elif kind == "vhost.deleted":
        await node.forget_vhost(change.vhost)
        _forget_gray_ends(node, change.vhost, node.gray.ended_in(change.vhost))
    elif kind == "vhost.updated":  # the firehose switched on or off (a gateway's admin API)
        updated, vhost = change.entity(), node.vhosts.get(change.vhost)
        if isinstance(updated, VHost) and vhost is not None:
            vhost.default_groups = updated.default_groups
            await taps.set_firehose(node, vhost, updated.tracing)
    else:
        return False
    return True


def _apply_limits_or_gray(node: SyncedNode, change: Change) -> None:
    kind = change.kind
    if kind == "vhost_limits.set":  # enforced at connection.open (sessions/session.py)
        limits = change.entity()
        assert isinstance(limits, VHostLimits)
        node.vhost_limits[limits.vhost] = limits
    elif kind == "vhost_limits.cleared":
        node.vhost_limits.pop(change.vhost, None)
    elif kind == "gray_rule.set":  # the registry re-colors the connections it matches
        rule = change.entity()
        assert isinstance(rule, GrayRule)
        node.gray.rule_set(rule)
    elif kind == "gray_rule.deleted":
        node.gray.rule_deleted(change.name)
    elif kind == "gray_end.set":  # the queue loses its gray partitions at once
        end = change.entity()
        assert isinstance(end, GrayEnd)
        node.gray.end_set(end)
    elif kind == "gray_end.deleted":
        node.gray.end_deleted(change.vhost, change.name)


async def _apply_to_vhost(node: SyncedNode, vhost: VirtualHost, change: Change) -> None:
    """A change to one vhost's topology: policies, exchanges, queues, bindings, routes."""
    kind = change.kind
    entity: Any = change.entity()
    if kind.startswith("policy."):
        await vhost.apply_policies()
    elif kind == "exchange.declared":
        assert isinstance(entity, ExchangeDef)
        if vhost.router.get_exchange(entity.name) is None:
            vhost.router.add_exchange(entity)
    elif kind == "exchange.deleted":
        assert isinstance(entity, ExchangeDef)
        await vhost.forget(Deletions(exchanges=(entity,)))
    elif kind == "queue.declared":
        assert isinstance(entity, QueueDef)
        # Heard late, the queue may be gone (a reply queue declared and deleted at once):
        # attaching it would create it on its broker and place it anew, for good. Its
        # queue.deleted (and any new declaration) follow in the feed.
        current = await vhost.meta.get_queue(vhost.name, entity.name)
        if current is not None and current.queue_id == entity.queue_id:
            await vhost.adopt_queue(entity)
    elif kind == "queue.deleted":
        assert isinstance(entity, QueueDef)
        await vhost.forget(Deletions(queues=(entity,)))
        _forget_gray_ends(node, entity.vhost, [entity.name])
    elif kind == "binding.added":
        assert isinstance(entity, BindingDef)
        if vhost.router.get_exchange(entity.source) is not None:
            vhost.router.add_binding(entity)
    elif kind == "binding.removed":
        assert isinstance(entity, BindingDef)
        await vhost.forget(Deletions(bindings=(entity,)))
    elif kind == "route.set":  # a queue rescaled: publishers and readers follow
        runtime = vhost.queues.get(change.name)
        if runtime is not None and (runtime.route is not None or scale_refusal(runtime) is None):
            await keyed_routes.follow(vhost, runtime)


async def reload(node: SyncedNode) -> None:
    """After a gap in the feed: users, permissions, controls, limits, gray rules and ends,
    and every vhost's topology (queues gone elsewhere lose their runtime here; new ones get
    one)."""
    await node.access.load()
    await node.refresh_users()
    await node.controls.reload()
    await node.load_vhost_limits()
    node.gray.load(await node.meta.list_gray_rules())
    node.gray.load_ends(await node.meta.list_gray_ends())
    names = {v.name for v in await node.meta.list_vhosts()}
    for name in [n for n in node.vhosts if n not in names]:
        await node.forget_vhost(name)
    for name in names:
        vhost = node.vhosts.get(name)
        if vhost is None:
            await node.open_vhost(name)
        else:
            await _reload_vhost(node, vhost)


def _forget_gray_ends(node: SyncedNode, vhost: str, queues: Iterable[str]) -> None:
    """Deleted queues lose their gray end in the store without a change of its own."""
    for queue in list(queues):
        node.gray.end_deleted(vhost, queue)


async def _reload_vhost(node: SyncedNode, vhost: VirtualHost) -> None:
    queues = {q.name: q for q in await vhost.meta.list_queues(vhost.name)}
    gone = [r.definition for name, r in vhost.queues.items() if name not in queues]
    if gone:
        await vhost.forget(Deletions(queues=tuple(gone)))
    await vhost.rebuild_router()
    for definition in queues.values():
        await vhost.adopt_queue(definition)
    for runtime in list(vhost.queues.values()):  # routes changed (or came) during the gap
        if runtime.route is not None or scale_refusal(runtime) is None:
            await keyed_routes.follow(vhost, runtime)
    await vhost.apply_policies()
    await taps.restore_firehose(node, vhost)
    log.info("vhost %r reloaded from the metadata store", vhost.name)
