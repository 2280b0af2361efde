"""Permission decisions (gateway/sessions/access.py) as rabbit_auth_backend_internal makes them."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from gateway.amqp.errors import AccessRefused
from gateway.sessions.access import Access, CompiledPermission, Grants
from meta.local_store import LocalMetadataStore
from meta.models import Permission, User


def _permission(configure: str = ".*", write: str = ".*", read: str = ".*") -> CompiledPermission:
    return CompiledPermission.of(
        Permission(user="u", vhost="/", configure=configure, write=write, read=read)
    )


@pytest.mark.parametrize(
    ("regex", "name", "allowed"),
    [
        ("", "anything", False),  # "" is "^$"
        ("^$", "anything", False),
        (".*", "q", True),
        ("q", "my-q-1", True),  # re:run searches, unanchored
        ("^q$", "q\n", True),  # PCRE's $ matches before a final newline, as Python's
        ("^.$", "é", False),  # bytes, as re:run on a binary without 'unicode'
        ("^..$", "é", True),
        ("^amq\\.default$", "", True),  # the default exchange is checked as amq.default
    ],
)
def test_regex_semantics(regex: str, name: str, allowed: bool) -> None:
    grants = Grants("u", "/", _permission(write=regex))
    assert grants.check("write", name) is allowed
    assert grants.write[name] is allowed  # cached: the publish path reads this dict


def test_refusal_text_and_no_permission() -> None:
    grants = Grants("u", "/", None)
    with pytest.raises(AccessRefused) as refused:
        grants.require("write", "exchange", "", 60, 40)
    error = refused.value
    assert (error.reply_code, error.class_id, error.method_id) == (403, 60, 40)
    assert error.reply_text == (
        "ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user 'u'"
    )


def test_changes_reach_grants_already_handed_out(tmp_path: Path) -> None:
    async def main() -> None:
        meta = LocalMetadataStore(tmp_path)
        await meta.put_user(User(name="u", password_hash=""))
        access = Access(meta)
        await access.load()
        grants = access.grants("u", "/")
        assert not access.may_use_vhost("u", "/") and not grants.check("read", "q")
        await access.set_permission(Permission(user="u", vhost="/", read="^q$"))
        assert access.grants("u", "/") is grants
        assert grants.check("read", "q") and not grants.check("read", "r")
        await access.set_permission(Permission(user="u", vhost="/", read="^r$"))
        assert not grants.check("read", "q") and grants.check("read", "r")
        await access.clear_permission("u", "/")
        assert not grants.check("read", "r") and not access.may_use_vhost("u", "/")
        await access.set_permission(Permission(user="u", vhost="/"))
        await access.delete_user("u")
        assert not grants.check("read", "r")

    anyio.run(main)
