"""Which runtime a queue gets: FIFO, priority (``x-max-priority``, gateway/queues/priority.py),
single active consumer (``x-single-active-consumer``, gateway/queues/single_active.py), both, or a
stream (``x-queue-type: stream``, gateway/features/stream.py).

Chosen once, when the queue is attached, by class: a plain queue's per-message path carries
no feature checks, and the features cost only the queues that ask for them.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.features.stream import STREAM, StreamQueue
from gateway.queues.behaviour import QueueBehaviour
from gateway.queues.dead_letter import DeadLetter
from gateway.queues.priority import PriorityQueueRuntime, max_priority_of
from gateway.queues.runtime import QueueRuntime
from gateway.queues.single_active import SINGLE_ACTIVE_ARG, SingleActiveConsumer
from meta.checks import DEFAULT_QUEUE_TYPE, queue_type_of
from meta.models import QueueDef
from storage import StorePort


class PrioritySingleActive(SingleActiveConsumer, PriorityQueueRuntime):
    """Priorities choose the message, the single active consumer gets it."""


def runtime_class(definition: QueueDef) -> type[QueueRuntime]:
    arguments = definition.arguments
    if queue_type_of(definition) == STREAM:
        return StreamQueue
    # Priorities are a classic-queue feature (quorum and stream queues refuse the argument).
    classic = queue_type_of(definition) == DEFAULT_QUEUE_TYPE
    priority = classic and max_priority_of(arguments) is not None
    single = arguments.get(SINGLE_ACTIVE_ARG) is True
    if priority and single:
        return PrioritySingleActive
    if priority:
        return PriorityQueueRuntime
    return SingleActiveConsumer if single else QueueRuntime


def new_queue_runtime(
    definition: QueueDef,
    store: StorePort,
    behaviour: QueueBehaviour | None = None,
    outbox: Callable[[DeadLetter], None] | None = None,
    wake: Callable[[QueueRuntime], None] | None = None,
) -> QueueRuntime:
    return runtime_class(definition)(definition, store, behaviour, outbox, wake)
