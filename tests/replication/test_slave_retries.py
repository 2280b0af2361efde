"""A slave whose master's address cannot be looked up (Redis cut off just then) keeps trying
instead of exiting (found by the nemesis run, seed 6: with the link to the master closed by
its 6 s user timeout, both slaves looked the address up in an unreachable Redis and exited on
the uncaught timeout, and the group could confirm nothing more)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.exceptions import TimeoutError as RedisTimeout

from storage.replication_member import ReplicationMember
from tests.replication.replicated import replicated_store

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def test_a_redis_timeout_while_looking_up_the_master_is_retried(tmp_path: Path) -> None:
    async with replicated_store(tmp_path, "1") as store:

        def no_connection(_address: str) -> Any:
            raise AssertionError("never reached: the address lookup fails first")

        member = ReplicationMember(store, None, "", no_connection)  # type: ignore[arg-type]
        lookups = 0

        async def unreachable(_master: str) -> str:
            nonlocal lookups
            lookups += 1
            raise RedisTimeout("Timeout reading from 10.231.0.10:6379")

        member._master_address = unreachable  # type: ignore[method-assign]
        member.following = ("0", 1)
        with anyio.move_on_after(1.0):
            await member._slave_forever()  # runs for ever: only the timeout ends it
        assert lookups >= 3  # tried again and again, 0.2 s apart, and still running
