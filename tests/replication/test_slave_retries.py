"""A slave whose master's address cannot be looked up (Redis cut off just then, or its
connection closed under the call) keeps trying
instead of exiting (found by the nemesis run, seed 6: with the link to the master closed by
its 6 s user timeout, both slaves looked the address up in an unreachable Redis and exited on
the uncaught timeout, and the group could confirm nothing more)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.exceptions import TimeoutError as RedisTimeout

from storage.replication.member import ReplicationMember
from tests.replication.replicated import replicated_store

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


CLOSED = RuntimeError(
    "unable to perform operation on <TCPTransport closed=True reading=False 0x5>; "
    "the handler is closed"
)  # uvloop's answer when the Redis connection died under the call (nemesis seed 115)


@pytest.mark.parametrize(
    "error",
    [RedisTimeout("Timeout reading from 10.231.0.10:6379"), CLOSED],
    ids=["timeout", "closed"],
)
async def test_a_redis_failure_while_looking_up_the_master_is_retried(
    tmp_path: Path, error: Exception
) -> None:
    async with replicated_store(tmp_path, "1") as store:

        def no_connection(_address: str) -> Any:
            raise AssertionError("never reached: the address lookup fails first")

        member = ReplicationMember(store, None, "", no_connection)  # type: ignore[arg-type]
        lookups = 0

        async def unreachable(_master: str) -> str:
            nonlocal lookups
            lookups += 1
            raise error

        member._master_address = unreachable  # type: ignore[method-assign]
        member.following = ("0", 1)
        with anyio.move_on_after(1.0):
            await member._slave_forever()  # runs for ever: only the timeout ends it
        assert lookups >= 3  # tried again and again, 0.2 s apart, and still running


async def test_another_runtime_error_is_not_taken_for_a_lost_connection(tmp_path: Path) -> None:
    async with replicated_store(tmp_path, "1") as store:
        member = ReplicationMember(store, None, "", lambda _a: None)  # type: ignore[arg-type]

        async def broken(_master: str) -> str:
            raise RuntimeError("a bug")

        member._master_address = broken  # type: ignore[method-assign]
        member.following = ("0", 1)
        with pytest.raises(BaseExceptionGroup) as raised, anyio.move_on_after(1.0):
            await member._slave_forever()
        assert raised.group_contains(RuntimeError, match="a bug", depth=None)


async def test_failed_heartbeats_log_once_per_reason_and_once_when_answered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis away: a line when heartbeats start failing and one when the reason changes,
    not one every beat (five a second) for the whole outage; one when they are answered."""
    async with replicated_store(tmp_path, "1") as store:
        answers: list[Exception | None] = (
            [RedisTimeout("Timeout")] * 5
            + [ConnectionError("No master found for 'mymaster'")] * 5
            + [None]
        )

        class Link:
            async def heartbeat(self, *_args: object) -> tuple[None, None]:
                answer = answers.pop(0)
                if answer is not None:
                    raise answer
                return None, None

        member = ReplicationMember(store, Link(), "", lambda _a: None)  # type: ignore[arg-type]
        member._on_answer = lambda *_args: None  # type: ignore[method-assign]
        caplog.set_level("INFO", "mqgw.storage.replication")
        for _ in range(11):
            await member._beat()
        lines = [r.getMessage() for r in caplog.records if "heartbeat" in r.getMessage()]
        assert len(lines) == 3, lines
        assert "Timeout" in lines[0] and "No master found" in lines[1]
        assert lines[2] == "broker 1: heartbeats answered again after 10 failed"
