"""What a queue needs from a consumer and from the connection it delivers through.

The queue layer sees consumers only through these Protocols; the session layer's ``Consumer``
(gateway/sessions/channel_state.py) satisfies them. So a queue picks a consumer and hands it a
message without knowing what a session or a channel is, and nothing here imports upwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Self, TypeVar

from storage import StoredMessage

if TYPE_CHECKING:
    from gateway.queues.rate_limit import Limits
    from gateway.queues.runtime import QueueRuntime


C_contra = TypeVar("C_contra", contravariant=True)

# Which partitions of a queue with gray partitions a consumer reads (gateway/queues/gray_lanes.py):
# the normal ones, the gray ones, or all of them (gray handling switched off). A queue
# without gray partitions delivers every partition to every consumer.
LANE_NORMAL = 0
LANE_GRAY = 1
LANE_ALL = 2

# What a delivery adds to its connection's output beyond the body (an estimate the sink
# counts against its backlog, and a run of deliveries against ``byte_room``).
DELIVERY_OVERHEAD_BYTES = 128

# A message as taken from a queue for delivery: (partition, message, redelivered).
Taken = tuple[int, StoredMessage, bool]


class DeliverySink(Protocol[C_contra]):
    """The connection a consumer belongs to: where its deliveries are written. Generic in the
    consumer type so that the session can take its own ``Consumer`` back."""

    @property
    def limits(self) -> Limits | None:
        """The connection's consumption rate limits (operator controls); None: unlimited."""

    def deliver(
        self,
        consumer: C_contra,
        queue: QueueRuntime,
        partition: int,
        message: StoredMessage,
        redelivered: bool,
    ) -> None:
        """Frame and send one message to ``consumer``; book it unacked unless no-ack."""

    def deliver_run(self, consumer: C_contra, queue: QueueRuntime, run: list[Taken]) -> None:
        """``deliver`` for each of ``run`` in order, as one call (a queue's run to one
        consumer: gateway/queues/runtime.py)."""

    def byte_room(self) -> int:
        """Bytes of output (bodies plus DELIVERY_OVERHEAD_BYTES each) it takes before a
        delivery leaves it too far behind to be given more (a consumer's credit then ends)."""


class QueueConsumer(Protocol):
    """A consumer as a queue sees it: who it is, how it ranks, whether it can take more."""

    @property
    def tag(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def no_ack(self) -> bool: ...
    @property
    def exclusive(self) -> bool: ...
    @property
    def lane(self) -> int:
        """LANE_NORMAL, LANE_GRAY or LANE_ALL: its connection's gray state."""

    @property
    def sink(self) -> DeliverySink[Self]:
        """The connection that delivers to it (the session, in the gateway)."""

    def has_credit(self) -> bool:
        """Whether it may take one more message now (prefetch, flow, controls)."""

    def has_credit_but_rate(self) -> bool:
        """``has_credit`` but for its connection's rate limits: whether only they hold it."""

    def room(self, most: int) -> int:
        """Called when ``has_credit`` just said yes: how many messages in a row (at most
        ``most``) it may take before its own deliveries end its credit, its connection's
        output backlog aside (the sink's ``byte_room``)."""

    def grant(self, most: int) -> int:
        """``has_credit`` and then ``room(most)`` in one call: 0 when it has no credit."""
