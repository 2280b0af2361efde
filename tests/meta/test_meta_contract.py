"""The MetadataStore contract, part 1: exchanges, queues and bindings with RabbitMQ's rules
and texts (fixtures and what runs where: tests/meta/contract.py)."""

from __future__ import annotations

import anyio
import pytest

from meta.errors import (
    AccessRefused,
    CommandInvalid,
    NotAllowed,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)
from meta.models import Permission, VHost
from meta.store import MetadataStore
from tests.meta.builders import qbind, qdef, xbind, xdef
from tests.meta.contract import Stores

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend(combo: tuple[str, str]) -> str:
    return combo[1]


# --- defaults -----------------------------------------------------------------


async def test_fresh_store_has_default_vhost_guest_and_predeclared_exchanges(
    store: MetadataStore,
) -> None:
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


async def test_a_configured_node_has_no_guest(stores: Stores) -> None:
    store = stores.fresh(default_user=False)
    assert await store.get_user("guest") is None
    assert [v.name for v in await store.list_vhosts()] == ["/"]


async def test_retry_write_with_nothing_held_back_keeps_everything(stores: Stores) -> None:
    """The node calls retry_write every second on every store: with nothing kept in memory
    it must not fail, and what was written stays, as another handle reads it."""
    await stores.main.add_vhost(VHost(name="kept"))
    await stores.main.retry_write()
    await stores.main.retry_write()
    assert "kept" in {v.name for v in await stores.peer().list_vhosts()}


# --- exchanges ----------------------------------------------------------------


async def test_exchange_equivalence_texts(store: MetadataStore) -> None:
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


async def test_exchange_reserved_default_and_unknown_type(store: MetadataStore) -> None:
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
        await store.declare_exchange(xdef("y", arguments={"alternate-exchange": 5}))
    assert bad_ae.value.detail == (
        "invalid type 'long' for arg 'alternate-exchange' in exchange 'y' in vhost '/'"
    )
    with pytest.raises(NotFound) as missing:
        await store.declare_exchange(xdef("nope"), passive=True)
    assert missing.value.reply_text == "NOT_FOUND - no exchange 'nope' in vhost '/'"
    passive = await store.declare_exchange(xdef("amq.topic", "direct"), passive=True)
    assert passive.type == "topic"  # passive: the stored one, nothing compared


async def test_exchange_delete_rules(store: MetadataStore) -> None:
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
    assert deleted.touches_durable
    assert await store.list_bindings("/") == []
    assert await store.get_exchange("/", "x") is None
    assert "x" not in {x.name for x in await store.list_exchanges("/")}
    assert await store.get_queue("/", "q") is not None


async def test_auto_delete_exchange_cascades(store: MetadataStore) -> None:
    await store.declare_exchange(xdef("ad1", auto_delete=True))
    await store.declare_exchange(xdef("ad2", auto_delete=True))
    await store.declare_queue(qdef("q"))
    await store.bind(xbind("ad1", "ad2"))
    await store.bind(qbind("ad2", "q"))
    # Deleting q drops ad2's last binding -> ad2 goes -> ad1 loses its last binding -> goes.
    deleted = await store.delete_queue("/", "q")
    assert {x.name for x in deleted.exchanges} == {"ad1", "ad2"}
    assert {(b.source, b.destination) for b in deleted.bindings} == {("ad1", "ad2"), ("ad2", "q")}
    assert await store.get_exchange("/", "ad1") is None
    await store.declare_exchange(xdef("ad3", auto_delete=True))
    assert await store.get_exchange("/", "ad3") is not None  # never bound: stays
    await store.declare_queue(qdef("q1"))
    await store.declare_queue(qdef("q2"))
    await store.bind(qbind("ad3", "q1"))
    await store.bind(qbind("ad3", "q2"))
    assert not (await store.delete_queue("/", "q1")).exchanges  # ad3 still has a binding
    assert [x.name for x in (await store.delete_queue("/", "q2")).exchanges] == ["ad3"]


async def test_unbinding_the_last_binding_deletes_an_auto_delete_exchange(
    store: MetadataStore,
) -> None:
    await store.declare_exchange(xdef("up", auto_delete=True))
    await store.declare_exchange(xdef("ad", auto_delete=True))
    await store.declare_queue(qdef("q1"))
    await store.declare_queue(qdef("q2"))
    await store.bind(xbind("up", "ad"))
    await store.bind(qbind("ad", "q1"))
    await store.bind(qbind("ad", "q2"))
    first = await store.unbind(qbind("ad", "q1"))
    assert [b.destination for b in first.bindings] == ["q1"] and not first.exchanges
    second = await store.unbind(qbind("ad", "q2"))
    assert {x.name for x in second.exchanges} == {"ad", "up"}  # the cascade goes upstream
    assert await store.list_bindings("/") == []


# --- queues -------------------------------------------------------------------


async def test_queue_equivalence_texts(store: MetadataStore) -> None:
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


async def test_queue_argument_type_classes(store: MetadataStore) -> None:
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


async def test_queue_arguments_round_trip_with_their_types(store: MetadataStore) -> None:
    arguments = {"x-message-ttl": 5, "raw": b"\x00\x01", "nested": {"a": [1, "b"]}}
    declared = await store.declare_queue(
        qdef("q", arguments=arguments, argument_types={"x-message-ttl": "signedint"})
    )
    stored = await store.get_queue("/", "q")
    assert stored == declared
    assert stored is not None and stored.arguments["raw"] == b"\x00\x01"
    assert stored.argument_types == {"x-message-ttl": "signedint", "x-queue-type": "longstr"}


async def test_queue_names_passive_and_server_named(store: MetadataStore) -> None:
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


async def test_queue_ids_are_unique_and_never_reused(store: MetadataStore) -> None:
    first = await store.declare_queue(qdef("q1"))
    transient = await store.declare_queue(qdef("t", durable=False))
    assert (await store.declare_queue(qdef("q1"))).queue_id == first.queue_id  # redeclare
    await store.delete_queue("/", "q1")
    again = await store.declare_queue(qdef("q1"))
    assert again.queue_id > max(first.queue_id, transient.queue_id) > 0
    ids: list[int] = []

    async def declare(i: int) -> None:
        ids.append((await store.declare_queue(qdef(f"c{i}"))).queue_id)

    async with anyio.create_task_group() as tg:
        for i in range(30):
            tg.start_soon(declare, i)
    assert len(set(ids)) == 30 and min(ids) > again.queue_id


async def test_exclusive_queues(store: MetadataStore) -> None:
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
    with pytest.raises(ResourceLocked):  # checked once the binding exists
        await store.unbind(qbind("amq.direct", "ex", "k"), connection_id="conn-2")
    await store.declare_queue(qdef("other", exclusive_owner="conn-2"))
    deleted = await store.delete_exclusive_queues("conn-1")
    assert [q.name for q in deleted.queues] == ["ex"]
    assert [b.routing_key for b in deleted.bindings] == ["k"]
    assert await store.get_queue("/", "ex") is None
    assert await store.get_queue("/", "other") is not None
    assert not await store.delete_exclusive_queues("conn-1")  # nothing left
    # Without the check (an operator's delete) the owner does not matter.
    assert await store.delete_queue("/", "other", check_exclusive=False)


async def test_exclusive_queues_of_one_connection_in_several_vhosts(store: MetadataStore) -> None:
    await store.add_vhost(VHost(name="v2"))
    await store.declare_queue(qdef("a", exclusive_owner="gw/1"))
    await store.declare_queue(qdef("b", vhost="v2", exclusive_owner="gw/1"))
    deleted = await store.delete_exclusive_queues("gw/1")
    assert sorted((q.vhost, q.name) for q in deleted.queues) == [("/", "a"), ("v2", "b")]


async def test_names_with_separators_do_not_collide(store: MetadataStore) -> None:
    await store.add_vhost(VHost(name="a"))
    await store.add_vhost(VHost(name="a:q:b"))
    one = await store.declare_queue(qdef("b:q:c", vhost="a", arguments={"x-max-length": 1}))
    two = await store.declare_queue(qdef("c", vhost="a:q:b", arguments={"x-max-length": 2}))
    assert one.queue_id != two.queue_id
    assert [q.name for q in await store.list_queues("a")] == ["b:q:c"]
    assert [q.name for q in await store.list_queues("a:q:b")] == ["c"]


# --- bindings -----------------------------------------------------------------


async def test_binding_errors_and_idempotence(store: MetadataStore) -> None:
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
    assert await store.bindings_for("/", "nothing-bound") == []


async def test_binding_validation_by_exchange_type(stores: Stores) -> None:
    store = stores.main
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
    relaxed = stores.fresh(max_topic_hash_wildcards=None)
    await relaxed.declare_queue(qdef("q"))
    await relaxed.bind(qbind("amq.topic", "q", "#.#.#"))


async def test_listing_bindings_of_a_vhost(store: MetadataStore) -> None:
    await store.declare_exchange(xdef("x", "topic"))
    await store.declare_queue(qdef("q"))
    await store.bind(qbind("x", "q", "a.*"))
    await store.bind(qbind("amq.fanout", "q"))
    await store.bind(xbind("amq.direct", "x", "k"))
    listed = {(b.source, b.destination, b.routing_key) for b in await store.list_bindings("/")}
    assert listed == {("x", "q", "a.*"), ("amq.fanout", "q", ""), ("amq.direct", "x", "k")}
    for call in (store.list_bindings("nope"), store.bindings_for("nope", "x")):
        with pytest.raises(NotAllowed):
            await call
