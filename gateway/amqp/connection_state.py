"""The connection's state table (h11/_state.py style).

Theory of operation
-------------------
``TRANSITIONS`` maps (state, input) to the next state; a missing key is an
illegal move. Client methods that do not fit the state never reach the table:
the connection turns them into CHANNEL_ERROR "unexpected method in connection
state X" first, as RabbitMQ does. A missing key therefore means the layer above
called something at the wrong time (ConnectionStateError), not a client fault::

    AWAIT_HEADER --HEADER--> START_SENT --START_OK--> SECURE --AUTH_ACCEPTED--> TUNE_SENT
      --TUNE_OK--> AWAIT_OPEN --OPEN--> OPENING --VHOST_ACCEPTED--> OPEN
    OPEN --CLIENT_CLOSE--> CLOSED      (we answer close-ok)
    any live state --SEND_CLOSE--> CLOSING --CLOSE_OK | CLIENT_CLOSE--> CLOSED
    any live state --ABORT--> CLOSED   (silent close, lost framing, heartbeat timeout)

SECURE and OPENING wait for a decision from the layer above (auth, vhost);
input is held unparsed meanwhile.
"""

from __future__ import annotations

import enum


class ConnectionState(enum.Enum):
    AWAIT_HEADER = "await_header"
    START_SENT = "start_sent"
    SECURE = "secure"
    TUNE_SENT = "tune_sent"
    AWAIT_OPEN = "await_open"
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class ConnectionInput(enum.Enum):
    HEADER = "header"
    START_OK = "start_ok"
    AUTH_ACCEPTED = "auth_accepted"
    TUNE_OK = "tune_ok"
    OPEN = "open"
    VHOST_ACCEPTED = "vhost_accepted"
    CLIENT_CLOSE = "client_close"
    CLOSE_OK = "close_ok"
    SEND_CLOSE = "send_close"
    ABORT = "abort"


class ConnectionStateError(RuntimeError):
    """The layer above called a method that is illegal in the current state."""


_St, _In = ConnectionState, ConnectionInput
TRANSITIONS: dict[tuple[ConnectionState, ConnectionInput], ConnectionState] = {
    (_St.AWAIT_HEADER, _In.HEADER): _St.START_SENT,
    (_St.START_SENT, _In.START_OK): _St.SECURE,
    (_St.SECURE, _In.AUTH_ACCEPTED): _St.TUNE_SENT,
    (_St.TUNE_SENT, _In.TUNE_OK): _St.AWAIT_OPEN,
    (_St.AWAIT_OPEN, _In.OPEN): _St.OPENING,
    (_St.OPENING, _In.VHOST_ACCEPTED): _St.OPEN,
    (_St.OPEN, _In.CLIENT_CLOSE): _St.CLOSED,
    (_St.CLOSING, _In.CLIENT_CLOSE): _St.CLOSED,
    (_St.CLOSING, _In.CLOSE_OK): _St.CLOSED,
    **{(s, _In.SEND_CLOSE): _St.CLOSING for s in _St if s not in (_St.CLOSING, _St.CLOSED)},
    **{(s, _In.ABORT): _St.CLOSED for s in _St if s is not _St.CLOSED},
}

# RabbitMQ's names for our states ("unexpected method in connection state X").
RABBIT_STATE_NAMES = {
    _St.START_SENT: "starting",
    _St.SECURE: "securing",
    _St.TUNE_SENT: "tuning",
    _St.AWAIT_OPEN: "opening",
    _St.OPENING: "opening",
    _St.OPEN: "running",
    _St.CLOSING: "closed",
}
# Before tune-ok most errors close the socket without a close frame (RabbitMQ).
HANDSHAKE_STATES = (_St.START_SENT, _St.SECURE, _St.TUNE_SENT)
# Waiting for the layer above: input stays buffered, unparsed.
PAUSED_STATES = (_St.SECURE, _St.OPENING)
FINISHED_STATES = (_St.CLOSING, _St.CLOSED)
del _St, _In


def next_state(state: ConnectionState, event: ConnectionInput) -> ConnectionState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise ConnectionStateError(f"{event.value} in state {state.value}") from None
