# The compiled twin of gateway/sessions/publish_lane.py: the same publishes routed, the same
# records, counts and confirms, the same index returned. The flags, delivery mode and routing
# key are read through the C API; channels and queues stay Python objects (their fields are
# read and written as the pure twin does; a Publish's and a QueueRuntime's at their slots'
# offsets, slot_access.pxi). Input outside the common domain (containers of other types, a
# publish not a Publish, property bytes that are not bytes, names that are not str) goes to
# the pure twin from that publish on.
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_Append
from cpython.object cimport PyObject
from cpython.set cimport PySet_Add
from cpython.unicode cimport PyUnicode_AsUTF8String, PyUnicode_GET_LENGTH, PyUnicode_Tailmatch

include "slot_access.pxi"

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX

cdef object _new_tuple = tuple.__new__
# The pure twin and Record, imported at first use: gateway/sessions/batch_publish.py imports
# this module through storage/twins.py while gateway.sessions is still being imported.
cdef object _pure = None
cdef object Record = None
cdef object Publish = None
cdef object QueueRuntime = None
# Publish's and QueueRuntime's fields read here, as offsets (slot_access.pxi): a publish of
# another class goes to the pure twin, a queue of another class is read by name.
cdef Py_ssize_t P_CHANNEL, P_EXCHANGE, P_KEY, P_IMMEDIATE, P_PROPERTIES, P_BODY
cdef Py_ssize_t Q_REJECTS, Q_PARTITIONS, Q_PLAIN, Q_READY_COUNT, Q_READY_BYTES, Q_ENQUEUED
cdef Py_ssize_t Q_QUEUE_ID
cdef str REPLY_PREFIX = "amq.rabbitmq.reply-to."
cdef bytes NO_EXCHANGE = b""


cdef void _import_pure() except *:
    global _pure, Record, Publish, QueueRuntime
    global P_CHANNEL, P_EXCHANGE, P_KEY, P_IMMEDIATE, P_PROPERTIES, P_BODY
    global Q_REJECTS, Q_PARTITIONS, Q_PLAIN, Q_READY_COUNT, Q_READY_BYTES, Q_ENQUEUED, Q_QUEUE_ID
    from gateway.amqp.events import Publish as publish
    from gateway.queues.runtime import QueueRuntime as queue
    from gateway.sessions import publish_lane
    from storage.record import Record as record

    P_CHANNEL, P_EXCHANGE = slot_offset(publish, "channel"), slot_offset(publish, "exchange")
    P_KEY, P_IMMEDIATE = slot_offset(publish, "routing_key"), slot_offset(publish, "immediate")
    P_PROPERTIES = slot_offset(publish, "properties_bytes")
    P_BODY = slot_offset(publish, "body")
    Q_REJECTS = slot_offset(queue, "rejects_publish")
    Q_PARTITIONS, Q_PLAIN = slot_offset(queue, "partitions"), slot_offset(queue, "plain")
    Q_ENQUEUED, Q_READY_COUNT = slot_offset(queue, "enqueued"), slot_offset(queue, "ready_count")
    Q_READY_BYTES = slot_offset(queue, "ready_bytes")
    Q_QUEUE_ID = slot_offset(queue, "queue_id")
    _pure = publish_lane
    Record = record
    Publish = publish
    QueueRuntime = queue


cdef inline object _field(object queue, Py_ssize_t offset, str name):
    """A queue's field: at its slot for a QueueRuntime, by name for a subclass's instance
    (which may answer with a property of its own)."""
    return get_slot(queue, offset) if type(queue) is QueueRuntime else getattr(queue, name)


cdef inline void _add(object queue, Py_ssize_t offset, str name, object amount) except *:
    """A queue's counter raised by ``amount`` (as _field reads it)."""
    if type(queue) is QueueRuntime:
        add_to_slot(queue, offset, amount)
    else:
        setattr(queue, name, getattr(queue, name) + amount)


cdef enum:
    CONTENT_TYPE = 0x8000
    CONTENT_ENCODING = 0x4000
    HEADERS = 0x2000
    DELIVERY_MODE = 0x1000
    REPLY_TO = 0x0200
    EXPIRATION = 0x0100
    USER_ID = 0x0010
    GENERAL = HEADERS | REPLY_TO | EXPIRATION | USER_ID
    PERSISTENT = 1  # storage.record.PERSISTENT


def route_run(batch, Py_ssize_t start, channels, queues, now_ms, records, woken, confirms,
              confirm_records):
    """See gateway.sessions.publish_lane.route_run."""
    if _pure is None:
        _import_pure()
    if not (type(batch) is list and type(channels) is dict and type(queues) is dict
            and type(records) is list and type(woken) is set and type(confirms) is list
            and type(confirm_records) is list):
        return _pure.route_run(batch, start, channels, queues, now_ms, records, woken,
                               confirms, confirm_records)
    cdef Py_ssize_t index = start, end = len(<list>batch), size, at
    cdef const unsigned char* data
    cdef unsigned int flags
    cdef int delivery_mode
    cdef PyObject* found
    while index < end:
        publish = (<list>batch)[index]
        if type(publish) is not Publish:
            return _pure.route_run(batch, index, channels, queues, now_ms, records, woken,
                                   confirms, confirm_records)
        properties = get_slot(publish, P_PROPERTIES)
        key = get_slot(publish, P_KEY)
        exchange = get_slot(publish, P_EXCHANGE)
        if type(properties) is not bytes or type(key) is not str or type(exchange) is not str:
            return _pure.route_run(batch, index, channels, queues, now_ms, records, woken,
                                   confirms, confirm_records)
        found = PyDict_GetItem(<dict>channels, get_slot(publish, P_CHANNEL))
        if found is NULL:
            return index
        channel = <object>found
        if channel.closing or channel.tx_mode:
            return index
        if PyUnicode_GET_LENGTH(exchange) or get_slot(publish, P_IMMEDIATE):
            return index
        size = PyBytes_GET_SIZE(properties)
        data = <const unsigned char*>PyBytes_AS_STRING(properties)
        flags = (data[0] << 8 | data[1]) if size >= 2 else 0
        if flags & GENERAL:
            return index
        delivery_mode = 0
        if flags & DELIVERY_MODE:
            at = 2
            if flags & CONTENT_TYPE:
                if at >= size:
                    return index
                at += 1 + data[at]
            if flags & CONTENT_ENCODING:
                if at >= size:
                    return index
                at += 1 + data[at]
            if at >= size:
                return index
            delivery_mode = data[at]
            if delivery_mode != 1 and delivery_mode != 2:
                return index  # the general path's 406
        if PyUnicode_Tailmatch(key, REPLY_PREFIX, 0, PY_SSIZE_T_MAX, -1):
            return index
        found = PyDict_GetItem(<dict>queues, key)
        if found is NULL:
            return index
        queue = <object>found
        if _field(queue, Q_REJECTS, "rejects_publish"):
            return index
        if _field(queue, Q_PARTITIONS, "partitions") != 1:
            return index
        body = get_slot(publish, P_BODY)
        confirm_mode = channel.confirm_mode
        if (_field(queue, Q_PLAIN, "plain") and delivery_mode != 2 and not confirm_mode
                and queue.deliver_now("", key, properties, body, now_ms)):
            index += 1  # handed to a no-ack consumer at once: nothing to store
            continue
        # queue.count_in, without its call (no expiration here)
        _add(queue, Q_READY_COUNT, "ready_count", 1)
        _add(queue, Q_READY_BYTES, "ready_bytes", len(body))
        _add(queue, Q_ENQUEUED, "enqueued", 1)
        fields = (
            NO_EXCHANGE,
            PyUnicode_AsUTF8String(key),
            properties,
            body,
            ((_field(queue, Q_QUEUE_ID, "queue_id"), 0),),
            now_ms,
            PERSISTENT if delivery_mode == 2 else 0,
        )
        PyList_Append(records, _new_tuple(Record, fields))
        PySet_Add(woken, queue)
        if confirm_mode:
            tag = channel.next_publish_tag
            PyList_Append(confirms, (channel, tag, True))
            PyList_Append(confirm_records, len(<list>records) - 1)
            channel.next_publish_tag = tag + 1
        index += 1
    return index
