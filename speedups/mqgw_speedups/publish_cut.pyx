# The compiled twin of gateway/amqp/publish_cut.py: same function, same results.
# The frame heads are read straight from the bytearray's memory and the three payloads copied
# out with one allocation each. Input outside the common domain (not a bytearray, a negative
# position, a frame_max beyond u32) goes to the pure twin, so the two agree on everything.
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t, uint64_t

cdef object _new_tuple = tuple.__new__
# The pure twin and its result type, imported at first use: importing it runs
# gateway/amqp/__init__.py, which imports this module (through gateway/amqp/twins.py).
cdef object _pure = None
cdef object PublishFrames = None


cdef void _import_pure() except *:
    global _pure, PublishFrames
    from gateway.amqp import publish_cut

    _pure = publish_cut
    PublishFrames = publish_cut.PublishFrames


cdef enum:
    FRAME_METHOD = 1
    FRAME_HEADER = 2
    FRAME_BODY = 3
    FRAME_END = 0xCE
    FRAME_HEADER_SIZE = 7
    CONTENT_HEADER_SIZE = 21  # frame head + class id, weight, body size
    CONTENT_HEADER_FIXED = 12
    PUBLISH_INDEX = 0x003C0028


cdef inline uint64_t big_endian(const uint8_t* at, int size) noexcept:
    cdef uint64_t value = 0
    cdef int i
    for i in range(size):
        value = (value << 8) | at[i]
    return value


def cut_publish(buf, pos, frame_max, accept):
    """See gateway.amqp.publish_cut.cut_publish."""
    if _pure is None:
        _import_pure()
    if type(buf) is not bytearray or not (0 <= pos <= 1 << 48 and 0 <= frame_max <= 1 << 32):
        return _pure.cut_publish(buf, pos, frame_max, accept)
    cdef Py_ssize_t start = pos
    cdef long long limit = frame_max
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(buf)
    if start + 11 > size:
        return None
    cdef const uint8_t* data = <const uint8_t*>PyByteArray_AS_STRING(buf)
    cdef const uint8_t* head = data + start
    cdef long long channel = big_endian(head + 1, 2)
    cdef long long method_size = big_endian(head + 3, 4)
    cdef Py_ssize_t method_start = start + FRAME_HEADER_SIZE
    cdef Py_ssize_t method_end = method_start + method_size
    if (
        head[0] != FRAME_METHOD
        or big_endian(head + 7, 4) != PUBLISH_INDEX
        or method_size > limit
        or method_end + 1 + CONTENT_HEADER_SIZE > size
        or data[method_end] != FRAME_END
    ):
        return None
    cdef Py_ssize_t head_at = method_end + 1
    head = data + head_at
    cdef long long head_size = big_endian(head + 3, 4)
    cdef uint64_t body_size = big_endian(head + 11, 8)
    cdef Py_ssize_t head_end = head_at + FRAME_HEADER_SIZE + head_size
    if (
        head[0] != FRAME_HEADER
        or <long long>big_endian(head + 1, 2) != channel
        or head_size < CONTENT_HEADER_FIXED
        or head_size > limit
        or big_endian(head + 7, 2) != 60
        or big_endian(head + 9, 2) != 0
        or body_size == 0
        or body_size > <uint64_t>limit
        or head_end + 1 + FRAME_HEADER_SIZE + <Py_ssize_t>body_size >= size
        or data[head_end] != FRAME_END
    ):
        return None
    cdef Py_ssize_t body_at = head_end + 1
    cdef Py_ssize_t body_start = body_at + FRAME_HEADER_SIZE
    cdef Py_ssize_t body_end = body_start + <Py_ssize_t>body_size
    head = data + body_at
    if (
        head[0] != FRAME_BODY
        or <long long>big_endian(head + 1, 2) != channel
        or big_endian(head + 3, 4) != body_size
        or data[body_end] != FRAME_END
        or not accept(channel)
    ):
        return None
    if PyByteArray_GET_SIZE(buf) <= body_end:  # accept() shrank buf: slice as the pure twin
        return body_end + 1, _new_tuple(
            PublishFrames,
            (
                channel,
                bytes(buf[method_start:method_end]),
                bytes(buf[head_at + FRAME_HEADER_SIZE + CONTENT_HEADER_FIXED : head_end]),
                bytes(buf[body_start:body_end]),
            ),
        )
    data = <const uint8_t*>PyByteArray_AS_STRING(buf)  # accept() ran Python code: reload
    cdef const char* chars = <const char*>data
    cdef Py_ssize_t properties_at = head_at + FRAME_HEADER_SIZE + CONTENT_HEADER_FIXED
    frames = _new_tuple(
        PublishFrames,
        (
            channel,
            PyBytes_FromStringAndSize(chars + method_start, method_end - method_start),
            PyBytes_FromStringAndSize(chars + properties_at, head_end - properties_at),
            PyBytes_FromStringAndSize(chars + body_start, body_end - body_start),
        ),
    )
    return body_end + 1, frames
