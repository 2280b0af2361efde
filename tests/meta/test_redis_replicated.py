"""With Sentinel, a metadata change is answered only once a Redis failover cannot lose it
(meta/redis_replicated.py): a real master, replica and three sentinels
(tests/harness/sentinel.py), the replica's link to its master broken or the replica killed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from bench.processes import check_for
from meta.errors import MetadataUnavailable
from meta.redis_conn import RedisConnection
from meta.redis_replicated import no_replica_can_be_promoted
from meta.redis_store import RedisMetadataStore
from tests.harness.sentinel import Sentinels, sentinels
from tests.meta.builders import qdef

MASTER = {"runid": "m1", "flags": "master", "down-after-milliseconds": 1000}


def _replica(flags: str = "slave", link_down_ms: int = 0) -> dict[str, Any]:
    return {"flags": flags, "master-link-down-time": link_down_ms}


@pytest.mark.parametrize(
    ("master", "replicas", "safe"),
    [
        (MASTER, [_replica("slave,s_down")], True),  # the replica is dead
        (MASTER, [_replica("slave,disconnected")], True),
        (MASTER, [_replica(link_down_ms=10_001)], True),  # unlinked for longer than promotable
        (MASTER, [], True),
        (MASTER, [_replica()], False),  # up and linked: only its ack would do
        (MASTER, [_replica(link_down_ms=9_000)], False),  # unlinked lately: still promotable
        (MASTER, [_replica("slave,s_down"), _replica()], False),
        ({**MASTER, "runid": "m2"}, [], False),  # the sentinels follow another master
        ({**MASTER, "flags": "master,s_down"}, [], False),  # a failover may be coming
    ],
)
def test_a_write_no_replica_has_stands_only_where_none_could_be_promoted(
    master: dict[str, Any], replicas: list[dict[str, Any]], safe: bool
) -> None:
    assert no_replica_can_be_promoted("m1", [(master, replicas)]) is safe
    # Every sentinel that answered must agree.
    assert no_replica_can_be_promoted("m1", [(MASTER, []), (master, replicas)]) is safe


def _declare(deployment: Sentinels, name: str, bound_s: float) -> int:
    """Declares queue ``name``; returns the changes that stood with no replica."""

    async def main() -> int:
        store = RedisMetadataStore(deployment.url, prefix="r:", unavailable_timeout_s=bound_s)
        try:
            await store.declare_queue(qdef(name))
            return store.unreplicated_writes
        finally:
            await store.close()

    return anyio.run(main, backend="asyncio")


def test_a_declaration_is_answered_once_the_replica_has_it(tmp_path: Path) -> None:
    with sentinels(tmp_path) as deployment:
        assert _declare(deployment, "q", bound_s=5) == 0
        replica = redis.Redis(port=deployment.replica.port)
        try:  # at once: not "eventually"
            assert replica.exists("r:v:%2F:q:q") == 1, replica.keys("r:v:*")
        finally:
            replica.close()

        async def lost() -> None:
            """A change whose mark the master does not have (a failover lost it, or the
            connection reached a promoted replica without it) is never answered as made."""
            connection = RedisConnection(deployment.url, unavailable_timeout_s=2)
            try:
                assert connection.replicated is not None
                with pytest.raises(MetadataUnavailable, match="lost the change"):
                    await connection.replicated.confirm("r:written:never-made")
            finally:
                await connection.close()

        anyio.run(lost, backend="asyncio")


def test_a_replica_cut_off_from_its_master_holds_declarations_back(tmp_path: Path) -> None:
    """The replica is up for the sentinels but cannot follow its master (its credentials
    refused): a failover could promote it, so a declaration it lacks fails rather than being
    answered; once it follows again, the declaration goes through."""
    with sentinels(tmp_path) as deployment:
        master = redis.Redis(port=deployment.master.port)
        replica = redis.Redis(port=deployment.replica.port)
        try:
            master.execute_command("ACL", "SETUSER", "repl", "on", ">right", "+@all", "~*")
            replica.config_set("masteruser", "repl")
            replica.config_set("masterauth", "wrong")
            master.client_kill_filter(_type="replica")
            check_for(5, lambda: replica.info("replication")["master_link_status"] == "down")
            started = time.monotonic()
            with pytest.raises(MetadataUnavailable, match="reached no Redis replica"):
                _declare(deployment, "held", bound_s=1.5)
            assert time.monotonic() - started < 5
            replica.config_set("masterauth", "right")
            check_for(10, lambda: replica.info("replication")["master_link_status"] == "up")
            assert _declare(deployment, "held", bound_s=5) == 0
        finally:
            master.close()
            replica.close()


def test_with_the_replica_dead_declarations_go_on_once_the_sentinels_see_it_down(
    tmp_path: Path,
) -> None:
    with sentinels(tmp_path) as deployment:
        deployment.replica.stop()  # SIGKILL: nothing a failover could promote
        started = time.monotonic()
        assert _declare(deployment, "alone", bound_s=8) == 1
        took = time.monotonic() - started
        # The sentinels call it down after DOWN_AFTER_MS (1 s) without an answer.
        assert took < 6, f"took {took:.1f} s"

        async def two_more() -> float:
            store = RedisMetadataStore(deployment.url, prefix="r:", unavailable_timeout_s=8)
            try:
                await store.declare_queue(qdef("first"))
                started = time.monotonic()
                await store.declare_queue(qdef("second"))  # no WAIT for a dead replica
                return time.monotonic() - started
            finally:
                await store.close()

        second = anyio.run(two_more, backend="asyncio")
        assert second < 0.2, f"a change with the replica known dead took {second:.2f} s"
