# The compiled twin of gateway/amqp/deliver_frame.py: same function, same bytes.
# The three frames are written into one bytes object of the right size (one allocation, the
# names and payloads copied in with memcpy). Input outside the common domain (names that are
# neither str nor bytes, numbers out of range, buffers that are not plain bytes) goes to the
# pure twin, so the two agree on everything, errors included.
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcpy

# The pure twin, imported at first use: importing it runs gateway/amqp/__init__.py, which
# imports this module (through storage/twins.py).
cdef object _pure = None


cdef void _import_pure() except *:
    global _pure
    from gateway.amqp import deliver_frame

    _pure = deliver_frame


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL


cdef enum:
    FRAME_METHOD = 1
    FRAME_HEADER = 2
    FRAME_BODY = 3
    FRAME_END = 0xCE
    FRAME_HEAD_SIZE = 7
    FRAME_OVERHEAD = 8
    BASIC_CLASS_ID = 60
    DELIVER_METHOD_ID = 60
    CONTENT_HEADER_FIXED = 12


cdef inline uint8_t* put_big_endian(uint8_t* at, uint64_t value, int size) noexcept:
    cdef int i
    for i in range(size - 1, -1, -1):
        at[i] = value & 0xFF
        value >>= 8
    return at + size


cdef inline uint8_t* put_shortstr(uint8_t* at, const char* text, Py_ssize_t size) noexcept:
    at[0] = <uint8_t>size
    memcpy(at + 1, text, size)
    return at + 1 + size


cdef inline uint8_t* put_frame_head(uint8_t* at, int kind, long channel, uint64_t size) noexcept:
    at[0] = kind
    at = put_big_endian(at + 1, channel, 2)
    return put_big_endian(at, size, 4)


cdef const char* utf8(object value, Py_ssize_t* size) except? NULL:
    """The UTF-8 of a str (cached by CPython) or an exact bytes; NULL for anything else."""
    if type(value) is str:
        return PyUnicode_AsUTF8AndSize(value, size)
    if type(value) is bytes:
        size[0] = PyBytes_GET_SIZE(value)
        return PyBytes_AS_STRING(value)
    return NULL


cdef inline bint plain_int(object value, object high):
    return type(value) is int and 0 <= value <= high


cdef object ASK_PURE = object()  # _deliver's answer for input outside its domain


def deliver_one_write(
    channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
    properties_bytes, body, frame_max,
):
    """See gateway.amqp.deliver_frame.deliver_one_write."""
    written = _deliver(
        channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
        properties_bytes, body, frame_max,
    )
    if written is ASK_PURE:
        if _pure is None:
            _import_pure()
        return _pure.deliver_one_write(
            channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
            properties_bytes, body, frame_max,
        )
    return written


cdef object _deliver(
    channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
    properties_bytes, body, frame_max,
):
    if not (
        plain_int(channel, 0xFFFF)
        and plain_int(delivery_tag, 0xFFFFFFFFFFFFFFFF)
        and plain_int(frame_max, 1 << 32)
    ):
        return ASK_PURE
    cdef Py_ssize_t tag_size, exchange_size, key_size
    cdef const char* tag = utf8(consumer_tag, &tag_size)
    if tag != NULL and tag_size > 255:
        return None
    cdef const char* exchange_chars = utf8(exchange, &exchange_size) if tag != NULL else NULL
    cdef const char* key = utf8(routing_key, &key_size) if exchange_chars != NULL else NULL
    if key == NULL:
        return ASK_PURE
    cdef Py_buffer properties_view, body_view
    try:
        PyObject_GetBuffer(properties_bytes, &properties_view, PyBUF_SIMPLE)
    except (BufferError, TypeError):
        return ASK_PURE
    try:
        PyObject_GetBuffer(body, &body_view, PyBUF_SIMPLE)
    except (BufferError, TypeError):
        PyBuffer_Release(&properties_view)
        return ASK_PURE
    try:
        if properties_view.len != len(properties_bytes) or body_view.len != len(body):
            return ASK_PURE  # a view of wider items: the pure twin counts items, not bytes
        return _write(
            channel, tag, tag_size, delivery_tag, redelivered, exchange_chars, exchange_size,
            key, key_size, &properties_view, &body_view, frame_max,
        )
    finally:
        PyBuffer_Release(&body_view)
        PyBuffer_Release(&properties_view)


cdef object _write(
    long channel, const char* tag, Py_ssize_t tag_size, uint64_t delivery_tag, redelivered,
    const char* exchange, Py_ssize_t exchange_size, const char* key, Py_ssize_t key_size,
    Py_buffer* properties, Py_buffer* body, long long frame_max,
):
    if exchange_size > 255 or key_size > 255 or body.len > frame_max - FRAME_OVERHEAD:
        return None
    cdef uint8_t again = 1 if redelivered else 0  # its truth, taken where the pure twin does
    cdef Py_ssize_t method_size = 4 + 1 + tag_size + 9 + 1 + exchange_size + 1 + key_size
    cdef Py_ssize_t size = (
        FRAME_OVERHEAD + method_size
        + FRAME_OVERHEAD + CONTENT_HEADER_FIXED + properties.len
        + (FRAME_OVERHEAD + body.len if body.len else 0)
    )
    frames = PyBytes_FromStringAndSize(NULL, size)
    cdef uint8_t* at = <uint8_t*>PyBytes_AS_STRING(frames)
    at = put_frame_head(at, FRAME_METHOD, channel, method_size)
    at = put_big_endian(at, BASIC_CLASS_ID, 2)
    at = put_big_endian(at, DELIVER_METHOD_ID, 2)
    at = put_shortstr(at, tag, tag_size)
    at = put_big_endian(at, delivery_tag, 8)
    at[0] = again
    at = put_shortstr(at + 1, exchange, exchange_size)
    at = put_shortstr(at, key, key_size)
    at[0] = FRAME_END
    at = put_frame_head(at + 1, FRAME_HEADER, channel, CONTENT_HEADER_FIXED + properties.len)
    at = put_big_endian(at, BASIC_CLASS_ID, 2)
    at = put_big_endian(at, 0, 2)  # weight
    at = put_big_endian(at, body.len, 8)
    memcpy(at, properties.buf, properties.len)
    at += properties.len
    if body.len:
        at[0] = FRAME_END
        at = put_frame_head(at + 1, FRAME_BODY, channel, body.len)
        memcpy(at, body.buf, body.len)
        at += body.len
    at[0] = FRAME_END
    return frames
