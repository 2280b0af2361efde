"""A consumer's credit asked once per run: ``Consumer.grant``, what the compiled turn of a plain
queue asks (speedups/mqgw_speedups/plain_turn.pyx) before it takes a run.

``grant(consumer, most)`` is ``consumer.has_credit()`` and then ``consumer.room(most)`` in
one call: how many messages in a row it may take now, 0 when it has no credit (room is at
least 1 whenever there is credit). This pure module is the reference, and asks the two
methods; its compiled twin (speedups/mqgw_speedups/consumer_credit.pyx, picked by
storage/twins.py) answers for a Consumer on a ChannelState of a Session without rate limits
from their fields, and asks the methods for any other. tests/gateway/sessions/
test_consumer_credit_twins.py holds the two equal on real sessions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage import twins

if TYPE_CHECKING:
    from gateway.sessions.channel_state import Consumer


def grant(consumer: Consumer, most: int) -> int:
    """How many messages in a row ``consumer`` may take now (at most ``most``; 0: none)."""
    if not consumer.has_credit():
        return 0
    return consumer.room(most)


picked = twins.pick(grant)  # what Consumer.grant is
