# The compiled twin of gateway/queues/plain_turn.py: a plain queue's turn with one consumer in
# one call, the same deliveries, results and queue state as QueueRuntime.pump. The consumer
# and the sink are asked through their Protocol methods (has_credit, room, byte_room,
# deliver_run), as the general path asks them; what the loop does inline is the queue's own
# part: the head taken from the buffer and booked in flight, the counts. A head the general
# take treats otherwise (requeued, with an expiration, a transient from before a restart, not
# a StoredMessage) is taken by queue.take; a queue outside the case goes to queue.pump.
from cpython.list cimport PyList_Append
from cpython.set cimport PySet_Add
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

# Imported at first use: gateway/queues/scheduler.py imports this module (through
# storage/twins.py) while gateway.queues is being imported.
cdef object QueueRuntime = None
cdef object StoredMessage = None
cdef object NO_MESSAGES = None
cdef object QUOTA_USED = None
cdef Py_ssize_t OVERHEAD = 0
cdef long long EXPIRES = 0
cdef long long REDELIVERED = 0


cdef void _import() except *:
    global QueueRuntime, StoredMessage, NO_MESSAGES, QUOTA_USED, OVERHEAD, EXPIRES, REDELIVERED
    from gateway.queues import consumer, runtime
    from storage import record

    QueueRuntime = runtime.QueueRuntime
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
        or queue.plain is not True
        or queue.leases is not None
        or queue.paused
        or queue.rate_limit is not None
        or queue.byte_limit is not None
        or type(quota) is not int
    ):
        return queue.pump(quota, now)
    consumers = queue.consumers
    if type(consumers) is not list or len(consumers) != 1:
        return queue.pump(quota, now)
    return _turn(queue, consumers[0], quota)


cdef object _turn(object queue, object consumer, long long quota):
    """QueueRuntime._pump for one consumer, no byte limit (its runs)."""
    cdef long long delivered = 0
    cdef list run
    sink = consumer.sink
    choice = queue.choice
    while delivered < quota:
        if not (queue.requeued or queue.buffer):  # has_buffered
            return NO_MESSAGES
        if not consumer.has_credit():  # ConsumerChoice.next_consumer, one consumer
            return queue._no_consumer_ready()
        choice._rr = 1
        run = _take_run(queue, consumer.room(quota - delivered), sink.byte_room())
        if not run:
            return NO_MESSAGES
        sink.deliver_run(consumer, queue, run)
        delivered += len(run)
        queue.delivered += len(run)
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
    buffer = queue.buffer
    requeued = queue.requeued
    restart_below = queue.restart_below
    inflight = queue.inflight
    delivered_below = queue.delivered_below
    maybe_delivered = queue.maybe_delivered
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
                queue.ready_count -= booked
                queue.ready_bytes -= booked_bytes
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
        queue.ready_count -= booked
        queue.ready_bytes -= booked_bytes
    return run


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
