"""A queue's counts on both gateways across a failover of its replicated broker group: the
delivering gateway keeps its consumer and what it holds; the other reads the new master,
which lost the delivering gateway's progress reports with the old one (they live in a
broker's memory) and, until the next report, counted the delivery outstanding as ready."""

from __future__ import annotations

import pytest

from tests.admin.test_counts_after_restart import wait_for_counts
from tests.cluster.test_counts_across_gateways import QUEUE, admin, hold_one_of_five
from tests.harness.waiting import check_for
from tests.replication.conftest import Group, group  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def test_counts_on_both_gateways_across_a_broker_failover(group: Group) -> None:  # noqa: F811
    group.add_controller("c1")
    group.add_broker("a")
    group.add_broker("b")
    first = await group.until(lambda r: r.master != "" and len(r.in_sync) == 2)
    a, b = group.add_gateway("gwA"), group.add_gateway("gwB")
    consumer, publishing = hold_one_of_five(a, b)

    group.master(first).kill()
    await group.until(lambda r: r.master not in ("", first.master))
    check_for(15, lambda: "master is now" in a.log() and "master is now" in b.log())
    wait_for_counts(admin(a), QUEUE, (3, 1, 4))
    wait_for_counts(admin(b), QUEUE, (3, 1, 4))  # stayed (4, 0, 4)

    consumer.ack(1)  # and "2" comes
    assert [body for _, body in consumer.until(3)] == [b"0", b"1", b"2"]
    wait_for_counts(admin(a), QUEUE, (2, 1, 3))
    wait_for_counts(admin(b), QUEUE, (2, 1, 3))
    consumer.connection.close()  # "2" goes back
    wait_for_counts(admin(a), QUEUE, (3, 0, 3))
    wait_for_counts(admin(b), QUEUE, (3, 0, 3))
    publishing.close()
