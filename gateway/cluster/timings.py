"""The cluster link's timings, in one place because several of its tasks share them: the
gateway lease and the delivery leases (how long they last, how often they are renewed and
retried), the polling of held partitions and the long-poll reads on the broker, and the
bounds of a basic.get's lease hand-over. Nothing here does anything; the tasks that use
them are in link.py, delivery_leases.py, hand_over.py and long_poll.py."""

from __future__ import annotations

GATEWAY_LEASE_MS = 5_000
DELIVERY_LEASE_MS = 5_000
RENEW_EVERY_S = 1.0
POLL_S = 0.05
LONG_POLL_MS = 5_000  # a held read's longest wait on the broker (then it is sent again)
RETRY_S = 0.5
GET_HOLD_S = 5.0  # a queue read by basic.get keeps its leases this long after the last get
# basic.get on a gateway that does not hold the queue's leases asks the holder to hand them
# over and waits this long at most for its answer (docs/cluster.md: one hand-over is a few
# Redis and broker round trips; this bound is for a holder that is slow or gone).
HANDOVER_WAIT_S = 0.5
HANDOVER_LISTEN_S = 1.0  # the blocking read of requests to this gateway (then read again)
BUSY_S = POLL_S  # a holder's "busy" answer stands for the gets here during this long
SILENT_S = 1.0  # a holder that did not answer is not asked again during this long
RELEASE_AT_STOP_S = 2.0  # at a stop, the leases are given up within this (else they lapse)
# At start and after a metadata feed gap, the brokers are asked for the queue ids they hold
# (so that Redis hands out none of them again) this long at most.
QUEUE_IDS_WAIT_S = 2.0
# A spread queue's partition this gateway no longer wants (the split changed) is handed over
# once its consumers here have settled what they hold of it, or after this long.
SETTLE_S = 3.0
