"""The garbage collector's settings for a long-running server process (a broker, and the
gateway: gateway/server.py), applied once it has started.

What start-up built (a recovered store's registry and indexes, a gateway's vhosts and
queues) lives as long as the process: ``gc.freeze`` takes it out of the collector's
generations, so a full collection no longer walks it; and collections get rarer. Measured:
with the default thresholds a broker serving three gateways at 20,000 msgs/s ran bursts of
full collections (four of 50-70 ms, collecting nothing) every ~10 s, and every gateway's
deliveries stopped for ~0.75 s each time (`pytest -m slow tests/cluster/
test_throttle_across_gateways.py -k holds_for_20`: 14,600-18,300 msgs/s held of 20,000
before, 18,600-19,300 after); a gateway with 10,000 queues had its p99 go from ~140 ms to
~35 ms (`mqgw bench run many-queues-10k`).
"""

from __future__ import annotations

import gc

# Young-generation collections every 20,000 allocations instead of 700, older ones rarer.
GC_THRESHOLDS = (20_000, 10, 100)


def tune_gc() -> None:
    """Freeze what exists now and make collections rarer (call once start-up is done)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
