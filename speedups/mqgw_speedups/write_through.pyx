# The compiled twin of gateway/vhost/write_through.py: same queues absorbed, same messages
# handed to each, same calls to caught_up and absorb in the same order. The loop over records
# and destinations reads the tuples and dicts through the C API; what the queues do stays
# theirs (Python). Input outside the common domain (records or offsets not tuples or lists,
# a record not a 7-tuple, destinations not a tuple of 2-tuples, starts not a dict) goes to
# the pure twin. A plain QueueRuntime of one partition on the embedded node (its fields in
# slots, read at their offsets: slot_access.pxi) is asked inline, as StoreReads.caught_up and
# absorb would answer; any other queue is asked through its methods.
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.list cimport PyList_Append
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

include "slot_access.pxi"

cdef object _new_tuple = tuple.__new__
# The pure twin and StoredMessage, imported at first use: gateway/vhost/host.py imports this
# module through storage/twins.py while gateway.vhost is still being imported.
cdef object _pure = None
cdef object StoredMessage = None
cdef object QueueRuntime = None
cdef Py_ssize_t LOW_WATER = 0
cdef Py_ssize_t FETCH_BATCH = 0
# QueueRuntime's fields read here, as offsets (slot_access.pxi), set by _import_pure.
cdef Py_ssize_t LEASES, CURSORS, EXHAUSTED, CONSUMERS, DELETED, PAUSED, BROADCAST, BUFFER
cdef Py_ssize_t QUEUE_ID, FED


cdef void _import_pure() except *:
    global _pure, StoredMessage, QueueRuntime, LOW_WATER, FETCH_BATCH
    global LEASES, CURSORS, EXHAUSTED, CONSUMERS, DELETED, PAUSED, BROADCAST, BUFFER, QUEUE_ID, FED
    from gateway.queues import runtime, store_reads
    from gateway.vhost import write_through
    from storage.record import StoredMessage as stored

    _pure = write_through
    StoredMessage = stored
    cls = runtime.QueueRuntime
    LEASES, CURSORS = slot_offset(cls, "leases"), slot_offset(cls, "cursors")
    EXHAUSTED, CONSUMERS = slot_offset(cls, "exhausted"), slot_offset(cls, "consumers")
    DELETED, PAUSED = slot_offset(cls, "deleted"), slot_offset(cls, "paused")
    BROADCAST, BUFFER = slot_offset(cls, "broadcast"), slot_offset(cls, "buffer")
    QUEUE_ID, FED = slot_offset(cls, "queue_id"), slot_offset(cls, "fed")
    QueueRuntime = cls
    LOW_WATER = store_reads.LOW_WATER
    FETCH_BATCH = store_reads.FETCH_BATCH


cdef bint _inline(object queue) except -1:
    """Whether ``queue`` is one caught_up and absorb are answered for here."""
    return (
        type(queue) is QueueRuntime
        and get_slot(queue, LEASES) is None
        and len(get_slot(queue, CURSORS)) == 1
    )


cdef bint _caught_up(object queue, dict starts) except -1:
    """StoreReads.caught_up for an ``_inline`` queue."""
    if not get_slot(queue, EXHAUSTED) or not get_slot(queue, CONSUMERS):
        return False
    if get_slot(queue, DELETED) or get_slot(queue, PAUSED) or get_slot(queue, BROADCAST):
        return False
    buffer = get_slot(queue, BUFFER)
    if buffer and len(buffer) >= LOW_WATER:
        return False
    cursor = get_slot(queue, CURSORS)[0]
    found = PyDict_GetItem(starts, (get_slot(queue, QUEUE_ID), 0))
    return (<object>found if found is not NULL else cursor) == cursor


cdef bint _absorb(object queue, list messages) except -1:
    """StoreReads.absorb for an ``_inline`` queue."""
    buffer = get_slot(queue, BUFFER)
    if len(buffer) + len(messages) > FETCH_BATCH:
        return False
    buffer.extend(messages)
    get_slot(queue, CURSORS)[0] += len(messages)
    set_slot(queue, FED, True)
    return True


cdef bint _common(records, offsets, starts):
    """Whether the batch is what the C loop reads; anything else goes to the pure twin."""
    if type(starts) is not dict:
        return False
    if not (type(records) is list or type(records) is tuple):
        return False
    if not (type(offsets) is list or type(offsets) is tuple):
        return False
    for record in records:
        if not isinstance(record, tuple) or PyTuple_GET_SIZE(record) != 7:
            return False
        destinations = <object>PyTuple_GET_ITEM(record, 4)
        if type(destinations) is not tuple:
            return False
        for destination in <tuple>destinations:
            if type(destination) is not tuple or PyTuple_GET_SIZE(destination) != 2:
                return False
    return True


def absorb(by_id, records, result):
    """See gateway.vhost.write_through.absorb."""
    if _pure is None:
        _import_pure()
    starts = result.queue_starts
    offsets = result.record_offsets
    if not starts or len(offsets) != len(records):
        return set()
    if not _common(records, offsets, starts):
        return _pure.absorb(by_id, records, result)
    cdef dict next_offset = dict(starts)
    cdef dict taken = {}  # queue id -> its messages
    cdef set refused = set()
    cdef Py_ssize_t i, d, n = len(records), m
    cdef PyObject* found
    cdef tuple record, destinations, destination
    cdef list messages
    store_ts = result.store_ts_ms
    for i in range(n):
        record = <tuple>records[i]
        commit_offset = offsets[i]
        destinations = <tuple>PyTuple_GET_ITEM(record, 4)
        m = PyTuple_GET_SIZE(destinations)
        properties_view = body_view = None  # one pair for all its queues
        for d in range(m):
            destination = <tuple>PyTuple_GET_ITEM(destinations, d)
            found = PyDict_GetItem(next_offset, destination)
            if found is NULL:
                continue
            offset = <object>found
            PyDict_SetItem(next_offset, destination, offset + 1)
            queue_id = <object>PyTuple_GET_ITEM(destination, 0)
            found = PyDict_GetItem(taken, queue_id)
            if found is NULL:
                if queue_id in refused:
                    continue
                queue = by_id.get(queue_id)
                if queue is None or not (
                    _caught_up(queue, starts) if _inline(queue) else queue.caught_up(starts)
                ):
                    refused.add(queue_id)
                    continue
                messages = []
                taken[queue_id] = messages
            else:
                messages = <list>found
            if properties_view is None:
                properties_view = memoryview(<object>PyTuple_GET_ITEM(record, 2))
                body_view = memoryview(<object>PyTuple_GET_ITEM(record, 3))
            fields = (
                offset,
                commit_offset,
                <object>PyTuple_GET_ITEM(record, 0),
                <object>PyTuple_GET_ITEM(record, 1),
                properties_view,
                body_view,
                <object>PyTuple_GET_ITEM(record, 5),
                store_ts,
                <object>PyTuple_GET_ITEM(record, 6),
            )
            PyList_Append(
                messages, (<object>PyTuple_GET_ITEM(destination, 1), _new_tuple(StoredMessage, fields))
            )
    absorbed = set()
    for queue_id, messages in taken.items():
        queue = by_id[queue_id]
        if _absorb(queue, messages) if _inline(queue) else queue.absorb(messages):
            absorbed.add(queue)
    return absorbed
