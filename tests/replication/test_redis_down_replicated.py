"""Every Redis host down under a publisher's load on a replicated group whose brokers run with
--replica-standing: the master goes on confirming on its in-sync replica's promises, so
publishers do not wait for Redis (before, confirms stopped for the whole outage once the
master's standing ran out). Nothing fails over meanwhile, and nothing confirmed is lost."""

from __future__ import annotations

import time

import pytest

from tests.replication.conftest import Group
from tests.replication.load import finish, loaded_group, more

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def test_a_replicated_group_confirms_with_redis_down(group: Group) -> None:
    flags = ("--min-in-sync", "2", "--replica-standing")
    publisher, url = await loaded_group(group, broker_flags=flags)
    first = await group.record()
    publisher.longest_stall_s = 0.0  # from here on: the outage's, not the start's
    group.redis.stop()  # SIGKILL: every Redis host down
    try:
        # Five seconds without Redis, past the master timeout (1.5 s) three times: confirms
        # keep coming in every second (an observation over time, not a wait for an event),
        # and no publish waits anywhere near the outage for its confirm.
        for _ in range(5):
            before = len(publisher.confirmed)
            time.sleep(1.0)
            assert publisher.error is None, repr(publisher.error)
            assert len(publisher.confirmed) > before, group.brokers["a"].log()[-2000:]
        assert publisher.longest_stall_s < 3.0, publisher.longest_stall_s
    finally:
        group.redis.start()
    more(publisher, 100)
    assert (await group.record()).epoch == first.epoch  # no failover meanwhile
    finish(publisher, url)
