# The compiled twin of storage/record_encode.py: same chunk bytes, same runs, same offsets.
# A first pass sizes the records that fit; the chunk is then one allocation, each record's
# header written in place, its parts copied in with memcpy and checksummed with zlib's crc32
# (the function Python's zlib.crc32 calls). Input outside the common domain (records not a list
# of 7-tuples of bytes, a number beyond its field, a record too large) goes to the pure twin,
# so the two agree on everything, errors included.
from cpython.bytearray cimport (
    PyByteArray_AS_STRING,
    PyByteArray_FromStringAndSize,
    PyByteArray_GET_SIZE,
    PyByteArray_Resize,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from cpython.list cimport PyList_Append
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcpy


cdef extern from "zlib.h":
    unsigned long crc32(unsigned long crc, const unsigned char* buf, unsigned int size) nogil


# The pure twin and the result types, imported at first use: storage/record_encode.py is
# imported by storage/log/commit_log.py, which imports this module (through storage/twins.py).
cdef object _pure = None
cdef object DispatchRun = None
cdef object EncodedChunk = None
cdef object DestinationCache = None


cdef void _import_pure() except *:
    global _pure, DispatchRun, EncodedChunk, DestinationCache
    from storage import record, record_encode

    _pure = record_encode
    DispatchRun = record.DispatchRun
    EncodedChunk = record.EncodedChunk
    DestinationCache = record_encode.DestinationCache


cdef enum:
    HEADER_SIZE = 52
    DEST_SIZE = 8
    BLANK_SIZE = 28
    CQ_ENTRY_SIZE = 20
    CLOSES = 8
    U8_MAX = 0xFF
    U16_MAX = 0xFFFF

cdef uint64_t U32_MAX = 0xFFFFFFFF
cdef uint64_t MESSAGE_MAGIC = 0x4D514731


cdef inline void put_le(uint8_t* at, uint64_t value, int size) noexcept nogil:
    cdef int i
    for i in range(size):
        at[i] = <uint8_t>(value >> (8 * i))


cdef inline const char* data_of(object part, Py_ssize_t* size):
    """The bytes of a bytes or bytearray part (the only types the first pass lets through)."""
    if type(part) is bytes:
        size[0] = PyBytes_GET_SIZE(part)
        return PyBytes_AS_STRING(part)
    size[0] = PyByteArray_GET_SIZE(part)
    return PyByteArray_AS_STRING(part)


cdef inline uint8_t* put_part(uint8_t* at, object part) noexcept:
    cdef Py_ssize_t size
    cdef const char* data = data_of(part, &size)
    memcpy(at, data, size)
    return at + size


def encode_chunk(
    records,
    first,
    start_offset,
    space_bytes,
    store_ts_ms,
    max_record_bytes,
    dest_cache,
    runs,
    offsets=None,
):
    """See storage.record_encode.encode_chunk."""
    if _pure is None:
        _import_pure()
    args = (records, first, start_offset, space_bytes, store_ts_ms, max_record_bytes)
    args += (dest_cache, runs, offsets)
    if (
        type(records) is not list
        or type(runs) is not list
        or not (offsets is None or type(offsets) is list)
        or not all(type(n) is int for n in args[1:6])
        or not (0 <= first <= len(records))
        or not (0 <= start_offset < 1 << 63 and 0 <= store_ts_ms < 1 << 64)
        or not (-(1 << 62) < space_bytes < 1 << 62 and -(1 << 62) < max_record_bytes < 1 << 62)
        or (runs and type(runs[len(runs) - 1].entries) is not bytearray)
    ):
        return _pure.encode_chunk(*args)
    cdef list items = records
    cdef Py_ssize_t count = len(items)
    cdef Py_ssize_t start = first
    cdef long long limit = space_bytes - BLANK_SIZE
    cdef long long most = max_record_bytes
    cdef long long total = 0
    cdef long long size
    cdef Py_ssize_t index = start
    cdef Py_ssize_t fit = count - start
    cdef uint64_t born, flags, timestamp = store_ts_ms, offset = start_offset
    cdef object entry, exchange, routing_key, properties, body, dests, born_ts, record_flags
    cdef tuple record
    # First pass: the records' sizes, and how many fit; anything unusual goes to the pure twin.
    while index < count:
        entry = items[index]
        if not isinstance(entry, tuple) or len(entry) != 7:  # a Record, or a plain tuple
            return _pure.encode_chunk(*args)
        record = <tuple>entry
        exchange, routing_key, properties = record[0], record[1], record[2]
        body, dests, born_ts, record_flags = record[3], record[4], record[5], record[6]
        if (
            type(exchange) is not bytes
            or type(routing_key) is not bytes
            or type(properties) is not bytes
            or (type(body) is not bytes and type(body) is not bytearray)
            or type(dests) is not tuple
            or len(exchange) > U8_MAX
            or len(routing_key) > U8_MAX
            or len(dests) > U16_MAX
            or type(born_ts) is not int
            or type(record_flags) is not int
        ):
            return _pure.encode_chunk(*args)
        try:  # a negative or too large number raises here, before anything is written
            born = born_ts
            flags = record_flags
        except OverflowError:
            return _pure.encode_chunk(*args)
        if flags > U32_MAX:
            return _pure.encode_chunk(*args)
        size = (
            HEADER_SIZE + DEST_SIZE * len(dests) + len(exchange) + len(routing_key)
            + len(properties) + len(body)
        )
        if size > most or size > U32_MAX:
            return _pure.encode_chunk(*args)  # it raises RecordTooLarge (or struct.error)
        if total + size > limit:
            fit = index - start
            break
        total += size
        index += 1
    buf = PyByteArray_FromStringAndSize(NULL, total)
    cdef uint8_t* base = <uint8_t*>PyByteArray_AS_STRING(buf)
    cdef uint8_t* at = base
    cdef uint8_t* head
    cdef Py_ssize_t entries_size
    cdef object prev_dests = None
    cdef object dest_bytes = b""
    cdef object run = runs[len(runs) - 1] if runs else None
    cdef object run_dests = run.destinations if run is not None else None
    cdef bint run_closes = run.closes if run is not None else False
    cdef object run_entries = run.entries if run is not None else None
    cdef bint closes
    cdef PyObject* cached
    # The cache's own dict, read here (a cache that is not ours is asked through get): with
    # a destination per record (a thousand queues in turn) a call per record saved.
    cdef object packed = None
    if type(dest_cache) is DestinationCache and type(dest_cache._packed) is dict:
        packed = dest_cache._packed
    for index in range(start, start + fit):
        record = <tuple>items[index]
        exchange, routing_key, properties = record[0], record[1], record[2]
        body, dests, born_ts, record_flags = record[3], record[4], record[5], record[6]
        if dests is not prev_dests:  # batches usually repeat one destination list
            cached = PyDict_GetItem(packed, dests) if packed is not None else NULL
            dest_bytes = <object>cached if cached is not NULL else dest_cache.get(dests)
            prev_dests = dests
            if type(dest_bytes) is not bytes or len(dest_bytes) != DEST_SIZE * len(dests):
                raise ValueError("the destination cache gave bytes of the wrong size")
        born = born_ts
        flags = record_flags
        head = at
        size = (
            HEADER_SIZE + len(dest_bytes) + len(exchange) + len(routing_key)
            + len(properties) + len(body)
        )
        put_le(head, size, 4)
        put_le(head + 4, MESSAGE_MAGIC, 4)
        put_le(head + 12, offset, 8)
        put_le(head + 20, born, 8)
        put_le(head + 28, timestamp, 8)
        put_le(head + 36, flags, 4)
        put_le(head + 40, len(dests), 2)
        put_le(head + 42, len(exchange), 1)
        put_le(head + 43, len(routing_key), 1)
        put_le(head + 44, len(properties), 4)
        put_le(head + 48, len(body), 4)
        at = put_part(head + HEADER_SIZE, dest_bytes)
        at = put_part(at, exchange)
        at = put_part(at, routing_key)
        at = put_part(at, properties)
        at = put_part(at, body)
        with nogil:
            put_le(head + 8, crc32(0, head + 12, <unsigned int>(size - 12)), 4)
        if len(dests):
            closes = (flags & CLOSES) != 0
            if (
                run is None
                or (run_dests is not dests and run_dests != dests)
                or (closes and not run_closes)
            ):
                run_entries = bytearray()
                run = DispatchRun(dests, run_entries, closes)
                runs.append(run)
                run_dests, run_closes = dests, closes
            entries_size = PyByteArray_GET_SIZE(run_entries)
            PyByteArray_Resize(run_entries, entries_size + CQ_ENTRY_SIZE)
            head = <uint8_t*>PyByteArray_AS_STRING(run_entries) + entries_size
            put_le(head, offset, 8)
            put_le(head + 8, size, 4)
            put_le(head + 12, timestamp, 8)
        if offsets is not None:
            PyList_Append(offsets, offset)
        offset += size
    return EncodedChunk(start_offset, buf, fit)
