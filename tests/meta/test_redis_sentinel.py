"""``--meta redis+sentinel://…``: the URL form, and the metadata store following a real
Sentinel failover (a master, a replica, three sentinels: tests/harness/sentinel.py).

What survives is what had reached the replica; the store answers a change only once the
replica has it (tests/meta/test_redis_replicated.py), which the test checks again with its
own WAIT before it kills the master."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
import redis

from meta.redis_store import RedisMetadataStore
from meta.redis_url import describe, parse_sentinel_url
from tests.harness.sentinel import sentinels
from tests.meta.builders import qdef


def test_the_sentinel_url_names_hosts_service_db_and_credentials() -> None:
    target = parse_sentinel_url("redis+sentinel://u:p%40ss@10.0.0.1,10.0.0.2:26380/mymaster/3")
    assert target is not None
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert (target.service, target.db) == ("mymaster", 3)
    assert (target.username, target.password) == ("u", "p@ss")
    assert target.sentinel_password is None
    only = parse_sentinel_url("redis+sentinel://h:1/m?sentinel_password=s")
    assert only is not None and only.db == 0 and only.sentinel_password == "s"
    assert parse_sentinel_url("redis://127.0.0.1:6379/0") is None
    # Logs never show the password.
    assert describe("redis+sentinel://u:secret@h:1,k:2/m/1") == "redis+sentinel://h:1,k:2/m/1"
    assert describe("redis://:secret@h:7000/2") == "redis://h:7000/2"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel:///mymaster", "without a sentinel host"),
        ("redis+sentinel://h:1", "/SERVICE"),
        ("redis+sentinel://h:1/m/x", "not a number"),
        ("redis+sentinel://h:port/m", "bad port"),
    ],
)
def test_a_sentinel_url_that_says_too_little_is_refused(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_sentinel_url(url)


@pytest.mark.slow  # 10 s; tests/cluster/test_redis_sentinel_failover.py runs by default
def test_the_store_follows_a_sentinel_failover(tmp_path: Path) -> None:
    with sentinels(tmp_path) as deployment:
        assert deployment.master_port() == deployment.master.port

        async def before() -> None:
            store = RedisMetadataStore(deployment.url, prefix="s:", unavailable_timeout_s=15)
            try:
                await store.declare_queue(qdef("before"))
            finally:
                await store.close()

        anyio.run(before, backend="asyncio")
        direct = redis.Redis(port=deployment.master.port)
        assert direct.wait(1, 5000) == 1  # on the replica too
        direct.close()

        async def after() -> float:
            store = RedisMetadataStore(deployment.url, prefix="s:", unavailable_timeout_s=15)
            try:
                assert await store.get_queue("/", "before") is not None
                deployment.master.stop()  # SIGKILL
                killed = time.monotonic()
                # The call waits out the failover inside the store's bound, then lands on
                # the promoted replica.
                await store.declare_queue(qdef("after"))
                took = time.monotonic() - killed
                names = {q.name for q in await store.list_queues("/")}
                assert {"before", "after"} <= names
                return took
            finally:
                await store.close()

        took = anyio.run(after, backend="asyncio")
        assert deployment.master_port() == deployment.replica.port
        assert took < 12, f"the write after the master's death took {took:.1f} s"
        print(f"metadata write waited {took:.2f} s across the Redis failover")
