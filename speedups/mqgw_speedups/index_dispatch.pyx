# The compiled twin of storage/log/index_dispatch.py: the same undo entries, starts and consume
# queue states. For a ConsumeQueue (exactly that class) appended with ``defer`` whose
# in-memory tail has room, it does what ConsumeQueue.append does then (the entries added to
# the tail, its end and last commit offset moved); any other append is the method's. Runs of
# other shapes (entries not a bytearray or bytes, containers of other types) go to the pure
# twin.
from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.bytes cimport PyBytes_AS_STRING
from cpython.dict cimport PyDict_GetItem, PyDict_SetDefault
from cpython.list cimport PyList_Append
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport uint8_t

include "little_endian.pxi"

# The pure twin and ConsumeQueue, imported at first use (storage/log/appending.py imports
# this module through storage/twins.py while storage.log is being imported).
cdef object _pure = None
cdef object ConsumeQueue = None
cdef object _consume_queue = None  # its WRITE_BEHIND_BYTES is read per call, as append does
cdef Py_ssize_t ENTRY_SIZE = 0


cdef void _import() except *:
    global _pure, ConsumeQueue, ENTRY_SIZE, _consume_queue
    from storage.log import consume_queue, index_dispatch
    from storage.record import CQ_ENTRY_SIZE

    ConsumeQueue = consume_queue.ConsumeQueue
    _consume_queue = consume_queue
    ENTRY_SIZE = CQ_ENTRY_SIZE
    _pure = index_dispatch


cdef bint _common(object runs) except -1:
    for run in runs:
        if not isinstance(run, tuple) or PyTuple_GET_SIZE(run) < 2:
            return False
        entries = <object>PyTuple_GET_ITEM(run, 1)
        if not (type(entries) is bytearray or type(entries) is bytes):
            return False
        if len(entries) < ENTRY_SIZE or type(<object>PyTuple_GET_ITEM(run, 0)) is not tuple:
            return False
    return True


cdef object _last_commit(object entries):
    """The commit offset of the run's last entry (little-endian u64 at its start)."""
    cdef const uint8_t* data
    if type(entries) is bytearray:
        data = <const uint8_t*>PyByteArray_AS_STRING(entries)
    else:
        data = <const uint8_t*>PyBytes_AS_STRING(entries)
    return _u64(data + len(entries) - ENTRY_SIZE)


def dispatch(cqs, runs, undo, starts, defer):
    """See storage.log.index_dispatch.dispatch."""
    if _pure is None:
        _import()
    if not (type(cqs) is dict and type(runs) is list and type(undo) is list
            and type(starts) is dict and _common(runs)):
        return _pure.dispatch(cqs, runs, undo, starts, defer)
    cdef PyObject* found
    cdef Py_ssize_t n
    cdef bint deferred = bool(defer)
    cdef Py_ssize_t write_behind = _consume_queue.WRITE_BEHIND_BYTES
    for run in <list>runs:
        destinations = <object>PyTuple_GET_ITEM(run, 0)
        entries = <object>PyTuple_GET_ITEM(run, 1)
        n = len(entries)
        last_commit = _last_commit(entries)
        for destination in <tuple>destinations:
            found = PyDict_GetItem(<dict>cqs, destination)
            if found is NULL:
                continue  # queue deleted between routing and append: nothing to index
            cq = <object>found
            max_offset = cq.max_offset
            PyList_Append(undo, (cq, max_offset, cq.last_commit_offset))
            PyDict_SetDefault(<dict>starts, destination, max_offset)
            if deferred and type(cq) is ConsumeQueue:
                unwritten = cq.unwritten
                if type(unwritten) is bytearray and len(unwritten) + n < write_behind:
                    unwritten += entries  # the tail itself, grown in place
                    cq.max_offset = max_offset + n // ENTRY_SIZE
                    cq.last_commit_offset = last_commit
                    continue
            cq.append(entries, last_commit, defer)
