"""Definitions (RabbitMQ 3.10's JSON format) without servers: parsing with paths in errors,
the all-or-nothing checks against a store, export shapes, and idempotent re-import."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from meta.definitions import DefinitionsError, parse_definitions, summary_text
from meta.definitions_checks import default_hashing_algorithm
from meta.definitions_export import export_definitions
from meta.definitions_plan import ImportPlan, plan_import
from meta.local_store import LocalMetadataStore
from meta.models import BindingDef, ExchangeDef, QueueDef, User
from meta.password import check_password, hash_password

pytestmark = pytest.mark.anyio

# A user exported by RabbitMQ 3.10.8 (rabbitmqctl add_user alice secret1).
ALICE = {
    "name": "alice",
    "password_hash": "739d5t7kzhONW1rylBGV2mu4juPxr46vTy+goABNqIJQd0WP",
    "hashing_algorithm": "rabbit_password_hashing_sha256",
    "tags": ["management", "monitoring"],
    "limits": {},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store(tmp_path: Path) -> LocalMetadataStore:
    return LocalMetadataStore(tmp_path)


def doc(**parts: Any) -> bytes:
    return json.dumps(parts).encode()


def queue(name: str, vhost: str = "/") -> dict[str, Any]:
    return {"name": name, "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}}


async def plan(store: LocalMetadataStore, body: bytes, vhost: str | None = None) -> ImportPlan:
    return await plan_import(parse_definitions(body), store, vhost=vhost)


def refused(excinfo: pytest.ExceptionInfo[DefinitionsError]) -> list[str]:
    return excinfo.value.errors


# --- parsing ---------------------------------------------------------------------------


def test_wrong_types_are_refused_with_their_place_in_the_file() -> None:
    body = doc(
        queues=[queue("a"), {"name": "b", "vhost": "/", "durable": "yes"}],
        users=[{"name": "u", "tags": 5}],
        bindings=[{"source": "x", "vhost": "/", "destination": "q", "destination_type": "q"}],
        policies=[{"name": "p", "vhost": "/", "pattern": ".", "definition": {}, "priority": "1"}],
    )
    with pytest.raises(DefinitionsError) as excinfo:
        parse_definitions(body)
    assert refused(excinfo) == [
        "users[0].tags: Value error, tags must be a string or a list of strings",
        "policies[0].priority: Input should be a valid integer",
        "queues[1].durable: Input should be a valid boolean",
        "bindings[0].destination_type: Input should be 'queue' or 'exchange'",
    ]


def test_not_json_or_not_an_object_is_refused_and_empty_is_nothing() -> None:
    for body in (b"{", b"[1, 2]", b"nope"):
        with pytest.raises(DefinitionsError, match="failed_to_parse_json"):
            parse_definitions(body)
    assert parse_definitions(b"  ").entity_count() == 0


def test_unknown_fields_are_ignored_and_old_shapes_accepted() -> None:
    parsed = parse_definitions(
        doc(
            some_future_field={"x": 1},
            users=[{"name": "u", "password_hash": "", "tags": "administrator, management"}],
            vhosts=[{"name": "v", "metadata": {"description": "d", "tags": "a,b"}, "z": 1}],
            queues=[{**queue("q"), "type": "classic", "arguments": None, "node": "rabbit@x"}],
        )
    )
    assert parsed.users[0].tags == ["administrator", "management"]
    assert parsed.vhosts[0].definition().description == "d"
    assert parsed.vhosts[0].definition().tags == ("a", "b")
    assert parsed.queues[0].arguments == {}


# --- passwords -------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["sha256", "sha512", "md5"])
def test_rabbitmq_hashing_modules_are_checked(algorithm: str) -> None:
    salt = bytes.fromhex("908DC60A")
    digest = hashlib.new(algorithm, salt + b"test12").digest()
    stored = base64.b64encode(salt + digest).decode()
    module = f"rabbit_password_hashing_{algorithm}"
    assert check_password("test12", stored, module)
    assert not check_password("test13", stored, module)
    assert hash_password("test12", salt=salt, algorithm=module) == stored


def test_users_without_an_algorithm_get_rabbitmqs_default_for_their_version() -> None:
    assert default_hashing_algorithm("3.5.7") == "rabbit_password_hashing_md5"
    assert default_hashing_algorithm("3.6.0") == "rabbit_password_hashing_sha256"
    assert default_hashing_algorithm(None) == "rabbit_password_hashing_sha256"


# --- checks against the state: all or nothing ------------------------------------------


async def test_a_valid_file_plans_everything_and_changes_nothing_yet(
    store: LocalMetadataStore,
) -> None:
    body = doc(
        users=[ALICE],
        vhosts=[{"name": "v"}],
        permissions=[{"user": "alice", "vhost": "v", "configure": ".*", "write": ".*", "read": ""}],
        policies=[{"vhost": "v", "name": "p", "pattern": "^q", "definition": {"max-length": 1}}],
        exchanges=[{"name": "x", "vhost": "v", "type": "topic"}],
        queues=[{**queue("q", "v"), "arguments": {"x-message-ttl": 1000}}],
        bindings=[
            {"source": "x", "vhost": "v", "destination": "q", "destination_type": "queue"},
            {
                "source": "amq.topic",
                "vhost": "v",
                "destination": "x",
                "destination_type": "exchange",
            },
        ],
        topic_permissions=[{"user": "alice", "vhost": "v", "exchange": "amq.topic"}],
    )
    result = await plan(store, body)
    assert result.changes == 8
    assert result.ignored == {"topic_permissions": 1}
    assert [q.arguments for q in result.queues] == [
        {"x-message-ttl": 1000, "x-queue-type": "classic"}
    ]
    assert result.users[0].password_hash == ALICE["password_hash"]
    assert await store.get_vhost("v") is None and await store.get_user("alice") is None
    assert summary_text(result.summary()).startswith("vhosts 1 created, 0 present; users 1")


async def test_every_problem_is_named_and_nothing_is_planned(store: LocalMetadataStore) -> None:
    await store.declare_queue(QueueDef(vhost="/", name="kept", durable=True))
    body = doc(
        users=[
            {**ALICE, "hashing_algorithm": "rabbit_password_hashing_bcrypt"},
            {"name": "b", "password_hash": "!!"},
            {"name": "c", "password_hash": ALICE["password_hash"], "password": "x"},
        ],
        permissions=[
            {"user": "nobody", "vhost": "/", "configure": "", "write": "", "read": ""},
            {"user": "guest", "vhost": "/", "configure": "(", "write": "", "read": ""},
        ],
        queues=[
            {**queue("bad"), "arguments": {"x-max-length": -1}},
            {**queue("kept"), "durable": False},
            queue("q", "nowhere"),
        ],
        exchanges=[{"name": "x", "vhost": "/", "type": "x-unknown"}],
    )
    with pytest.raises(DefinitionsError) as excinfo:
        await plan(store, body)
    assert refused(excinfo) == [
        "users[0].hashing_algorithm: unsupported hashing algorithm "
        "'rabbit_password_hashing_bcrypt' (supported: rabbit_password_hashing_md5, "
        "rabbit_password_hashing_sha256, rabbit_password_hashing_sha512)",
        "users[1].password_hash: not valid base64",
        "users[2]: both_password_and_password_hash_are_provided",
        "permissions[0]: no user 'nobody' (not on the node, not in the file)",
        "permissions[1].configure: invalid regular expression '(': missing ), unterminated "
        "subpattern at position 0",
        "exchanges[0].type: unknown exchange type 'x-unknown'",
        "queues[0]: invalid arg 'x-max-length' for queue 'bad' in vhost '/': {value_negative,-1}",
        "queues[1]: inequivalent arg 'durable' for queue 'kept' in vhost '/': "
        "received 'false' but current is 'true'",
        "queues[2]: no vhost 'nowhere' (not on the node, not in the file)",
    ]


async def test_bindings_are_checked_and_missing_ends_skipped_as_rabbitmq_does(
    store: LocalMetadataStore,
) -> None:
    def bind(source: str, dest: str, kind: str = "queue") -> dict[str, Any]:
        return {"source": source, "vhost": "/", "destination": dest, "destination_type": kind}

    body = doc(
        exchanges=[{"name": "h", "vhost": "/", "type": "headers"}],
        queues=[queue("q")],
        bindings=[
            {**bind("h", "q"), "arguments": {"x-match": "some"}},
            bind("", "q"),
            bind("h", "gone"),  # rabbitmqctl exports bindings of exclusive queues
        ],
    )
    with pytest.raises(DefinitionsError) as excinfo:
        await plan(store, body)
    assert refused(excinfo) == [
        'bindings[0]: Invalid x-match field value <<"some">>; '
        "expected all, any, all-with-x, or any-with-x",
        "bindings[1]: operation not permitted on the default exchange",
    ]
    ok = json.loads(body)
    ok["bindings"] = ok["bindings"][2:]
    result = await plan(store, json.dumps(ok).encode())
    assert result.counts["bindings"]["skipped"] == 1
    assert result.warnings == ["bindings[0]: no queue 'gone' in vhost '/': binding skipped"]


async def test_reserved_names_are_skipped_like_rabbitmq(store: LocalMetadataStore) -> None:
    body = doc(
        exchanges=[{"name": "amq.x", "vhost": "/", "type": "direct"}],
        queues=[queue("amq.q")],
    )
    result = await plan(store, body)
    assert result.changes == 0
    assert result.counts["exchanges"]["skipped"] == result.counts["queues"]["skipped"] == 1


async def test_own_export_plans_no_change(store: LocalMetadataStore) -> None:
    await store.put_user(User(name="u", password_hash=hash_password("p"), tags=("management",)))
    await store.declare_exchange(ExchangeDef(vhost="/", name="x", type="fanout"))
    await store.declare_exchange(ExchangeDef(vhost="/", name="tmp", type="fanout", durable=False))
    await store.declare_queue(QueueDef(vhost="/", name="q", arguments={"x-max-length": 3}))
    await store.declare_queue(QueueDef(vhost="/", name="t", durable=False))
    await store.declare_queue(QueueDef(vhost="/", name="e", exclusive_owner="c1"))
    for source, dest in (("x", "q"), ("x", "t"), ("x", "e"), ("tmp", "q"), ("amq.direct", "q")):
        await store.bind(
            BindingDef(vhost="/", source=source, destination=dest, destination_type="queue"),
            connection_id="c1",
        )
    exported = await export_definitions(store)
    assert list(exported) == [
        "rabbit_version", "rabbitmq_version", "product_name", "product_version", "users",
        "vhosts", "permissions", "topic_permissions", "parameters", "global_parameters",
        "policies", "queues", "exchanges", "bindings",
    ]  # fmt: skip
    assert [q["name"] for q in exported["queues"]] == ["q"]  # durable, not exclusive
    assert [x["name"] for x in exported["exchanges"]] == ["x"]  # durable, not amq.*
    assert [(b["source"], b["destination"]) for b in exported["bindings"]] == [
        ("amq.direct", "q"),
        ("x", "q"),
    ]
    assert list(exported["exchanges"][0]) == [
        "name", "vhost", "type", "durable", "auto_delete", "internal", "arguments",
    ]  # fmt: skip
    result = await plan(store, json.dumps(exported).encode())
    assert result.changes == 0
    assert result.counts["queues"]["present"] == 1
    assert result.counts["users"]["present"] == 2


async def test_a_clear_text_password_is_hashed_and_compared_by_checking(
    store: LocalMetadataStore,
) -> None:
    body = doc(users=[{"name": "guest", "password": "guest", "tags": ["administrator"]}])
    assert (await plan(store, body)).counts["users"]["present"] == 1
    body = doc(users=[{"name": "guest", "password": "other", "tags": ["administrator"]}])
    result = await plan(store, body)
    assert result.counts["users"]["updated"] == 1
    assert check_password("other", result.users[0].password_hash)


async def test_per_vhost_import_puts_everything_in_that_vhost(store: LocalMetadataStore) -> None:
    body = doc(
        users=[ALICE],
        queues=[{"name": "q", "durable": True}],
        policies=[{"name": "p", "pattern": ".", "definition": {}, "vhost": "elsewhere"}],
    )
    result = await plan(store, body, vhost="/")
    assert result.ignored == {"users": 1}
    assert [(q.vhost, q.name) for q in result.queues] == [("/", "q")]
    assert [p.vhost for p in result.policies] == ["/"]
    exported = await export_definitions(store, "/")
    assert list(exported) == [
        "rabbit_version", "parameters", "policies", "queues", "exchanges", "bindings",
    ]  # fmt: skip
