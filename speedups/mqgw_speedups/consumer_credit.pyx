# The compiled twin of gateway/sessions/consumer_credit.py: the same answer as has_credit()
# and then room(most). For a Consumer (its fields at their slots' offsets, slot_access.pxi)
# on a ChannelState of a Session without rate limits, it reads the fields those two methods
# read, as they read them; for anything else it asks the methods (the pure twin).

include "slot_access.pxi"

# The pure twin and the classes it checks, imported at first use: gateway/sessions/
# channel_state.py imports this module (through storage/twins.py) while it is being imported.
cdef object _pure = None
cdef object Consumer = None
cdef object ChannelState = None
cdef object Session = None
cdef Py_ssize_t C_CHANNEL, C_QUEUE, C_NO_ACK, C_PREFETCH, C_UNACKED


cdef void _import() except *:
    global _pure, Consumer, ChannelState, Session
    global C_CHANNEL, C_QUEUE, C_NO_ACK, C_PREFETCH, C_UNACKED
    from gateway.sessions import channel_state, consumer_credit, session

    consumer = channel_state.Consumer
    C_CHANNEL, C_QUEUE = slot_offset(consumer, "channel"), slot_offset(consumer, "queue")
    C_NO_ACK, C_PREFETCH = slot_offset(consumer, "no_ack"), slot_offset(consumer, "prefetch")
    C_UNACKED = slot_offset(consumer, "unacked")
    Consumer, ChannelState, Session = consumer, channel_state.ChannelState, session.Session
    _pure = consumer_credit


def grant(consumer, most):
    """See gateway.sessions.consumer_credit.grant."""
    if _pure is None:
        _import()
    if type(consumer) is not Consumer:
        return _pure.grant(consumer, most)
    channel = get_slot(consumer, C_CHANNEL)
    if type(channel) is not ChannelState:
        return _pure.grant(consumer, most)
    session = channel.session
    if type(session) is not Session or session.limits is not None:
        return _pure.grant(consumer, most)
    # Consumer.has_credit_but_rate (has_credit without limits)
    if not channel.flow_active or not session.writable or channel.closing:
        return 0
    if session.stopped and not get_slot(consumer, C_QUEUE).control_running:
        return 0
    if get_slot(consumer, C_NO_ACK):
        return most  # Consumer.room for no-ack
    prefetch = get_slot(consumer, C_PREFETCH)
    unacked = get_slot(consumer, C_UNACKED)
    if prefetch and unacked >= prefetch:
        return 0
    prefetch_global = channel.prefetch_global
    if prefetch_global and len(channel.unacked) >= prefetch_global:
        return 0
    room = most  # Consumer.room
    if prefetch:
        room = min(room, prefetch - unacked)
    if prefetch_global:
        room = min(room, prefetch_global - len(channel.unacked))
    return room
