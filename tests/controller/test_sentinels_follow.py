"""With Sentinel, a controller writes decisions only on the Redis the sentinels follow
(controller/service.py, meta/redis_replicated.py ``sentinels_follow``).

Nemesis seed 140: the Redis master was cut off, the sentinels promoted its replica, and one
controller elected broker 1 at epoch 2 there. The old master, healed, still took writes until
the sentinels demoted it; the other controller, connected to it, elected broker 2 at epoch 2,
and brokers that reached it followed. Here a real deployment (a master, a replica, three
sentinels) and a standalone redis-server stand for that old master: a controller on it elects
nobody, the same controller on the followed master elects at once.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from redis.asyncio import Redis

from controller.service import ControllerService
from meta.groups.keys import ControllerKeys
from meta.groups.link import GroupLink
from meta.groups.timing import ControllerConfig
from meta.redis_replicated import Replicated, master_followed
from meta.redis_url import parse_sentinel_url
from tests.controller.fakes import FakeBroker, wait_for
from tests.harness.redis_server import RedisServer
from tests.harness.sentinel import sentinels

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]
CONFIG = ControllerConfig()


@pytest.mark.parametrize(
    ("answers", "followed"),
    [
        ([{"runid": "r1", "flags": "master"}], True),
        ([{"runid": "r1", "flags": "master"}, {"runid": "r2", "flags": "master"}], False),
        ([{"runid": "r1", "flags": "master,s_down"}], False),  # a failover may be coming
        ([{"runid": "r2", "flags": "master"}], False),  # they promoted another
    ],
)
async def test_the_master_is_followed_when_every_answer_names_it_up(
    answers: list[dict[str, str]], followed: bool
) -> None:
    assert master_followed("r1", [(answer, []) for answer in answers]) is followed


async def _elects(port: int, url: str) -> bool:
    """Runs a controller on the redis-server at ``port`` (sentinels of ``url`` asked) with a
    group whose broker asks for its first master; whether it was elected within 4 s."""
    target = parse_sentinel_url(url)
    assert target is not None
    client = Redis(port=port, decode_responses=True, protocol=2)
    replicated = Replicated.for_target(client, target, 1.0)
    service = ControllerService(client, "c1", CONFIG, ControllerKeys(), replicated.sentinels_follow)
    broker = FakeBroker(GroupLink(client), "g1", "a").start()
    stop = asyncio.Event()
    running = asyncio.create_task(service.run(stop))
    try:
        await wait_for("a master", lambda: broker.role == "master", 4)
        return True
    except TimeoutError:
        return False
    finally:
        stop.set()
        await running
        await broker.stop()
        await replicated.close()
        await client.aclose()


async def test_a_controller_elects_only_on_the_redis_the_sentinels_follow(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mqgw.controller")
    with sentinels(tmp_path / "deployment") as deployment, RedisServer(tmp_path / "old") as old:
        assert not await _elects(old.port, deployment.url)
        assert "not written: the sentinels do not follow this Redis" in caplog.text
        caplog.clear()
        assert await _elects(deployment.master.port, deployment.url)
        assert "the sentinels do not follow" not in caplog.text
