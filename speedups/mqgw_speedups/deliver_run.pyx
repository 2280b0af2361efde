# The compiled twin of gateway/sessions/deliver_run.py: the same tags, unacked deliveries,
# frames, counts and session state. It takes a run of StoredMessages to a Consumer of a Session
# without a tap or rate limits (what a plain queue's turn hands it); anything else goes to the
# pure twin. What it saves is the Python frame per run and the dataclass __init__ per delivery:
# each Delivery is made with object.__new__ and its slots filled at their offsets
# (slot_access.pxi), as are the consumer's fields. The session, its channel and its connection
# keep their fields in dicts and are read by name.
from cpython.list cimport PyList_Append
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

include "slot_access.pxi"

cdef object _object_new = object.__new__
# The pure twin and the classes it checks, imported at first use: gateway/sessions/session.py
# imports this module (through storage/twins.py) while gateway.sessions is being imported.
cdef object _pure = None
cdef object Session = None
cdef object Consumer = None
cdef object Delivery = None
cdef object StoredMessage = None
cdef object _one_write = None
cdef object _frames = None
cdef long long OVERHEAD = 0
cdef long long HIGH_WATER = 0
cdef Py_ssize_t C_CHANNEL, C_TAG, C_NO_ACK, C_UNACKED
cdef Py_ssize_t D_QUEUE, D_PARTITION, D_MESSAGE, D_CONSUMER, D_AT


cdef void _import() except *:
    global _pure, Session, Consumer, Delivery, StoredMessage, _one_write, _frames
    global OVERHEAD, HIGH_WATER, C_CHANNEL, C_TAG, C_NO_ACK, C_UNACKED
    global D_QUEUE, D_PARTITION, D_MESSAGE, D_CONSUMER, D_AT
    from gateway.amqp import frame_writer
    from gateway.sessions import channel_state, deliver_run, session
    from storage.record import StoredMessage as stored

    consumer, delivery = channel_state.Consumer, channel_state.Delivery
    C_CHANNEL, C_TAG = slot_offset(consumer, "channel"), slot_offset(consumer, "tag")
    C_NO_ACK, C_UNACKED = slot_offset(consumer, "no_ack"), slot_offset(consumer, "unacked")
    D_QUEUE, D_PARTITION = slot_offset(delivery, "queue"), slot_offset(delivery, "partition")
    D_MESSAGE, D_CONSUMER = slot_offset(delivery, "message"), slot_offset(delivery, "consumer")
    D_AT = slot_offset(delivery, "at")
    OVERHEAD = deliver_run.DELIVERY_OVERHEAD_BYTES
    HIGH_WATER = deliver_run.HIGH_WATER_BYTES
    _one_write = frame_writer.deliver_one_write
    _frames = frame_writer.deliver
    StoredMessage = stored
    Consumer, Delivery, Session = consumer, delivery, session.Session
    _pure = deliver_run


cdef bint _common(object session, object consumer, object run) except -1:
    """Whether the run is one this twin delivers: else the pure twin does."""
    if type(session) is not Session or type(consumer) is not Consumer or type(run) is not list:
        return False
    if session.tap is not None or session.limits is not None:
        return False
    for taken in <list>run:
        if type(taken) is not tuple or PyTuple_GET_SIZE(taken) != 3:
            return False
        if type(<object>PyTuple_GET_ITEM(taken, 1)) is not StoredMessage:
            return False
    return True


def deliver_run(session, consumer, queue, run):
    """See gateway.sessions.deliver_run.deliver_run."""
    if _pure is None:
        _import()
    if not _common(session, consumer, run):
        return _pure.deliver_run(session, consumer, queue, run)
    cdef long long pending = session.pending_bytes
    cdef Py_ssize_t redeliveries = 0, n = len(<list>run)
    cdef list frames = []
    channel = get_slot(consumer, C_CHANNEL)
    number = channel.number
    consumer_tag = get_slot(consumer, C_TAG)
    no_ack = get_slot(consumer, C_NO_ACK)
    at = session.now()  # one moment for the run (the consumer timeout reads it)
    frame_max = session.conn.frame_max
    unacked = channel.unacked
    for taken in <list>run:
        partition = <object>PyTuple_GET_ITEM(taken, 0)
        message = <object>PyTuple_GET_ITEM(taken, 1)
        redelivered = <object>PyTuple_GET_ITEM(taken, 2)
        tag = channel.next_delivery_tag  # ChannelState.record_delivery, inline
        channel.next_delivery_tag = tag + 1
        if no_ack:
            queue.settle(partition, message)
        else:
            delivery = _object_new(Delivery)
            set_slot(delivery, D_QUEUE, queue)
            set_slot(delivery, D_PARTITION, partition)
            set_slot(delivery, D_MESSAGE, message)
            set_slot(delivery, D_CONSUMER, consumer)
            set_slot(delivery, D_AT, at)
            unacked[tag] = delivery
            add_to_slot(consumer, C_UNACKED, 1)
        if redelivered:
            redeliveries += 1
        exchange = <object>PyTuple_GET_ITEM(message, 2)
        key = <object>PyTuple_GET_ITEM(message, 3)
        properties = <object>PyTuple_GET_ITEM(message, 4)
        body = <object>PyTuple_GET_ITEM(message, 5)
        frame = _one_write(
            number, consumer_tag, tag, redelivered, exchange, key, properties, body, frame_max
        )
        if frame is not None:
            PyList_Append(frames, frame)
        else:
            frames += _frames(
                number, consumer_tag, tag, redelivered, exchange, key, properties, body,
                frame_max,
            )
        pending += len(body) + OVERHEAD
    session.conn.send_frames(number, frames)  # dropped, as each would be, if channel closed
    counts = session.node.stats
    if no_ack:
        counts.deliver_no_ack += n
    else:
        counts.deliver += n
    counts.redeliver += redeliveries
    session.pending_bytes = pending
    if pending + session.sending_bytes > HIGH_WATER:
        session.writable = False
    if not session.dirty_marked:
        session.mark_dirty()


def byte_room(session):
    """See gateway.sessions.deliver_run.byte_room."""
    if _pure is None:
        _import()
    return HIGH_WATER - session.pending_bytes - session.sending_bytes
