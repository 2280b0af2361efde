"""A virtual host on this gateway: its router, its queues' runtimes, its metadata calls.

Metadata (meta/) decides what exists and checks RabbitMQ's rules; the router answers where a
publish goes; the store holds messages. This class keeps the three in step: a queue declared
in metadata gets a store queue id and a runtime; deletions cascade to both. What a stored
batch does to its queues is ``intake.py``'s; metadata errors become AMQP ones in
``meta_calls.py``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import anyio

from gateway.amqp.errors import NotFound
from gateway.features.queue_kinds import new_queue_runtime
from gateway.queues.behaviour import QueueBehaviour, behaviour_of
from gateway.queues.dead_letter import DeadLetter
from gateway.queues.runtime import QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.routing import Router
from gateway.vhost import dead_letter_outbox, keyed_routes, write_through
from gateway.vhost.intake import refuse
from gateway.vhost.meta_calls import meta_call
from meta.group_pins import pinned_groups
from meta.models import BindingDef, Deletions, ExchangeDef, Policy, QueueDef
from meta.partitions import check_policy, initial_partitions, policy_in_force
from meta.store import MetadataStore
from storage import AppendResult, BrokerUnavailable, Record, StorePort, UnknownQueue, twins

if TYPE_CHECKING:
    from gateway.cluster.placement import QueuePlacement
    from gateway.observe.firehose import Firehose

log = logging.getLogger("mqgw.vhost")
# Write-through of a stored batch: its compiled twin when built (storage/twins.py).
absorb = twins.pick(write_through.absorb)
GONE_KEPT = 4096  # deleted queue ids remembered: a late feed echo must not bring one back


class VirtualHost:
    def __init__(
        self,
        name: str,
        meta: MetadataStore,
        store: StorePort,
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
        self._attaching: dict[str, anyio.Event] = {}  # queue name -> set once attached
        self.waiting: set[QueueRuntime] = set()  # attached while their broker was down
        self._deleted_ids: dict[int, None] = {}  # the latest GONE_KEPT, oldest first
        self.on_queue_deleted: Callable[[QueueRuntime], None] = lambda _q: None
        self.on_queue_attached: Callable[[QueueRuntime], None] = lambda _q: None
        self.policies: list[Policy] = []
        # Queues whose gray release an operator ended (gateway/features/gray.py): no gray
        # partitions, whatever their argument or policy say.
        self.gray_ended: set[str] = set()
        self.dead_letters: list[DeadLetter] = []
        self.on_dead_letter: Callable[[], None] = lambda: None  # the node drains them
        self.firehose: Firehose | None = None  # tracing on (gateway/sessions/taps.py switches it)
        self.placement: QueuePlacement | None = None  # several broker groups (cluster_link)
        self.default_groups: tuple[str, ...] = ()  # the vhost's pin (meta/group_pins.py)
        # Queues on a route, by id: keyed-order ones (gateway/queues/ordered.py) and plain
        # ones that scaled (meta/channel_route.py); and a count of their route changes here:
        # a publish batch routed before a change is routed again before its append
        # (``reroute``), so nothing lands in a partition after its command record.
        self.routed: dict[int, QueueRuntime] = {}
        self.route_epoch = 0
        # Why no route change may close a partition here (None: it may): a store that does
        # not refuse appends after a closing record, shared by several gateways, cannot
        # make one that has not seen the change yet stop writing there.
        self.closing_refused: str | None = None

    async def load(self) -> None:
        """Build the router and runtimes from metadata (after a restart: durable things)."""
        exchanges = await self.meta.list_exchanges(self.name)
        queues = await self.meta.list_queues(self.name)
        bindings = await self.meta.list_bindings(self.name)
        self.policies = await self.meta.list_policies(self.name)
        self.router = Router.from_definitions(
            self.name, exchanges, [q.name for q in queues], bindings
        )
        for definition in queues:
            await self._attach_queue(definition, broker_may_be_down=True, loading=True)

    async def _attach_queue(
        self, definition: QueueDef, broker_may_be_down: bool = False, loading: bool = False
    ) -> QueueRuntime:
        """The queue's runtime, started from the store. ``broker_may_be_down``: a queue that
        exists already (a restart, another gateway's declaration) whose broker group is down
        is attached all the same, waiting (``start_waiting``): the gateway serves the other
        groups' queues meanwhile, and publishes to this one are nacked. ``loading``: known
        before (a restart): a policy's ``ordering`` does not make it keyed now."""
        route = await keyed_routes.route_of(self, definition, self.policy_for(definition.name),
                                            loading)  # fmt: skip
        runtime = new_queue_runtime(
            definition,
            self.store,
            self._behaviour(definition),
            self._dead_letter,
            self.scheduler.wake,
            self.scheduler.clock,
            route,
        )
        try:
            await self._start(runtime)
        except BrokerUnavailable as error:
            if not broker_may_be_down:
                raise
            log.warning("queue %r waits for its broker group: %s", definition.name, error)
            runtime.waiting_for_broker = True
            self.waiting.add(runtime)
        self.queues[definition.name] = runtime
        self.queues_by_id[definition.queue_id] = runtime
        if runtime.route is not None:
            self.routed[definition.queue_id] = runtime
        self.on_queue_attached(runtime)  # consumption controls in force for it
        self.scheduler.wake(runtime)  # TTL and x-expires start counting now
        return runtime

    async def _start(self, runtime: QueueRuntime) -> None:
        definition = runtime.definition
        if self.placement is not None:  # on its broker groups, chosen once for the cluster
            await self.placement.place(definition, self.pins(definition))
        # A keyed-order queue may have gained partitions since it was declared (its route's).
        await self.store.create_queue(definition.queue_id, runtime.partitions)
        if runtime.route is not None:
            await keyed_routes.finish_closing(self, runtime)
        await runtime.start()

    async def start_waiting(self) -> None:
        """Start the queues attached while their broker group was down, once it is back."""
        for runtime in list(self.waiting):
            if runtime.deleted:
                self.waiting.discard(runtime)
                continue
            try:
                await self._start(runtime)
            except BrokerUnavailable:
                continue
            self.waiting.discard(runtime)
            runtime.waiting_for_broker = False
            log.info("queue %r: its broker group is back", runtime.name)
            self.scheduler.wake(runtime)

    # -- policies -------------------------------------------------------------------------

    def pins(self, definition: QueueDef) -> tuple[str, ...]:
        """The broker groups the queue may use; () for any (meta/group_pins.py)."""
        policy = self.policy_for(definition.name)
        return pinned_groups(
            definition.arguments, None if policy is None else policy.definition,
            self.default_groups,
        )  # fmt: skip

    def policy_for(self, queue_name: str) -> Policy | None:
        """The policy in force for a queue: the highest priority of those that match."""
        return policy_in_force(self.policies, queue_name)

    def with_partitions(self, definition: QueueDef) -> QueueDef:
        """``definition`` with the partitions it gets if created now: x-mqgw-partitions,
        else its policy's "partitions", else the node's (meta/partitions.py)."""
        policy = self.policy_for(definition.name)
        count = initial_partitions(
            definition, None if policy is None else policy.definition, self.partitions
        )
        return definition.model_copy(update={"partitions": count})

    def check_policy(self, policy: Policy) -> None:
        """Raises PolicyInvalid (a ValueError) if ``policy`` breaks a partition rule here."""
        check_policy(policy, (q.definition for q in self.queues.values()))

    def _behaviour(self, definition: QueueDef) -> QueueBehaviour:
        policy = self.policy_for(definition.name)
        behaviour = behaviour_of(
            definition.arguments, None if policy is None else policy.definition
        )
        if behaviour.gray_partitions and definition.name in self.gray_ended:
            return dataclasses.replace(behaviour, gray_partitions=0)
        return behaviour

    def set_gray_ended(self, queue_name: str, ended: bool) -> None:
        """Gray release ended for the queue (or resumed): its behaviour follows at once."""
        if ended:
            self.gray_ended.add(queue_name)
        else:
            self.gray_ended.discard(queue_name)
        queue = self.queues.get(queue_name)
        if queue is not None:
            queue.set_behaviour(self._behaviour(queue.definition))

    async def apply_policies(self) -> None:
        """Policies changed: every queue takes its (new) behaviour at once."""
        self.policies = await self.meta.list_policies(self.name)
        for queue in self.queues.values():
            before = queue.behaviour
            queue.set_behaviour(self._behaviour(queue.definition))
            if queue.behaviour.max_length_bytes is not None and before.max_length_bytes is None:
                await queue.recount_bytes()
            if queue.behaviour.has_limits and queue.over_limit():
                await queue.enforce_limits()
            self.scheduler.wake_new_messages(queue)

    # -- messages entering and leaving queues ---------------------------------------------

    def count_out(self, records: Iterable[Record]) -> None:
        """An append failed: the messages routed into it never entered their queues."""
        for record in records:
            for queue_id, _ in record.destinations:
                queue = self.queues_by_id.get(queue_id)
                if queue is not None:
                    queue.count_out(len(record.body))

    async def stored(
        self,
        queues: Iterable[QueueRuntime],
        records: Sequence[Record] = (),
        result: AppendResult | None = None,
    ) -> None:
        """Messages were appended to ``queues``: queues that had read everything take them
        from the batch in hand (no read back from the store); apply drop-head limits; wake."""
        if result is not None and result.refused:
            refuse(self.queues_by_id, records, result.refused, self._dead_letter)
        absorbed = self._absorb(records, result) if result is not None else set()
        for queue in queues:
            queue.appends_done += 1
            if not queue.plain and queue.behaviour.has_limits and queue.over_limit():
                await queue.enforce_limits()  # (a plain queue has no limits: no look)
            if queue in absorbed:
                self.scheduler.serve_fed(queue)
            else:
                self.scheduler.wake_new_messages(queue)

    def _absorb(self, records: Sequence[Record], result: AppendResult) -> set[QueueRuntime]:
        """Queues caught up with the store take the batch in hand (gateway/vhost/
        write_through.py); returns those queues."""
        return absorb(self.queues_by_id, records, result)

    async def append(self, records: list[Record], wait_durable: bool = False) -> None:
        """Append messages routed earlier (tx commit, dead letters, timers); count them in."""
        if not records:
            return
        if self.routed:  # routed maybe long before (tx.commit): the newest route
            records = self.reroute(records)
        # Counted in before the append, as a publish is: a read that meets one while the
        # append waits takes it out of the count.
        woken: set[QueueRuntime] = set()
        for record in records:
            for queue_id, _ in record.destinations:
                queue = self.queues_by_id.get(queue_id)
                if queue is not None:
                    queue.count_in(len(record.body), record.flags)
                    woken.add(queue)
        try:
            result = await self.append_routed(records, wait_durable)
        except BaseException:
            self.count_out(records)  # as a publish batch's failed append does
            raise
        await self.stored(woken, records, result)

    async def append_routed(self, records: list[Record], wait_durable: bool) -> AppendResult:
        """The store's append; with queues on a route, what a change made on another
        gateway closed meanwhile goes to its new partition (keyed_routes)."""
        if not self.routed:
            return await self.store.append(records, wait_durable=wait_durable)
        return await keyed_routes.append_refusing_closed(self, records, wait_durable)

    def reroute(self, records: list[Record]) -> list[Record]:
        """``records`` with their routed queues' partitions from the newest route."""
        return keyed_routes.reroute(self.routed, records)

    def for_append(self, records: list[Record], routed_in: int) -> list[Record]:
        """A batch routed when ``route_epoch`` was ``routed_in``, as it must be appended now:
        routed again if a keyed-order queue's route changed since (nothing may land in a
        partition after its command record). Called with no yield before the append."""
        return records if self.route_epoch == routed_in else self.reroute(records)

    def _dead_letter(self, letter: DeadLetter) -> None:
        self.dead_letters.append(letter)
        self.on_dead_letter()

    async def flush_dead_letters(self) -> int:
        """Republish what queues dead-lettered since the last call, as one batch."""
        return await dead_letter_outbox.flush(self)

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
        return await self._attach_once(declared)

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

    async def apply_deletions(self, deletions: Deletions, delete_data: bool = True) -> None:
        """Follow what a metadata deletion removed; ``delete_data``: also the queues' data in
        the store (the gateway that deleted them does; the others only drop runtimes)."""
        self.router.apply_deletions(deletions)
        for definition in deletions.queues:
            self._deleted_ids[definition.queue_id] = None
            if len(self._deleted_ids) > GONE_KEPT:
                del self._deleted_ids[next(iter(self._deleted_ids))]
            runtime = self.queues.get(definition.name)
            if runtime is None or runtime.queue_id != definition.queue_id:
                continue
            del self.queues[definition.name]
            self.queues_by_id.pop(runtime.queue_id, None)
            self.routed.pop(runtime.queue_id, None)
            runtime.deleted = True
            self.on_queue_deleted(runtime)
            if delete_data:
                try:
                    await self.store.delete_queue(definition.queue_id)
                except UnknownQueue:
                    log.warning("queue %r had no store queue %d", definition.name, runtime.queue_id)
            if self.placement is not None:
                self.placement.forget(definition)

    # -- changes made by other gateways (cluster mode: gateway/node/metadata_sync.py) -------------

    async def forget(self, deletions: Deletions) -> None:
        await self.apply_deletions(deletions, delete_data=False)

    async def adopt_queue(self, definition: QueueDef) -> None:
        """A queue declared elsewhere (or again, with a new id, after a delete we missed).
        Not one deleted here since: the feed brings a declaration back after the queue's
        quick delete (a reply queue's), and attaching it again would create it on its broker
        and place it anew, left there for good."""
        if definition.queue_id not in self._deleted_ids:
            await self._attach_once(definition, adopting=True)

    async def _attach_once(self, definition: QueueDef, adopting: bool = False) -> QueueRuntime:
        """The queue's runtime, attached unless it is already. One attachment per name at a
        time: the change feed brings a gateway's own declaration back, often while that
        declaration is still attaching (awaiting the broker); a second runtime would replace
        the first and leave the consumers on it unserved. A runtime of an older queue of the
        name (a delete we missed) is dropped for the new one."""
        name = definition.name
        while (pending := self._attaching.get(name)) is not None:
            await pending.wait()
        runtime = self.queues.get(name)
        if runtime is not None and runtime.queue_id == definition.queue_id:
            return runtime
        self._attaching[name] = attached = anyio.Event()
        try:
            if runtime is not None:
                await self.forget(Deletions(queues=(runtime.definition,)))
            runtime = await self._attach_queue(definition, broker_may_be_down=adopting)
            self.router.add_queue(name)
        finally:
            del self._attaching[name]
            attached.set()
        return runtime

    async def rebuild_router(self) -> None:
        exchanges = await self.meta.list_exchanges(self.name)
        queues = await self.meta.list_queues(self.name)
        bindings = await self.meta.list_bindings(self.name)
        self.router = Router.from_definitions(
            self.name, exchanges, [q.name for q in queues], bindings
        )

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
