"""Unit tests of the admin API's authentication rules (a fake node; the real gateway's 401/403
matrix is in tests/compat/test_admin_api.py)."""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace

import pytest
from fastapi import HTTPException, Request

from gateway.admin.auth import authenticate, basic_credentials, granted, is_loopback, requires
from gateway.queues.rate_limit import Limits, TokenBucket
from meta.models import User


def _request(client_host: str, authorization: str | None) -> Request:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    scope = {"type": "http", "headers": headers, "client": (client_host, 50000), "method": "GET"}
    return Request(scope)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class _FakeUsers:
    """The node's users (gateway/node/users.py) as the admin API asks them."""

    def __init__(self, *users: User) -> None:
        self.users = {u.name: u for u in users}

    async def authenticate(self, name: str, password: bytes) -> User | None:
        user = self.users.get(name)
        return user if user is not None and password == b"right" else None


def _node(*users: User) -> SimpleNamespace:
    return SimpleNamespace(
        users=_FakeUsers(*users), settings=SimpleNamespace(loopback_users=["guest"])
    )


GUEST = User(name="guest", password_hash="", tags=("administrator",))
BOB = User(name="bob", password_hash="", tags=("monitoring",))
NOBODY = User(name="nobody", password_hash="", tags=())


def _status(node: SimpleNamespace, request: Request, tag: str = "management") -> int:
    try:
        asyncio.run(requires(tag, node)(request))  # type: ignore[arg-type]
    except HTTPException as error:
        return error.status_code
    return 200


def test_loopback_only_users_are_refused_from_other_addresses() -> None:
    node = _node(GUEST, BOB)
    assert _status(node, _request("127.0.0.1", _basic("guest", "right"))) == 200
    assert _status(node, _request("::1", _basic("guest", "right"))) == 200
    assert _status(node, _request("10.1.2.3", _basic("guest", "right"))) == 401
    assert _status(node, _request("10.1.2.3", _basic("bob", "right"))) == 200


def test_credentials_tags_and_statuses() -> None:
    node = _node(GUEST, BOB, NOBODY)
    assert _status(node, _request("127.0.0.1", None)) == 401
    assert _status(node, _request("127.0.0.1", _basic("bob", "wrong"))) == 401
    assert _status(node, _request("127.0.0.1", "Bearer abc")) == 401
    assert _status(node, _request("127.0.0.1", _basic("nobody", "right"))) == 403
    assert _status(node, _request("127.0.0.1", _basic("bob", "right")), "administrator") == 403
    assert _status(node, _request("127.0.0.1", _basic("bob", "right")), "monitoring") == 200
    with pytest.raises(HTTPException) as missing:
        asyncio.run(authenticate(_request("127.0.0.1", None), node))  # type: ignore[arg-type]
    assert missing.value.headers == {"WWW-Authenticate": 'Basic realm="mqgw management"'}


def test_parsing_helpers() -> None:
    assert basic_credentials(_basic("a", "b:c")) == ("a", "b:c")  # a password may hold ':'
    assert basic_credentials("Basic !!!") is None
    assert basic_credentials("Basic " + base64.b64encode(b"no-colon").decode()) is None
    assert is_loopback("127.9.9.9") and is_loopback("[::1]") and not is_loopback("192.168.1.1")
    assert granted(GUEST) >= {"management", "policymaker", "monitoring", "administrator"}
    assert granted(User(name="p", password_hash="", tags=("policymaker",))) == {
        "management",
        "policymaker",
    }


def test_limits_need_every_bucket_and_bytes_may_go_into_debt() -> None:
    now = [0.0]
    msgs = TokenBucket(10, 0.0)  # burst 1
    size = TokenBucket(1000, 0.0)  # burst 100 bytes
    limits = Limits((msgs,), (size,), lambda: now[0])
    assert limits.ready()
    limits.take(500)  # a body larger than the byte burst still goes ...
    assert not limits.ready()
    # ... and the debt is paid back first (with 5 ms of bytes: a wake-up gathers a few)
    assert limits.next_at() == pytest.approx(0.405)
    now[0] = 0.41
    assert limits.ready()


def test_a_fast_bucket_wakes_for_a_batch_of_tokens_not_each_one() -> None:
    fast = TokenBucket(20_000, 0.0)  # burst 2,000
    fast.take(2_000, 0.0)
    # 100 tokens (5 ms), not the first one 50 µs later: one scheduler turn per 100 messages
    assert fast.next_token_at(0.0) == pytest.approx(0.005)
    fast.take(int(fast.available(0.005)), 0.005)  # the 100 were there, and all go
    assert fast.spent == 2_100
    slow = TokenBucket(100, 0.0)
    slow.take(10, 0.0)
    assert slow.next_token_at(0.0) == pytest.approx(0.01)  # below 200/s: each token
