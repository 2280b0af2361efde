"""LocalMetadataStore: RabbitMQ semantics, exact error texts, atomic persistence."""

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from meta.errors import (
    AccessRefused,
    CommandInvalid,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)
from meta.local_store import FILE_NAME, LocalMetadataStore
from meta.models import (
    BindingDef,
    ConsumptionControl,
    ExchangeDef,
    Permission,
    QueueDef,
    User,
    VHost,
)
from meta.password import hash_password

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def xdef(name: str, type_: str = "direct", **kw: Any) -> ExchangeDef:
    return ExchangeDef(vhost="/", name=name, type=type_, **kw)


def qdef(name: str, **kw: Any) -> QueueDef:
    return QueueDef(vhost="/", name=name, **kw)


def qbind(source: str, queue: str, key: str = "", **kw: Any) -> BindingDef:
    return BindingDef(
        vhost="/", source=source, destination=queue, destination_type="queue", routing_key=key, **kw
    )


def xbind(source: str, dest: str, key: str = "", **kw: Any) -> BindingDef:
    return BindingDef(
        vhost="/",
        source=source,
        destination=dest,
        destination_type="exchange",
        routing_key=key,
        **kw,
    )


# --- defaults -----------------------------------------------------------------


async def test_fresh_store_has_default_vhost_guest_and_predeclared_exchanges(
    tmp_path: Path,
) -> None:
    store = LocalMetadataStore(tmp_path)
    assert [v.name for v in await store.list_vhosts()] == ["/"]
    guest = await store.authenticate("guest", "guest")
    assert guest is not None and guest.is_administrator
    assert await store.authenticate("guest", "wrong") is None
    assert await store.get_permission("guest", "/") == Permission(user="guest", vhost="/")
    names = {x.name: x for x in await store.list_exchanges("/")}
    for name, type_ in [
        ("", "direct"),
        ("amq.direct", "direct"),
        ("amq.fanout", "fanout"),
        ("amq.topic", "topic"),
        ("amq.headers", "headers"),
        ("amq.match", "headers"),
    ]:
        assert names[name].type == type_ and names[name].durable
    assert names["amq.rabbitmq.trace"].internal


# --- persistence --------------------------------------------------------------


async def test_durable_entities_survive_reopen_transient_vanish(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.declare_exchange(xdef("dx", "topic", arguments={"alternate-exchange": "ae"}))
    await store.declare_exchange(xdef("tx", durable=False))
    await store.declare_queue(qdef("dq", arguments={"x-message-ttl": 5, "raw": b"\x00\x01"}))
    await store.declare_queue(qdef("tq", durable=False))
    await store.bind(qbind("dx", "dq", "a.#"))
    await store.bind(qbind("dx", "tq", "b.*"))  # transient end: not persisted
    await store.bind(qbind("tx", "dq", "k"))
    await store.bind(xbind("amq.direct", "dx", "e2e"))
    await store.add_vhost(VHost(name="other"))
    await store.put_user(User(name="bob", password_hash=hash_password("pw"), tags=("mgmt",)))
    await store.set_permission(Permission(user="bob", vhost="other", configure="^bob-.*"))

    reopened = LocalMetadataStore(tmp_path)
    assert await reopened.get_exchange("/", "dx") == await store.get_exchange("/", "dx")
    assert await reopened.get_exchange("/", "tx") is None
    dq = await reopened.get_queue("/", "dq")
    assert dq == await store.get_queue("/", "dq")
    assert dq is not None and dq.arguments["raw"] == b"\x00\x01"
    assert await reopened.get_queue("/", "tq") is None
    keys = sorted(
        (b.source, b.destination, b.routing_key) for b in await reopened.list_bindings("/")
    )
    assert keys == [("amq.direct", "dx", "e2e"), ("dx", "dq", "a.#")]
    assert await reopened.get_vhost("other") == VHost(name="other")
    assert await reopened.authenticate("bob", "pw") is not None
    permission = await reopened.get_permission("bob", "other")
    assert permission is not None and permission.configure == "^bob-.*"
    assert len(await reopened.list_exchanges("other")) == 7  # predeclared there too


async def test_deletions_are_persisted(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.declare_exchange(xdef("x"))
    await store.declare_queue(qdef("q"))
    await store.bind(qbind("x", "q", "k"))
    await store.unbind(qbind("x", "q", "k"))
    await store.delete_queue("/", "q")
    await store.delete_exchange("/", "x")
    reopened = LocalMetadataStore(tmp_path)
    assert await reopened.get_exchange("/", "x") is None
    assert await reopened.get_queue("/", "q") is None
    assert await reopened.list_bindings("/") == []


async def test_failed_write_leaves_previous_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.declare_queue(qdef("kept"))
    before = (tmp_path / FILE_NAME).read_bytes()

    def crash(self: Path, target: Path) -> None:
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(Path, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        await store.declare_queue(qdef("lost"))
    monkeypatch.undo()
    assert (tmp_path / FILE_NAME).read_bytes() == before
    json.loads(before)  # the surviving file is complete JSON
    reopened = LocalMetadataStore(tmp_path)
    assert await reopened.get_queue("/", "kept") is not None
    assert await reopened.get_queue("/", "lost") is None


async def test_queue_ids_are_never_reused(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    first = await store.declare_queue(qdef("q1"))
    transient = await store.declare_queue(qdef("t", durable=False))
    await store.delete_queue("/", "q1")
    # No clean close: the transient queue's id must not come back after a "crash" either.
    reopened = LocalMetadataStore(tmp_path)
    second = await reopened.declare_queue(qdef("q1"))
    assert second.queue_id not in (first.queue_id, transient.queue_id)
    assert second.queue_id > max(first.queue_id, transient.queue_id)
    again = LocalMetadataStore(tmp_path)
    third = await again.declare_queue(qdef("q3", durable=False))
    assert third.queue_id > second.queue_id


async def test_concurrent_durable_declares_all_persist(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    async with anyio.create_task_group() as tg:
        for i in range(40):
            tg.start_soon(store.declare_queue, qdef(f"q{i}"))
    reopened = LocalMetadataStore(tmp_path)
    queues = await reopened.list_queues("/")
    assert len(queues) == 40
    assert len({q.queue_id for q in queues}) == 40


# --- exchanges ----------------------------------------------------------------


async def test_exchange_equivalence_texts(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.declare_exchange(xdef("x", arguments={"alternate-exchange": "ae1"}))
    same = await store.declare_exchange(xdef("x", arguments={"alternate-exchange": "ae1"}))
    assert same.arguments == {"alternate-exchange": "ae1"}
    cases = [
        (
            xdef("x", "fanout"),
            "inequivalent arg 'type' for exchange 'x' in vhost '/': "
            "received 'fanout' but current is 'direct'",
        ),
        (
            xdef("x", durable=False),
            "inequivalent arg 'durable' for exchange 'x' in vhost '/': "
            "received 'false' but current is 'true'",
        ),
        (
            xdef("x", auto_delete=True),
            "inequivalent arg 'auto_delete' for exchange 'x' in "
            "vhost '/': received 'true' but current is 'false'",
        ),
        (
            xdef("x", internal=True),
            "inequivalent arg 'internal' for exchange 'x' in vhost '/': "
            "received 'true' but current is 'false'",
        ),
        (
            xdef("x", arguments={"alternate-exchange": "ae2"}),
            "inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': "
            "received 'ae2' but current is 'ae1'",
        ),
        (
            xdef("x"),
            "inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': "
            "received none but current is the value 'ae1' of type 'longstr'",
        ),
    ]
    for request, text in cases:
        with pytest.raises(PreconditionFailed) as info:
            await store.declare_exchange(request)
        assert info.value.detail == text
        assert info.value.reply_code == 406
    # Other arguments are not compared (RabbitMQ only checks alternate-exchange).
    await store.declare_exchange(xdef("x", arguments={"alternate-exchange": "ae1", "whatever": 1}))


async def test_exchange_reserved_default_and_unknown_type(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    with pytest.raises(AccessRefused) as refused:
        await store.declare_exchange(xdef("amq.custom"))
    assert refused.value.reply_text == (
        "ACCESS_REFUSED - exchange name 'amq.custom' contains reserved prefix 'amq.*'"
    )
    assert (await store.declare_exchange(xdef("amq.direct"))).name == "amq.direct"
    with pytest.raises(PreconditionFailed, match="received 'topic' but current is 'direct'"):
        await store.declare_exchange(xdef("amq.direct", "topic"))
    for passive in (False, True):
        with pytest.raises(AccessRefused) as default:
            await store.declare_exchange(xdef(""), passive=passive)
        assert default.value.detail == "operation not permitted on the default exchange"
    with pytest.raises(CommandInvalid) as unknown:
        await store.declare_exchange(xdef("x", "x-consistent-hash"))
    assert unknown.value.detail == "unknown exchange type 'x-consistent-hash'"
    with pytest.raises(PreconditionFailed) as bad_ae:
        await store.declare_exchange(
            xdef("y", arguments={"alternate-exchange": 5}),
        )
    assert bad_ae.value.detail == (
        "invalid type 'long' for arg 'alternate-exchange' in exchange 'y' in vhost '/'"
    )
    with pytest.raises(NotFound) as missing:
        await store.declare_exchange(xdef("nope"), passive=True)
    assert missing.value.reply_text == "NOT_FOUND - no exchange 'nope' in vhost '/'"


async def test_exchange_delete_rules(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    with pytest.raises(AccessRefused) as system:
        await store.delete_exchange("/", "amq.direct")
    assert system.value.detail == (
        "deletion of system exchange 'amq.direct' in vhost '/' not allowed"
    )
    with pytest.raises(AccessRefused, match="default exchange"):
        await store.delete_exchange("/", "")
    assert not await store.delete_exchange("/", "missing")  # ensure_deleted: fine
    await store.declare_exchange(xdef("x"))
    await store.declare_queue(qdef("q"))
    await store.bind(qbind("x", "q"))
    await store.bind(xbind("amq.fanout", "x"))
    with pytest.raises(PreconditionFailed) as in_use:
        await store.delete_exchange("/", "x", if_unused=True)
    assert in_use.value.detail == "exchange 'x' in vhost '/' in use"
    deleted = await store.delete_exchange("/", "x")
    assert [x.name for x in deleted.exchanges] == ["x"]
    assert {(b.source, b.destination) for b in deleted.bindings} == {
        ("x", "q"),
        ("amq.fanout", "x"),
    }
    assert await store.list_bindings("/") == []


async def test_auto_delete_exchange_cascades(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.declare_exchange(xdef("ad1", auto_delete=True))
    await store.declare_exchange(xdef("ad2", auto_delete=True))
    await store.declare_queue(qdef("q"))
    await store.bind(xbind("ad1", "ad2"))
    await store.bind(qbind("ad2", "q"))
    # Deleting q drops ad2's last binding -> ad2 goes -> ad1 loses its last binding -> goes.
    deleted = await store.delete_queue("/", "q")
    assert {x.name for x in deleted.exchanges} == {"ad1", "ad2"}
    assert await store.get_exchange("/", "ad1") is None
    await store.declare_exchange(xdef("ad3", auto_delete=True))
    assert await store.get_exchange("/", "ad3") is not None  # never bound: stays


# --- queues -------------------------------------------------------------------


async def test_queue_equivalence_texts(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    created = await store.declare_queue(qdef("q"))
    assert created.arguments == {"x-queue-type": "classic"}
    await store.declare_queue(qdef("q", arguments={"x-queue-type": "classic"}))
    cases = [
        (
            qdef("q", durable=False),
            "inequivalent arg 'durable' for queue 'q' in vhost '/': "
            "received 'false' but current is 'true'",
        ),
        (
            qdef("q", auto_delete=True),
            "inequivalent arg 'auto_delete' for queue 'q' in vhost "
            "'/': received 'true' but current is 'false'",
        ),
        (
            qdef("q", arguments={"x-queue-type": "quorum"}),
            "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': "
            "received 'quorum' but current is 'classic'",
        ),
        (
            qdef(
                "q",
                arguments={"x-message-ttl": 1000},
                argument_types={"x-message-ttl": "signedint"},
            ),
            "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
            "received the value '1000' of type 'signedint' but current is none",
        ),
    ]
    for request, text in cases:
        with pytest.raises(PreconditionFailed) as info:
            await store.declare_queue(request)
        assert info.value.detail == text
    # Arguments outside the queue type's list are not compared.
    await store.declare_queue(qdef("q", arguments={"x-custom": "ignored"}))


async def test_queue_argument_type_classes(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.declare_queue(
        qdef("q", arguments={"x-max-length": 10}, argument_types={"x-max-length": "short"})
    )
    # Same integer class, same value: equivalent although the width differs.
    await store.declare_queue(
        qdef("q", arguments={"x-max-length": 10}, argument_types={"x-max-length": "long"})
    )
    with pytest.raises(PreconditionFailed) as info:
        await store.declare_queue(qdef("q", arguments={"x-max-length": 11}))
    assert info.value.detail.endswith("received '11' but current is '10'")
    with pytest.raises(PreconditionFailed) as other_class:
        await store.declare_queue(qdef("q", arguments={"x-max-length": "10"}))
    assert other_class.value.detail.endswith("received '10' but current is '10'")


async def test_queue_names_passive_and_server_named(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    with pytest.raises(AccessRefused) as reserved:
        await store.declare_queue(qdef("amq.q"))
    assert reserved.value.detail == "queue name 'amq.q' contains reserved prefix 'amq.*'"
    with pytest.raises(NotFound) as missing:
        await store.declare_queue(qdef("nope"), passive=True)
    assert missing.value.detail == "no queue 'nope' in vhost '/'"
    generated = await store.declare_queue(qdef("", durable=False, exclusive_owner="c1"))
    assert generated.name.startswith("amq.gen-") and len(generated.name) == len("amq.gen-") + 22
    assert await store.declare_queue(qdef(generated.name), passive=True, connection_id="c1")
    with pytest.raises(AccessRefused):  # RabbitMQ refuses a non-passive redeclare by name
        await store.declare_queue(qdef(generated.name, exclusive_owner="c1"))
    with pytest.raises(PreconditionFailed) as quorum:
        await store.declare_queue(qdef("", arguments={"x-queue-type": "quorum"}))
    assert quorum.value.detail == "Cannot declare a server-named queue for type rabbit_quorum_queue"


async def test_exclusive_queues(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    queue = await store.declare_queue(qdef("ex", durable=True, exclusive_owner="conn-1"))
    assert not queue.durable  # exclusive queues are never durable
    locked_text = (
        "cannot obtain exclusive access to locked queue 'ex' in vhost '/'. It could be "
        "originally declared on another connection or the exclusive property value does "
        "not match that of the original declaration."
    )
    for attempt in (
        store.declare_queue(qdef("ex", exclusive_owner="conn-2")),
        store.declare_queue(qdef("ex")),
        store.declare_queue(qdef("ex"), passive=True, connection_id="conn-2"),
        store.delete_queue("/", "ex", connection_id="conn-2"),
        store.bind(qbind("amq.direct", "ex"), connection_id="conn-2"),
    ):
        with pytest.raises(ResourceLocked) as info:
            await attempt
        assert info.value.detail == locked_text and info.value.reply_code == 405
    await store.declare_queue(qdef("shared"))
    with pytest.raises(ResourceLocked):  # strict on redeclare: exclusive flag must match
        await store.declare_queue(qdef("shared", exclusive_owner="conn-1"))
    await store.bind(qbind("amq.direct", "ex", "k"), connection_id="conn-1")
    deleted = await store.delete_exclusive_queues("conn-1")
    assert [q.name for q in deleted.queues] == ["ex"]
    assert [b.routing_key for b in deleted.bindings] == ["k"]
    assert await store.get_queue("/", "ex") is None


# --- bindings -----------------------------------------------------------------


async def test_binding_errors_and_idempotence(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.declare_queue(qdef("q"))
    with pytest.raises(NotFound) as no_x:
        await store.bind(qbind("nox", "q"))
    assert no_x.value.detail == "no exchange 'nox' in vhost '/'"
    with pytest.raises(NotFound) as no_q:
        await store.bind(qbind("amq.direct", "noq"))
    assert no_q.value.detail == "no queue 'noq' in vhost '/'"
    with pytest.raises(NotFound) as both:
        await store.bind(qbind("nox", "noq"))
    assert both.value.detail == "no exchange 'nox' in vhost '/'"  # source reported first
    with pytest.raises(NotFound) as no_dest_x:
        await store.bind(xbind("amq.direct", "nox"))
    assert no_dest_x.value.detail == "no exchange 'nox' in vhost '/'"
    for binding in (qbind("", "q"), xbind("amq.direct", "")):
        with pytest.raises(AccessRefused) as default:
            await store.bind(binding)
        assert default.value.detail == "operation not permitted on the default exchange"
    assert await store.bind(qbind("amq.direct", "q", "k", arguments={"a": 1}))
    assert not await store.bind(qbind("amq.direct", "q", "k", arguments={"a": 1}))
    assert await store.bind(qbind("amq.direct", "q", "k", arguments={"a": 2}))
    assert len(await store.bindings_for("/", "amq.direct")) == 2
    assert not await store.unbind(qbind("amq.direct", "q", "other"))  # unknown: ok
    assert not await store.unbind(qbind("nox", "noq"))  # missing ends: ok
    removed = await store.unbind(qbind("amq.direct", "q", "k", arguments={"a": 1}))
    assert [b.arguments for b in removed.bindings] == [{"a": 1}]
    assert [b.arguments for b in await store.bindings_for("/", "amq.direct")] == [{"a": 2}]


async def test_binding_validation_by_exchange_type(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.declare_queue(qdef("q"))
    with pytest.raises(PreconditionFailed) as bad_value:
        await store.bind(qbind("amq.headers", "q", arguments={"x-match": "some"}))
    assert bad_value.value.detail == (
        'Invalid x-match field value <<"some">>; expected all, any, all-with-x, or any-with-x'
    )
    with pytest.raises(PreconditionFailed) as bad_type:
        await store.bind(
            qbind(
                "amq.headers",
                "q",
                arguments={"x-match": 1},
                argument_types={"x-match": "signedint"},
            )
        )
    assert bad_type.value.detail == (
        "Invalid x-match field type signedint (value 1); expected longstr"
    )
    await store.bind(qbind("amq.headers", "q", arguments={"x-match": "any-with-x"}))
    await store.bind(qbind("amq.topic", "q", "#.a.#"))
    with pytest.raises(PreconditionFailed) as hashes:
        await store.bind(qbind("amq.topic", "q", "#.#.#"))
    assert hashes.value.detail == (
        "Topic binding key '#.#.#' uses 3 '#' wildcards, at most 2 are allowed"
    )
    relaxed = LocalMetadataStore(tmp_path / "relaxed", max_topic_hash_wildcards=None)
    await relaxed.declare_queue(qdef("q"))
    await relaxed.bind(qbind("amq.topic", "q", "#.#.#"))


async def test_vhost_and_user_lifecycle(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.add_vhost(VHost(name="v"))
    await store.set_permission(Permission(user="guest", vhost="v"))
    await store.declare_queue(QueueDef(vhost="v", name="q"))
    deleted = await store.delete_vhost("v")
    assert [q.name for q in deleted.queues] == ["q"]
    assert await store.get_permission("guest", "v") is None
    with pytest.raises(Exception, match="vhost v not found"):
        await store.declare_queue(QueueDef(vhost="v", name="q"))
    assert await store.delete_user("guest")
    assert not await store.delete_user("guest")
    assert await store.list_permissions() == []
    assert await LocalMetadataStore(tmp_path).get_user("guest") is None


async def test_consumption_controls_persist_and_go_with_their_vhost(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.add_vhost(VHost(name="shop"))
    stop = ConsumptionControl(scope="queue", vhost="shop", name="orders", state="stopped")
    limit = ConsumptionControl(scope="client", name="billing", rate_msgs=200, set_by="adm")
    await store.put_control(stop)
    await store.put_control(limit)
    await store.put_control(limit.model_copy(update={"rate_msgs": 50.0}))  # replaces by key
    await store.close()

    reopened = LocalMetadataStore(tmp_path)
    controls = {c.key: c for c in await reopened.list_controls()}
    assert controls[("queue", "shop", "orders")].state == "stopped"
    assert controls[("client", "", "billing")].rate_msgs == 50.0
    assert await reopened.delete_control("client", "", "billing")
    assert not await reopened.delete_control("client", "", "billing")
    await reopened.delete_vhost("shop")
    assert await reopened.list_controls() == []
    assert await LocalMetadataStore(tmp_path).list_controls() == []


async def test_a_configured_node_has_no_guest(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path, default_user=False)
    assert await store.get_user("guest") is None
    assert [v.name for v in await store.list_vhosts()] == ["/"]


def test_a_rate_must_be_positive() -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError):
            ConsumptionControl(scope="global", rate_msgs=bad)
