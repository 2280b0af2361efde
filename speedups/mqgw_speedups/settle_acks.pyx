# The compiled twin of gateway/sessions/settle_acks.py: the same queue states, consumer counts
# and queues returned. A Delivery's fields and a Consumer's count are read at their slots'
# offsets (slot_access.pxi). A plain QueueRuntime (exactly that class, whose settle is
# Settlement.settle and may_deliver HeldMessages.may_deliver) is answered from its slots as
# those two would; any other queue, delivery or consumer is asked through its methods and
# fields by name, as the pure twin does.
from cpython.set cimport PySet_Add, PySet_Discard
from cpython.tuple cimport PyTuple_GET_ITEM

include "slot_access.pxi"

# The classes read here, imported at first use: gateway/sessions/session.py imports this
# module (through storage/twins.py) while gateway.sessions is being imported.
cdef object QueueRuntime = None
cdef object Delivery = None
cdef object Consumer = None
cdef object StoredMessage = None
cdef Py_ssize_t D_QUEUE, D_PARTITION, D_MESSAGE, D_CONSUMER, C_UNACKED
cdef Py_ssize_t Q_INFLIGHT, Q_RETURNS, Q_COMMIT_DIRTY, Q_ACKED, Q_REQUEUED, Q_BUFFER, Q_EXHAUSTED


cdef void _import() except *:
    global QueueRuntime, Delivery, Consumer, StoredMessage
    global D_QUEUE, D_PARTITION, D_MESSAGE, D_CONSUMER, C_UNACKED
    global Q_INFLIGHT, Q_RETURNS, Q_COMMIT_DIRTY, Q_ACKED, Q_REQUEUED, Q_BUFFER, Q_EXHAUSTED
    from gateway.queues.runtime import QueueRuntime as queue
    from gateway.sessions import channel_state
    from storage.record import StoredMessage as stored

    delivery = channel_state.Delivery
    D_QUEUE, D_PARTITION = slot_offset(delivery, "queue"), slot_offset(delivery, "partition")
    D_MESSAGE, D_CONSUMER = slot_offset(delivery, "message"), slot_offset(delivery, "consumer")
    C_UNACKED = slot_offset(channel_state.Consumer, "unacked")
    Q_INFLIGHT, Q_RETURNS = slot_offset(queue, "inflight"), slot_offset(queue, "returns")
    Q_COMMIT_DIRTY, Q_ACKED = slot_offset(queue, "commit_dirty"), slot_offset(queue, "acked")
    Q_REQUEUED, Q_BUFFER = slot_offset(queue, "requeued"), slot_offset(queue, "buffer")
    Q_EXHAUSTED = slot_offset(queue, "exhausted")
    Delivery, Consumer, StoredMessage = delivery, channel_state.Consumer, stored
    QueueRuntime = queue


def settle(deliveries):
    """See gateway.sessions.settle_acks.settle."""
    if QueueRuntime is None:
        _import()
    woken = set()
    for delivery in deliveries:
        if type(delivery) is Delivery:
            queue = get_slot(delivery, D_QUEUE)
            partition = get_slot(delivery, D_PARTITION)
            message = get_slot(delivery, D_MESSAGE)
            consumer = get_slot(delivery, D_CONSUMER)
        else:
            queue, partition = delivery.queue, delivery.partition
            message, consumer = delivery.message, delivery.consumer
        if type(queue) is QueueRuntime and type(message) is StoredMessage:
            _settle(queue, partition, <object>PyTuple_GET_ITEM(message, 0))
        else:
            queue.settle(partition, message)
        if consumer is not None:
            if type(consumer) is Consumer:
                add_to_slot(consumer, C_UNACKED, -1)
            else:
                consumer.unacked -= 1
        PySet_Add(woken, queue)
    return woken


cdef void _settle(object queue, object partition, object queue_offset) except *:
    """Settlement.settle for a plain QueueRuntime."""
    PySet_Discard(get_slot(queue, Q_INFLIGHT)[partition], queue_offset)
    returns = get_slot(queue, Q_RETURNS)
    if returns:  # only messages that came back are counted there: mostly none
        returns.pop((partition, queue_offset), None)
    set_slot(queue, Q_COMMIT_DIRTY, True)
    add_to_slot(queue, Q_ACKED, 1)


def worth_a_turn(queues):
    """See gateway.sessions.settle_acks.worth_a_turn."""
    if QueueRuntime is None:
        _import()
    worth = []
    for queue in queues:
        if type(queue) is QueueRuntime:  # HeldMessages.may_deliver
            if (get_slot(queue, Q_REQUEUED) or get_slot(queue, Q_BUFFER)
                    or not get_slot(queue, Q_EXHAUSTED)):
                worth.append(queue)
        elif queue.may_deliver:
            worth.append(queue)
    return worth
