"""Who may log in from where: guest is loopback-only, as in RabbitMQ."""

from __future__ import annotations

import pytest

from gateway.sessions.handshake import _is_loopback


@pytest.mark.parametrize(
    ("peer", "loopback"),
    [
        ("127.0.0.1:5555", True),
        ("127.4.5.6:1", True),
        ("[::1]:5555", True),
        ("::1:5555", True),
        ("10.0.0.7:5555", False),
        ("192.168.1.2:40000", False),
        ("[2001:db8::1]:5672", False),
        ("128.0.0.1:80", False),
    ],
)
def test_loopback_peers(peer: str, loopback: bool) -> None:
    assert _is_loopback(peer) is loopback
