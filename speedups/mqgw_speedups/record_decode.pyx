# The compiled twin of storage/record_decode.py: the same messages appended, the same answer.
# The header is read from the read buffer in place, exchange and routing key copied out with
# one allocation each, and the checksum taken with zlib's crc32 (the function Python's
# zlib.crc32 calls); properties and body stay memoryview slices of the buffer, as there. What
# lies outside the common domain (a buffer that is not a 1-D byte memoryview, entries that
# are not 3-tuples of ints, a header past the buffer's end, offsets beyond 62 bits) goes to
# the pure twin, from that entry on, so the two agree on everything, errors included.
# take_kept, the same way: the kept records' fields put in place, anything unusual to pure.
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.object cimport PyObject
from cpython.list cimport PyList_Append
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

include "little_endian.pxi"


cdef extern from "zlib.h":
    unsigned long crc32(unsigned long crc, const unsigned char* buf, unsigned int size) nogil


cdef object _new_tuple = tuple.__new__
# The pure twin and StoredMessage, imported at first use: storage/log/reading.py imports this
# module (through storage/twins.py) while the storage package is being imported.
cdef object _pure = None
cdef object StoredMessage = None
cdef object PAST_THE_END = None
cdef object NOT_THE_RECORD = None
cdef object CRC_MISMATCH = None


cdef void _import_pure() except *:
    global _pure, StoredMessage, PAST_THE_END, NOT_THE_RECORD, CRC_MISMATCH
    from storage import record_decode
    from storage.record import StoredMessage as stored

    _pure = record_decode
    StoredMessage = stored
    PAST_THE_END = record_decode.PAST_THE_END
    NOT_THE_RECORD = record_decode.NOT_THE_RECORD
    CRC_MISMATCH = record_decode.CRC_MISMATCH


cdef enum:
    HEADER_SIZE = 52
    DEST_SIZE = 8
    ENTRY_SIZE_MASK = 0x7FFFFFFF

cdef long long LIMIT_62 = 1LL << 62  # keeps offsets' sums within 64 bits
cdef uint32_t MESSAGE_MAGIC = 0x4D514731
cdef uint32_t COPY_MAGIC = 0x4D59504F
cdef uint32_t HOLE_MAGIC = 0x454C4F48


cdef inline long long _clip(long long at, long long limit) noexcept nogil:
    return at if at < limit else limit


cdef bint _read_entry(object item, long long* commit, long long* size):
    """A consume-queue entry's commit offset and size, if it is what the C loops read (a
    3-tuple of ints in range); False sends the caller to the pure twin from there."""
    if type(item) is not tuple or PyTuple_GET_SIZE(item) != 3:
        return False
    commit_object = <object>PyTuple_GET_ITEM(item, 0)
    size_object = <object>PyTuple_GET_ITEM(item, 1)
    if type(commit_object) is not int or type(size_object) is not int:
        return False
    try:
        commit[0] = commit_object
        size[0] = size_object
    except OverflowError:
        return False
    return -LIMIT_62 < commit[0] < LIMIT_62 and 0 <= size[0]


cdef bint _byte_view(buf):
    """A 1-D, contiguous memoryview of bytes: what the C loop indexes as Python does."""
    if type(buf) is not memoryview:
        return False
    return buf.ndim == 1 and buf.itemsize == 1 and buf.c_contiguous


def decode_run(buf, entries, start, end, base, first_offset, verify, messages, keep=None):
    """See storage.record_decode.decode_run."""
    if _pure is None:
        _import_pure()
    if (
        not _byte_view(buf)
        or type(messages) is not list
        or not (keep is None or type(keep) is dict)
        or not (type(entries) is list or type(entries) is tuple)
        or type(start) is not int
        or type(end) is not int
        or type(base) is not int
        or type(first_offset) is not int
        or not 0 <= start <= end <= len(entries)
        or not -(1 << 62) < base < (1 << 62)
        or not 0 <= first_offset < (1 << 62)
    ):
        return _pure.decode_run(
            buf, entries, start, end, base, first_offset, verify, messages, keep
        )
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        return _decode(
            buf, <const uint8_t*>view.buf, view.len, entries, start, end, base, first_offset,
            bool(verify), <list>messages, keep,
        )
    finally:
        PyBuffer_Release(&view)


cdef object _decode(
    object buf, const uint8_t* data, Py_ssize_t limit, object entries, Py_ssize_t start,
    Py_ssize_t end, long long base, long long first_offset, bint verify, list messages,
    object keep,
):
    cdef Py_ssize_t k
    cdef long long commit, size, pos, p, q, r, t
    cdef const uint8_t* h
    cdef uint32_t total, magic
    cdef uint64_t physical
    cdef unsigned long checked
    for k in range(start, end):
        item = entries[k]
        if not _read_entry(item, &commit, &size):
            return _rest(buf, entries, k, end, base, first_offset, verify, messages, keep)
        commit_object = <object>PyTuple_GET_ITEM(item, 0)
        size &= ENTRY_SIZE_MASK
        pos = commit - base
        if pos + size > limit:
            return commit_object, PAST_THE_END
        if pos < 0 or pos + HEADER_SIZE > limit:  # the pure twin's struct.error, or its reading
            return _rest(buf, entries, k, end, base, first_offset, verify, messages, keep)
        h = data + pos
        total = _u32(h)
        magic = _u32(h + 4)
        physical = _u64(h + 12)
        if (
            magic != MESSAGE_MAGIC
            or total != size
            or commit < 0
            or physical != <uint64_t>commit
        ):
            if magic == COPY_MAGIC and total == size and commit >= 0 and physical == <uint64_t>commit:
                pass  # relocated by the garbage collector
            elif magic == HOLE_MAGIC:
                continue  # removed by repair; `storage check` listed it
            else:
                return commit_object, NOT_THE_RECORD
        if verify:
            # buf[pos + 12 : pos + size], as Python slices it (empty below 12 bytes).
            if size > 12:
                checked = crc32(0, h + 12, <unsigned int>(size - 12))
            else:
                checked = 0
            if checked != _u32(h + 8):
                return commit_object, CRC_MISMATCH
        p = pos + HEADER_SIZE + <long long>_u16(h + 40) * DEST_SIZE
        q = p + h[42]
        r = q + h[43]
        t = r + <long long>_u32(h + 44)
        fields = (
            first_offset + k,
            commit_object,
            _copy(data, p, q, limit),
            _copy(data, q, r, limit),
            buf[r:t],
            buf[t : t + <long long>_u32(h + 48)],
            _u64(h + 20),
            _u64(h + 28),
            _u32(h + 36),
        )
        PyList_Append(messages, _new_tuple(StoredMessage, fields))
        if keep is not None and _u16(h + 40) > 1:  # a fan-out's: the other queues read it next
            PyDict_SetItem(keep, commit_object, (size, *(<tuple>fields)[2:]))
    return None


cdef bytes _copy(const uint8_t* data, long long start, long long stop, long long limit):
    """bytes(buf[start:stop]), clipped to the buffer as Python's slicing clips it."""
    start = _clip(start, limit)
    stop = _clip(stop, limit)
    if stop < start:
        stop = start
    return PyBytes_FromStringAndSize(<const char*>(data + start), stop - start)


cdef object _rest(buf, entries, Py_ssize_t k, Py_ssize_t end, long long base,
                  long long first_offset, bint verify, list messages, object keep):
    return _pure.decode_run(buf, entries, k, end, base, first_offset, verify, messages, keep)


def take_kept(entries, start, end, first_offset, floor, young, old, messages):
    """See storage.record_decode.take_kept."""
    if _pure is None:
        _import_pure()
    if (
        type(messages) is not list
        or type(young) is not dict
        or type(old) is not dict
        or not (type(entries) is list or type(entries) is tuple)
        or type(start) is not int
        or type(end) is not int
        or type(first_offset) is not int
        or type(floor) is not int
        or not 0 <= start <= end <= len(entries)
        or not 0 <= first_offset < (1 << 62)
        or not -(1 << 62) < floor < (1 << 62)
    ):
        return _pure.take_kept(entries, start, end, first_offset, floor, young, old, messages)
    return _take(entries, start, end, first_offset, floor, <dict>young, <dict>old,
                 <list>messages)  # fmt: skip


cdef object _take(
    object entries, Py_ssize_t start, Py_ssize_t end, long long first_offset, long long floor,
    dict young, dict old, list messages,
):
    cdef Py_ssize_t k, i
    cdef long long commit, size
    cdef PyObject* found
    cdef tuple kept, fields
    for k in range(start, end):
        item = entries[k]
        if not _read_entry(item, &commit, &size):
            break
        commit_object = <object>PyTuple_GET_ITEM(item, 0)
        found = PyDict_GetItem(young, commit_object)
        if found is NULL:
            found = PyDict_GetItem(old, commit_object)
            if found is NULL:
                return k
        if type(<object>found) is not tuple or PyTuple_GET_SIZE(<object>found) != 8:
            break
        kept = <tuple>found
        if type(<object>PyTuple_GET_ITEM(kept, 0)) is not int:
            break
        if <object>PyTuple_GET_ITEM(kept, 0) != (size & ENTRY_SIZE_MASK) or commit < floor:
            return k
        fields = (first_offset + k, commit_object, *kept[1:])
        PyList_Append(messages, _new_tuple(StoredMessage, fields))
    else:
        return end
    return _pure.take_kept(entries, k, end, first_offset, floor, young, old, messages)
