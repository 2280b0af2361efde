# The compiled twin of gateway/amqp/publish_cut.py: same function, same results.
# The frame heads are read straight from the bytearray's memory and the three payloads copied
# out with one allocation each. Input outside the common domain (not a bytearray, a negative
# position, a frame_max beyond u32) goes to the pure twin, so the two agree on everything.
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

cdef object _new_tuple = tuple.__new__
# The pure twin and its result type, imported at first use: importing it runs
# gateway/amqp/__init__.py, which imports this module (through storage/twins.py).
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
    EXCHANGE_AT = 6
    ACK_INDEX = 0x003C0050
    ACK_PAYLOAD = 13  # class and method ids, u64 delivery tag, the bits
    ACK_FRAME = 21  # frame head, payload, frame end


cdef inline uint64_t big_endian(const uint8_t* at, int size) noexcept:
    cdef uint64_t value = 0
    cdef int i
    for i in range(size):
        value = (value << 8) | at[i]
    return value


cdef struct Cut:
    long long channel
    Py_ssize_t method_start, method_end, properties_at, head_end, body_start, body_end


cdef bint _find(
    const uint8_t* data, Py_ssize_t size, Py_ssize_t start, long long limit, Cut* cut
) noexcept:
    """Whether a whole publish starts at ``start`` (every check of cut_publish but accept);
    if so, ``cut`` says where its parts are."""
    if start + 11 > size:
        return False
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
        return False
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
        return False
    cdef Py_ssize_t body_at = head_end + 1
    cdef Py_ssize_t body_start = body_at + FRAME_HEADER_SIZE
    cdef Py_ssize_t body_end = body_start + <Py_ssize_t>body_size
    head = data + body_at
    cdef Py_ssize_t properties_at = head_at + FRAME_HEADER_SIZE + CONTENT_HEADER_FIXED
    if (
        head[0] != FRAME_BODY
        or <long long>big_endian(head + 1, 2) != channel
        or big_endian(head + 3, 4) != body_size
        or data[body_end] != FRAME_END
        or not _properties_ok(data + properties_at, head_end - properties_at)
    ):
        return False
    cut.channel = channel
    cut.method_start = method_start
    cut.method_end = method_end
    cut.properties_at = properties_at
    cut.head_end = head_end
    cut.body_start = body_start
    cut.body_end = body_end
    return True


cdef inline bytes _copy(object buf, Py_ssize_t start, Py_ssize_t end):
    return PyBytes_FromStringAndSize(PyByteArray_AS_STRING(buf) + start, end - start)


def cut_publish(buf, pos, frame_max, accept):
    """See gateway.amqp.publish_cut.cut_publish."""
    if _pure is None:
        _import_pure()
    if type(buf) is not bytearray or not (0 <= pos <= 1 << 48 and 0 <= frame_max <= 1 << 32):
        return _pure.cut_publish(buf, pos, frame_max, accept)
    cdef Cut cut
    cdef const uint8_t* data = <const uint8_t*>PyByteArray_AS_STRING(buf)
    if not _find(data, PyByteArray_GET_SIZE(buf), pos, frame_max, &cut):
        return None
    if not accept(cut.channel):
        return None
    return cut.body_end + 1, _frames(buf, &cut)


cdef object _frames(object buf, Cut* cut):
    """The PublishFrames of ``cut``, once accept() ran (Python code, which may have changed
    ``buf``: if it shrank, sliced as the pure twin does)."""
    if PyByteArray_GET_SIZE(buf) <= cut.body_end:
        return _new_tuple(
            PublishFrames,
            (
                cut.channel,
                bytes(buf[cut.method_start:cut.method_end]),
                bytes(buf[cut.properties_at:cut.head_end]),
                bytes(buf[cut.body_start:cut.body_end]),
            ),
        )
    return _new_tuple(
        PublishFrames,
        (
            cut.channel,
            _copy(buf, cut.method_start, cut.method_end),
            _copy(buf, cut.properties_at, cut.head_end),
            _copy(buf, cut.body_start, cut.body_end),
        ),
    )


def cut_inbound(buf, pos, frame_max, max_body, accept, make_publish, make_ack, out):
    """See gateway.amqp.publish_cut.cut_inbound."""
    if _pure is None:
        _import_pure()
    if (
        type(buf) is not bytearray
        or type(out) is not list
        or not (0 <= pos <= 1 << 48 and 0 <= frame_max <= 1 << 32 and 0 <= max_body <= 1 << 62)
    ):
        return _pure.cut_inbound(
            buf, pos, frame_max, max_body, accept, make_publish, make_ack, out
        )
    cdef Cut cut
    cdef Py_ssize_t start = pos, size
    cdef long long limit = frame_max, body_limit = max_body, last = -1, channel
    cdef set accepted = set()
    cdef const uint8_t* data
    while True:
        data = <const uint8_t*>PyByteArray_AS_STRING(buf)  # reloaded: make_*() are Python code
        size = PyByteArray_GET_SIZE(buf)
        if not _find(data, size, start, limit, &cut):
            channel = _ack_channel(data, size, start, limit)
            if channel < 0 or not _accepted(channel, last, accepted, accept):
                break
            last = channel
            if PyByteArray_GET_SIZE(buf) < start + ACK_FRAME:  # accept() shrank buf
                ack = _pure.cut_ack(buf, start, frame_max, lambda _channel: True)
                if ack is None:
                    break
                start, (channel_number, delivery_tag, multiple) = ack
                out.append(make_ack(channel_number, delivery_tag, multiple))
                continue
            data = <const uint8_t*>PyByteArray_AS_STRING(buf)  # accept() ran Python code
            out.append(
                make_ack(
                    channel,
                    <int64_t>big_endian(data + start + FRAME_HEADER_SIZE + 4, 8),  # as pamqp
                    data[start + FRAME_HEADER_SIZE + 12] & 1 == 1,
                )
            )
            start += ACK_FRAME
            continue
        if not _accepted(cut.channel, last, accepted, accept):
            break
        last = cut.channel
        if PyByteArray_GET_SIZE(buf) <= cut.body_end:  # accept() shrank buf
            channel_number, method, properties, body = _frames(buf, &cut)
            head = _pure.publish_head(method)
            if head is None or len(body) > max_body:
                break
            out.append(make_publish(channel_number, *head, properties, body))
            start = cut.body_end + 1
            continue
        data = <const uint8_t*>PyByteArray_AS_STRING(buf)  # accept() ran Python code
        if cut.body_end - cut.body_start > body_limit:
            break
        head = _head(data, cut.method_start, cut.method_end)
        if head is None:
            break
        exchange, routing_key, bits = head
        publish = make_publish(
            cut.channel,
            exchange,
            routing_key,
            bits & 1 == 1,
            bits & 2 == 2,
            _copy(buf, cut.properties_at, cut.head_end),
            _copy(buf, cut.body_start, cut.body_end),
        )
        out.append(publish)
        start = cut.body_end + 1
    return start


cdef bint _accepted(long long channel, long long last, set accepted, object accept) except -1:
    """Whether ``channel`` takes the fast path: asked of ``accept`` once per read (``last``,
    the channel of the frame before, saves the set's lookup in the common case)."""
    if channel == last or channel in accepted:
        return True
    if not accept(channel):
        return False
    accepted.add(channel)
    return True


cdef long long _ack_channel(
    const uint8_t* data, Py_ssize_t size, Py_ssize_t start, long long limit
) noexcept:
    """The channel of the basic.ack frame at ``start`` (cut_ack's checks but accept), or -1."""
    if start + ACK_FRAME > size:
        return -1
    cdef const uint8_t* head = data + start
    if (
        head[0] != FRAME_METHOD
        or big_endian(head + 3, 4) != ACK_PAYLOAD
        or big_endian(head + 7, 4) != ACK_INDEX
        or ACK_PAYLOAD > limit
        or head[ACK_FRAME - 1] != FRAME_END
    ):
        return -1
    return <long long>big_endian(head + 1, 2)


def cut_ack(buf, pos, frame_max, accept):
    """See gateway.amqp.publish_cut.cut_ack."""
    if _pure is None:
        _import_pure()
    return _pure.cut_ack(buf, pos, frame_max, accept)


cdef object _head(const uint8_t* data, Py_ssize_t start, Py_ssize_t end):
    """publish_head on ``data[start:end]``, its bits undecoded: (exchange, key, bits)."""
    if end - start <= EXCHANGE_AT:
        return None
    cdef Py_ssize_t exchange_start = start + EXCHANGE_AT + 1
    cdef Py_ssize_t exchange_end = exchange_start + data[start + EXCHANGE_AT]
    if exchange_end >= end:
        return None
    cdef Py_ssize_t key_start = exchange_end + 1
    cdef Py_ssize_t key_end = key_start + data[exchange_end]
    if key_end >= end:
        return None
    cdef const char* chars = <const char*>data
    try:
        exchange = PyUnicode_DecodeUTF8(chars + exchange_start, exchange_end - exchange_start, NULL)
        routing_key = PyUnicode_DecodeUTF8(chars + key_start, key_end - key_start, NULL)
    except UnicodeDecodeError:
        return None
    return exchange, routing_key, data[key_end]


def publish_head(method):
    """See gateway.amqp.publish_cut.publish_head."""
    if _pure is None:
        _import_pure()
    return _pure.publish_head(method)


def properties_well_formed(data):
    """See gateway.amqp.publish_cut.properties_well_formed."""
    if type(data) is not bytes:
        if _pure is None:
            _import_pure()
        return _pure.properties_well_formed(data)
    cdef const uint8_t* at = <const uint8_t*><const char*>data
    return _properties_ok(at, len(<bytes>data))


# Property flag bits from 0x8000 down to 0x0004: 0 a shortstr, -1 a field table, else a fixed
# size (octet, timestamp).
cdef int[14] _PROPERTY_KINDS = [0, 0, -1, 1, 1, 0, 0, 0, 0, 8, 0, 0, 0, 0]


cdef inline int _fixed_value_size(uint8_t tag) noexcept:
    """The size of a fixed-size field value of this tag; -1 for S x F A, -2 if unknown."""
    if tag == b"t" or tag == b"b" or tag == b"B":
        return 1
    if tag == b"s" or tag == b"u":
        return 2
    if tag == b"I" or tag == b"i" or tag == b"f":
        return 4
    if tag == b"l" or tag == b"L" or tag == b"d" or tag == b"T":
        return 8
    if tag == b"D":
        return 5
    if tag == b"V":
        return 0
    if tag == b"S" or tag == b"x" or tag == b"F" or tag == b"A":
        return -1
    return -2


cdef bint _properties_ok(const uint8_t* data, Py_ssize_t size) noexcept:
    if size < 2:
        return False
    cdef unsigned int flags = ((<unsigned int>data[0] << 8) | data[1]) & 0xFFFC
    cdef Py_ssize_t pos = 2
    cdef Py_ssize_t end
    cdef int index, kind
    for index in range(14):
        if not flags & (0x8000 >> index):
            continue
        if pos >= size:
            return False
        kind = _PROPERTY_KINDS[index]
        if kind == 0:
            pos += 1 + data[pos]
        elif kind > 0:
            pos += kind
        else:
            if pos + 4 > size:
                return False
            end = pos + 4 + <Py_ssize_t>big_endian(data + pos, 4)
            if end > size or not _table_ok(data, pos + 4, end):
                return False
            pos = end
    return pos == size


cdef bint _table_ok(const uint8_t* data, Py_ssize_t pos, Py_ssize_t end) noexcept:
    """The pure twin's walk with its stack of ends. Each nested table or array takes at least
    5 bytes, so a stack sized for depth*5 <= the bytes suffices; it grows in chunks of 64."""
    cdef Py_ssize_t local_ends[64]
    cdef bint local_tables[64]
    cdef Py_ssize_t* ends = local_ends
    cdef bint* tables = local_tables
    cdef Py_ssize_t capacity = 64, depth = 1
    cdef Py_ssize_t value_end
    cdef int fixed
    cdef uint8_t tag
    cdef bint ok = True
    ends[0] = end
    tables[0] = True
    while depth:
        if pos == ends[depth - 1]:
            depth -= 1
            continue
        end = ends[depth - 1]
        if tables[depth - 1]:
            pos += 1 + data[pos]  # the key: any bytes
            if pos >= end:
                ok = False
                break
        tag = data[pos]
        pos += 1
        fixed = _fixed_value_size(tag)
        if fixed >= 0:
            if pos + fixed > end or (
                (tag == b"f" or tag == b"d") and not _finite(data + pos, tag)
            ):
                ok = False
                break
            pos += fixed
        elif fixed == -1:
            if pos + 4 > end:
                ok = False
                break
            value_end = pos + 4 + <Py_ssize_t>big_endian(data + pos, 4)
            if value_end > end:
                ok = False
                break
            if tag == b"F" or tag == b"A":
                if depth == capacity:
                    if not _grow(&ends, &tables, capacity, ends == local_ends):
                        ok = False  # out of memory: refuse rather than crash
                        break
                    capacity *= 2
                ends[depth] = value_end
                tables[depth] = tag == b"F"
                depth += 1
                pos += 4
            else:
                pos = value_end
        else:
            ok = False  # a tag RabbitMQ does not know
            break
    if ends != local_ends:
        free(ends)
        free(tables)
    return ok


cdef bint _grow(Py_ssize_t** ends, bint** tables, Py_ssize_t capacity, bint on_stack) noexcept:
    """Double the walk's stack, moving it to the heap the first time."""
    cdef Py_ssize_t* new_ends = <Py_ssize_t*>malloc(2 * capacity * sizeof(Py_ssize_t))
    cdef bint* new_tables = <bint*>malloc(2 * capacity * sizeof(bint))
    if new_ends == NULL or new_tables == NULL:
        free(new_ends)
        free(new_tables)
        return False
    memcpy(new_ends, ends[0], capacity * sizeof(Py_ssize_t))
    memcpy(new_tables, tables[0], capacity * sizeof(bint))
    if not on_stack:
        free(ends[0])
        free(tables[0])
    ends[0] = new_ends
    tables[0] = new_tables
    return True


cdef inline bint _finite(const uint8_t* at, uint8_t tag) noexcept:
    """Erlang's float match fails on an infinity or a NaN (all exponent bits set)."""
    if at[0] & 0x7F != 0x7F:
        return True
    if tag == b"f":
        return not (at[1] & 0x80)
    return (at[1] & 0xF0) != 0xF0
