# The compiled twin of gateway/queues/plain_turn.py: a plain queue's turn with one consumer in
# one call, the same deliveries, results and queue state as QueueRuntime.pump. The consumer
# and the sink are asked through their Protocol methods (grant, which is has_credit and room
# in one call; byte_room, deliver_run); what the loop does inline is the queue's own
# part: the head taken from the buffer and booked in flight, the counts. A head the general
# take treats otherwise (requeued, with an expiration, a transient from before a restart, not
# a StoredMessage) is taken by queue.take; a queue outside the case goes to queue.pump. The
# queue's fields are read at their slots' offsets (slot_access.pxi): the type test comes first.
from cpython.list cimport PyList_Append
from cpython.set cimport PySet_Add
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

include "slot_access.pxi"

# Imported at first use: gateway/queues/scheduler.py imports this module (through
# storage/twins.py) while gateway.queues is being imported.
cdef object QueueRuntime = None
cdef object StoredMessage = None
cdef object NO_MESSAGES = None
cdef object QUOTA_USED = None
cdef Py_ssize_t OVERHEAD = 0
cdef long long EXPIRES = 0
cdef long long REDELIVERED = 0
# QueueRuntime's fields this module reads, as offsets (slot_access.pxi), set by _import.
cdef Py_ssize_t PLAIN, LEASES, PAUSED, RATE_LIMIT, BYTE_LIMIT, CONSUMERS, REQUEUED, BUFFER
cdef Py_ssize_t CHOICE, DELIVERED, RESTART_BELOW, INFLIGHT, DELIVERED_BELOW, MAYBE_DELIVERED
cdef Py_ssize_t READY_COUNT, READY_BYTES


cdef void _import() except *:
    global QueueRuntime, StoredMessage, NO_MESSAGES, QUOTA_USED, OVERHEAD, EXPIRES, REDELIVERED
    global PLAIN, LEASES, PAUSED, RATE_LIMIT, BYTE_LIMIT, CONSUMERS, REQUEUED, BUFFER
    global CHOICE, DELIVERED, RESTART_BELOW, INFLIGHT, DELIVERED_BELOW, MAYBE_DELIVERED
    global READY_COUNT, READY_BYTES
    from gateway.queues import consumer, runtime
    from storage import record

    cls = runtime.QueueRuntime
    PLAIN, LEASES = slot_offset(cls, "plain"), slot_offset(cls, "leases")
    PAUSED, RATE_LIMIT = slot_offset(cls, "paused"), slot_offset(cls, "rate_limit")
    BYTE_LIMIT, CONSUMERS = slot_offset(cls, "byte_limit"), slot_offset(cls, "consumers")
    REQUEUED, BUFFER = slot_offset(cls, "requeued"), slot_offset(cls, "buffer")
    CHOICE, DELIVERED = slot_offset(cls, "choice"), slot_offset(cls, "delivered")
    RESTART_BELOW, INFLIGHT = slot_offset(cls, "restart_below"), slot_offset(cls, "inflight")
    DELIVERED_BELOW = slot_offset(cls, "delivered_below")
    MAYBE_DELIVERED = slot_offset(cls, "maybe_delivered")
    READY_COUNT, READY_BYTES = slot_offset(cls, "ready_count"), slot_offset(cls, "ready_bytes")
    QueueRuntime = cls
    StoredMessage = record.StoredMessage
    NO_MESSAGES = runtime.PumpResult.NO_MESSAGES
    QUOTA_USED = runtime.PumpResult.QUOTA_USED
    OVERHEAD = consumer.DELIVERY_OVERHEAD_BYTES
    EXPIRES = record.EXPIRES
    REDELIVERED = record.REDELIVERED


def pump(queue, quota, now):
    """See gateway.queues.plain_turn.pump."""
    if QueueRuntime is None:
        _import()
    if (
        type(queue) is not QueueRuntime
        or get_slot(queue, PLAIN) is not True
        or get_slot(queue, LEASES) is not None
        or get_slot(queue, PAUSED)
        or get_slot(queue, RATE_LIMIT) is not None
        or get_slot(queue, BYTE_LIMIT) is not None
        or type(quota) is not int
    ):
        return queue.pump(quota, now)
    consumers = get_slot(queue, CONSUMERS)
    if type(consumers) is not list or len(consumers) != 1:
        return queue.pump(quota, now)
    return _turn(queue, consumers[0], quota)


cdef object _turn(object queue, object consumer, long long quota):
    """QueueRuntime._pump for one consumer, no byte limit (its runs)."""
    cdef long long delivered = 0
    cdef list run
    sink = consumer.sink
    choice = get_slot(queue, CHOICE)
    while delivered < quota:
        if not (get_slot(queue, REQUEUED) or get_slot(queue, BUFFER)):  # has_buffered
            return NO_MESSAGES
        # ConsumerChoice.next_consumer for one consumer, and its room: in one call
        room = consumer.grant(quota - delivered)
        if not room:
            return queue._no_consumer_ready()
        choice._rr = 1
        run = _take_run(queue, room, sink.byte_room())
        if not run:
            return NO_MESSAGES
        sink.deliver_run(consumer, queue, run)
        delivered += len(run)
        add_to_slot(queue, DELIVERED, len(run))
    return QUOTA_USED


cdef list _take_run(object queue, object room_object, object headroom_object):
    """QueueRuntime._take_run: up to ``room``, ending with the one past ``headroom``."""
    cdef list run = []
    cdef Py_ssize_t room = room_object
    cdef long long headroom = headroom_object
    cdef long long spent = 0
    cdef Py_ssize_t booked = 0  # taken inline, not yet out of the queue's counts
    cdef long long booked_bytes = 0
    cdef Py_ssize_t size
    cdef long long offset, flags
    buffer = get_slot(queue, BUFFER)
    requeued = get_slot(queue, REQUEUED)
    restart_below = get_slot(queue, RESTART_BELOW)
    inflight = get_slot(queue, INFLIGHT)
    delivered_below = get_slot(queue, DELIVERED_BELOW)
    maybe_delivered = get_slot(queue, MAYBE_DELIVERED)
    while len(run) < room:
        taken = None
        if not requeued and buffer:
            item = buffer[0]
            message = _common_head(item, restart_below)
            if message is not None:
                buffer.popleft()
                partition = <object>PyTuple_GET_ITEM(item, 0)
                offset = <object>PyTuple_GET_ITEM(message, 0)
                flags = <object>PyTuple_GET_ITEM(message, 8)
                size = len(<object>PyTuple_GET_ITEM(message, 5))
                booked += 1
                booked_bytes += size
                PySet_Add(inflight[partition], <object>PyTuple_GET_ITEM(message, 0))
                if offset >= <long long>delivered_below[partition]:
                    delivered_below[partition] = offset + 1
                redelivered = bool(flags & REDELIVERED) or offset < <long long>maybe_delivered[partition]
                taken = (partition, message, redelivered)
        if taken is None:
            if not requeued and not buffer:
                break
            if booked:  # the general take reads the counts: ours first
                _book(queue, booked, booked_bytes)
                booked = booked_bytes = 0
            taken = queue.take(None)
            if taken is None:
                break
            size = len(taken[1].body)
        PyList_Append(run, taken)
        spent += size + OVERHEAD
        if spent > headroom:
            break
    if booked:
        _book(queue, booked, booked_bytes)
    return run


cdef void _book(object queue, Py_ssize_t booked, long long booked_bytes) except *:
    """The taken messages out of the queue's ready counts."""
    add_to_slot(queue, READY_COUNT, -booked)
    add_to_slot(queue, READY_BYTES, -booked_bytes)


cdef object _common_head(object item, object restart_below):
    """The head's message if the inline take takes it as QueueRuntime.take would; else None."""
    if type(item) is not tuple or PyTuple_GET_SIZE(item) != 2:
        return None
    message = <object>PyTuple_GET_ITEM(item, 1)
    if type(message) is not StoredMessage:
        return None
    partition = <object>PyTuple_GET_ITEM(item, 0)
    offset = <object>PyTuple_GET_ITEM(message, 0)
    flags = <object>PyTuple_GET_ITEM(message, 8)
    if type(partition) is not int or type(offset) is not int or type(flags) is not int:
        return None
    if flags & EXPIRES or offset < restart_below[partition]:
        return None
    return message
