"""A virtual host on this gateway: its router, its queues' runtimes, its metadata calls.

Metadata (meta/) decides what exists and checks RabbitMQ's rules; the router answers where a
publish goes; the store holds messages. This class keeps the three in step: a queue declared
in metadata gets a store queue id and a runtime; deletions cascade to both.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.amqp.errors import AMQPError, NotFound, error_for_code
from gateway.push_scheduler import PushScheduler
from gateway.queue_runtime import QueueRuntime
from gateway.routing import Router
from meta.errors import MetaError
from meta.local_store import LocalMetadataStore
from meta.models import BindingDef, Deletions, ExchangeDef, QueueDef
from storage import EmbeddedStore, UnknownQueue

log = logging.getLogger("mqgw.vhost")

T = TypeVar("T")


def amqp_error(error: MetaError, class_id: int, method_id: int) -> AMQPError:
    return error_for_code(error.reply_code, error.detail, class_id, method_id)


async def meta_call(call: Awaitable[T], class_id: int, method_id: int) -> T:
    """Await a metadata operation, turning its typed error into the AMQP one."""
    try:
        return await call
    except MetaError as error:
        raise amqp_error(error, class_id, method_id) from None


class VirtualHost:
    def __init__(
        self,
        name: str,
        meta: LocalMetadataStore,
        store: EmbeddedStore,
        scheduler: PushScheduler,
        partitions: int,
    ) -> None:
        self.name = name
        self.meta = meta
        self.store = store
        self.scheduler = scheduler
        self.partitions = partitions
        self.router = Router(name)
        self.queues: dict[str, QueueRuntime] = {}
        self.queues_by_id: dict[int, QueueRuntime] = {}
        self.on_queue_deleted: Callable[[QueueRuntime], None] = lambda _q: None

    async def load(self) -> None:
        """Build the router and runtimes from metadata (after a restart: durable things)."""
        exchanges = await self.meta.list_exchanges(self.name)
        queues = await self.meta.list_queues(self.name)
        bindings = await self.meta.list_bindings(self.name)
        self.router = Router.from_definitions(
            self.name, exchanges, [q.name for q in queues], bindings
        )
        for definition in queues:
            await self._attach_queue(definition)

    async def _attach_queue(self, definition: QueueDef) -> QueueRuntime:
        await self.store.create_queue(definition.queue_id, definition.partitions)
        runtime = QueueRuntime(definition, self.store)
        await runtime.start()
        self.queues[definition.name] = runtime
        self.queues_by_id[definition.queue_id] = runtime
        return runtime

    # -- exchanges -----------------------------------------------------------------------

    async def declare_exchange(self, definition: ExchangeDef, passive: bool) -> ExchangeDef:
        declared = await meta_call(self.meta.declare_exchange(definition, passive), 40, 10)
        if self.router.get_exchange(declared.name) is None:
            self.router.add_exchange(declared)
        return declared

    async def delete_exchange(self, name: str, if_unused: bool) -> None:
        deletions = await meta_call(self.meta.delete_exchange(self.name, name, if_unused), 40, 20)
        await self.apply_deletions(deletions)

    # -- queues ---------------------------------------------------------------------------

    async def declare_queue(
        self, definition: QueueDef, passive: bool, connection_id: str
    ) -> QueueRuntime:
        declared = await meta_call(
            self.meta.declare_queue(definition, passive, connection_id), 50, 10
        )
        runtime = self.queues.get(declared.name)
        if runtime is None:
            runtime = await self._attach_queue(declared)
            self.router.add_queue(declared.name)
        return runtime

    def queue(self, name: str, class_id: int, method_id: int) -> QueueRuntime:
        runtime = self.queues.get(name)
        if runtime is None:
            raise NotFound(f"no queue '{name}' in vhost '{self.name}'", class_id, method_id)
        return runtime

    async def delete_queue(self, name: str, connection_id: str | None, check: bool = True) -> None:
        deletions = await meta_call(
            self.meta.delete_queue(self.name, name, connection_id, check_exclusive=check), 50, 40
        )
        await self.apply_deletions(deletions)

    async def apply_deletions(self, deletions: Deletions) -> None:
        self.router.apply_deletions(deletions)
        for definition in deletions.queues:
            runtime = self.queues.pop(definition.name, None)
            if runtime is None:
                continue
            self.queues_by_id.pop(runtime.queue_id, None)
            runtime.deleted = True
            self.on_queue_deleted(runtime)
            try:
                await self.store.delete_queue(definition.queue_id)
            except UnknownQueue:
                log.warning("queue %r had no store queue %d", definition.name, runtime.queue_id)

    # -- bindings -------------------------------------------------------------------------

    async def bind(
        self, binding: BindingDef, connection_id: str, class_id: int, method_id: int
    ) -> None:
        if await meta_call(self.meta.bind(binding, connection_id), class_id, method_id):
            self.router.add_binding(binding)

    async def unbind(
        self, binding: BindingDef, connection_id: str, class_id: int, method_id: int
    ) -> None:
        deletions = await meta_call(self.meta.unbind(binding, connection_id), class_id, method_id)
        await self.apply_deletions(deletions)
