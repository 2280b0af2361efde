"""What a queue is built from: its runtime, by store layout — FIFO, priority (``x-max-priority``,
gateway/queues/priority.py) or a stream (``x-queue-type: stream``, gateway/features/stream.py)
— and its consumer choice: round-robin by consumer priority, or a single active consumer
(``x-single-active-consumer``, gateway/queues/single_active.py). Priority with a single
active consumer is the priority runtime given the single-active choice.

Chosen once, when the queue is attached: a plain queue's per-message path carries no feature
checks, and the features cost only the queues that ask for them.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.features.stream import STREAM, StreamQueue
from gateway.queues.behaviour import QueueBehaviour
from gateway.queues.clock import SYSTEM_CLOCK, Clock
from gateway.queues.consumer_choice import ConsumerChoice
from gateway.queues.dead_letter import DeadLetter
from gateway.queues.gray_lanes import GrayLanesRuntime
from gateway.queues.ordered import OrderedRuntime
from gateway.queues.priority import PriorityQueueRuntime
from gateway.queues.priority_index import max_priority_of
from gateway.queues.runtime import QueueRuntime
from gateway.queues.single_active import SINGLE_ACTIVE_ARG, SingleActiveChoice
from meta.checks import DEFAULT_QUEUE_TYPE, queue_type_of
from meta.models import QueueDef
from meta.queue_route import QueueRoute
from storage import StorePort


def runtime_class(definition: QueueDef) -> type[QueueRuntime]:
    """The runtime for the queue's store layout."""
    if queue_type_of(definition) == STREAM:
        return StreamQueue
    # Priorities are a classic-queue feature (quorum and stream queues refuse the argument).
    classic = queue_type_of(definition) == DEFAULT_QUEUE_TYPE
    if classic and max_priority_of(definition.arguments) is not None:
        return PriorityQueueRuntime
    if (
        classic
        and definition.partitions > 1
        and definition.arguments.get(SINGLE_ACTIVE_ARG) is not True
        and definition.arguments.get("x-consume-mode") != "broadcast"
    ):
        # May get gray partitions (a policy can add them later); none costs nothing there.
        return GrayLanesRuntime
    return QueueRuntime


def consumer_choice(definition: QueueDef) -> ConsumerChoice:
    """Who gets the queue's messages (a stream's consumers each read their own position)."""
    single = definition.arguments.get(SINGLE_ACTIVE_ARG) is True
    if single and queue_type_of(definition) != STREAM:
        return SingleActiveChoice()
    return ConsumerChoice()


def new_queue_runtime(
    definition: QueueDef,
    store: StorePort,
    behaviour: QueueBehaviour | None = None,
    outbox: Callable[[DeadLetter], None] | None = None,
    wake: Callable[[QueueRuntime], None] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    route: QueueRoute | None = None,
) -> QueueRuntime:
    """``route``: a keyed-order queue's (gateway/queues/ordered.py), or a plain queue's that
    was scaled (meta/channel_route.py), which it runs on."""
    choice = consumer_choice(definition)
    if route is not None and route.by == "key":
        return OrderedRuntime(definition, store, behaviour, outbox, wake, choice, clock, route)
    runtime = runtime_class(definition)(definition, store, behaviour, outbox, wake, choice, clock)
    if route is not None and scale_refusal(runtime) is None:
        runtime.set_route(route)
    return runtime


def scale_refusal(queue: QueueRuntime) -> str | None:
    """Why a plain queue cannot change its partitions (``mqgw queue scale``), or None. A
    keyed-order queue rescales by its own steps (gateway/vhost/rescale.py)."""
    if queue.keyed:
        return None
    if type(queue) not in (QueueRuntime, GrayLanesRuntime):
        kind = "stream" if isinstance(queue, StreamQueue) else "priority"
        return f"a {kind} queue keeps its partitions"
    if queue.definition.arguments.get("x-consume-mode") == "broadcast":
        return "a broadcast queue keeps its partitions (each consumer reads them all)"
    if queue.gray_parts:
        return "a queue with gray partitions keeps its partitions (end its gray release first)"
    return None
