"""The MetadataStore contract, part 2: vhosts, users, permissions, policies, consumption
controls and the change feed (fixtures and what runs where: tests/meta/contract.py)."""

from __future__ import annotations

import itertools
from contextlib import aclosing

import anyio
import pytest

from meta.change_feed import Change, ChangeEvent, Reload
from meta.errors import NotAllowed
from meta.models import (
    ConsumptionControl,
    ExchangeDef,
    Permission,
    Policy,
    QueueDef,
    User,
    VHost,
)
from meta.password import hash_password
from meta.store import MetadataStore
from tests.meta.builders import changes_until, next_events, qbind, qdef, xdef
from tests.meta.contract import Stores

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend(combo: tuple[str, str]) -> str:
    return combo[1]


# --- vhosts, users, permissions, policies, controls ---------------------------


async def test_vhost_and_user_lifecycle(stores: Stores) -> None:
    store = stores.main
    await store.add_vhost(VHost(name="v", description="first"))
    await store.add_vhost(VHost(name="v", description="again"))  # idempotent: kept as is
    assert await store.get_vhost("v") == VHost(name="v", description="first")
    assert len(await store.list_exchanges("v")) == 7  # predeclared there too
    await store.set_permission(Permission(user="guest", vhost="v"))
    await store.declare_queue(QueueDef(vhost="v", name="q"))
    await store.declare_exchange(ExchangeDef(vhost="v", name="x", type="fanout"))
    deleted = await store.delete_vhost("v")
    assert [q.name for q in deleted.queues] == ["q"]
    assert "x" in {x.name for x in deleted.exchanges}
    assert await store.get_vhost("v") is None
    assert await store.get_permission("guest", "v") is None
    assert not await store.delete_vhost("v")  # gone already: nothing deleted
    with pytest.raises(NotAllowed, match="vhost v not found"):
        await store.declare_queue(QueueDef(vhost="v", name="q"))
    for call in (store.list_queues("v"), store.list_exchanges("v")):
        with pytest.raises(NotAllowed):
            await call
    await store.add_vhost(VHost(name="v"))  # a vhost comes back empty
    assert await store.list_queues("v") == []
    assert await store.delete_user("guest")
    assert not await store.delete_user("guest")
    assert await store.list_permissions() == []
    assert await stores.peer().get_user("guest") is None


async def test_users_and_authentication(store: MetadataStore) -> None:
    bob = User(name="bob", password_hash=hash_password("pw"), tags=("management",))
    await store.put_user(bob)
    assert await store.get_user("bob") == bob
    assert await store.authenticate("bob", "pw") == bob
    assert await store.authenticate("bob", "nope") is None
    assert await store.authenticate("nobody", "pw") is None
    replaced = bob.model_copy(update={"password_hash": hash_password("new")})
    await store.put_user(replaced)
    assert await store.authenticate("bob", "pw") is None
    assert await store.authenticate("bob", "new") is not None
    assert {u.name for u in await store.list_users()} == {"guest", "bob"}


async def test_permissions(store: MetadataStore) -> None:
    await store.add_vhost(VHost(name="other"))
    bob = Permission(user="bob", vhost="other", configure="^bob-.*", write=".*", read="^$")
    await store.set_permission(bob)
    assert await store.get_permission("bob", "other") == bob
    await store.set_permission(bob.model_copy(update={"read": ".*"}))  # replaces
    assert [p.read for p in await store.list_permissions("other")] == [".*"]
    assert len(await store.list_permissions()) == 2  # guest on "/" too
    with pytest.raises(NotAllowed, match="vhost missing not found"):
        await store.set_permission(Permission(user="bob", vhost="missing"))
    await store.clear_permission("bob", "other")
    await store.clear_permission("bob", "other")  # already gone: fine
    assert await store.get_permission("bob", "other") is None


async def test_policies(store: MetadataStore) -> None:
    await store.add_vhost(VHost(name="shop"))
    ttl = Policy(vhost="/", name="ttl", pattern="^t\\.", definition={"message-ttl": 5}, priority=1)
    cap = Policy(vhost="shop", name="cap", pattern=".*", definition={"max-length": 9})
    await store.put_policy(ttl)
    await store.put_policy(cap)
    assert await store.list_policies("/") == [ttl]
    assert {p.name for p in await store.list_policies()} == {"ttl", "cap"}
    with pytest.raises(NotAllowed):
        await store.put_policy(ttl.model_copy(update={"vhost": "missing"}))
    assert await store.delete_policy("/", "ttl")
    assert not await store.delete_policy("/", "ttl")
    await store.delete_vhost("shop")  # policies go with their vhost
    assert await store.list_policies() == []


async def test_consumption_controls_replace_by_key_and_go_with_their_vhost(
    stores: Stores,
) -> None:
    store = stores.main
    await store.add_vhost(VHost(name="shop"))
    stop = ConsumptionControl(scope="queue", vhost="shop", name="orders", state="stopped")
    limit = ConsumptionControl(scope="client", name="billing", rate_msgs=200, set_by="adm")
    await store.put_control(stop)
    await store.put_control(limit)
    await store.put_control(limit.model_copy(update={"rate_msgs": 50.0}))  # replaces by key
    controls = {c.key: c for c in await stores.peer().list_controls()}
    assert controls[("queue", "shop", "orders")].state == "stopped"
    assert controls[("client", "", "billing")].rate_msgs == 50.0
    assert await store.delete_control("client", "", "billing")
    assert not await store.delete_control("client", "", "billing")
    await store.delete_vhost("shop")
    assert await store.list_controls() == []


# --- change feed --------------------------------------------------------------


async def test_a_second_instance_follows_every_change(stores: Stores) -> None:
    store, peer = stores.main, stores.peer()
    position = await peer.change_position()
    async with aclosing(peer.follow(position)) as feed:
        await store.declare_exchange(xdef("x", "topic"))
        await store.declare_queue(qdef("q"))
        await store.declare_queue(qdef("q"))  # no change: nothing new
        await store.bind(qbind("x", "q", "a.#"))
        await store.delete_exchange("/", "x")  # cascade: the binding, then the exchange
        await store.put_user(User(name="bob", password_hash=hash_password("pw")))
        await store.delete_user("bob")
        seen = await changes_until(feed, ("user.deleted", "bob"))
    assert [(c.kind, c.vhost, c.name) for c in seen] == [
        ("exchange.declared", "/", "x"),
        ("queue.declared", "/", "q"),
        ("binding.added", "/", "x"),
        ("binding.removed", "/", "x"),
        ("exchange.deleted", "/", "x"),
        ("user.put", "", "bob"),
        ("user.deleted", "", "bob"),
    ]
    queue = seen[1].entity()
    assert isinstance(queue, QueueDef) and queue == await store.get_queue("/", "q")
    assert len({c.id for c in seen}) == len(seen)


async def test_follow_without_an_id_skips_older_changes_and_ids_resume(stores: Stores) -> None:
    store, peer = stores.main, stores.peer()
    await store.declare_queue(qdef("before"))
    got: list[ChangeEvent] = []
    async with aclosing(peer.follow()) as feed, anyio.create_task_group() as tg:

        async def first_event() -> None:
            got.append(await anext(feed))

        tg.start_soon(first_event)
        # None means "from the follower's first read", which this task cannot observe:
        # keep declaring until the follower has seen one.
        with anyio.fail_after(2):
            for i in itertools.count():
                await store.declare_queue(qdef(f"after{i}"))
                if got:
                    break
                await anyio.sleep(0.01)
    (first,) = got
    assert isinstance(first, Change) and first.name.startswith("after")
    await store.declare_queue(qdef("later"))
    async with aclosing(peer.follow(first.id)) as feed:  # resume after what was seen
        events = await changes_until(feed, ("queue.declared", "later"))
    assert all(e.name != "before" and e.name != first.name for e in events)


async def test_vhost_changes_carry_their_contents(stores: Stores) -> None:
    store, peer = stores.main, stores.peer()
    position = await peer.change_position()
    async with aclosing(peer.follow(position)) as feed:
        await store.add_vhost(VHost(name="v"))
        await store.set_permission(Permission(user="guest", vhost="v"))
        await store.declare_queue(qdef("q", vhost="v"))
        await store.delete_vhost("v")
        seen = await changes_until(feed, ("vhost.deleted", "v"))
    kinds = [c.kind for c in seen]
    assert kinds[:8] == ["vhost.added"] + ["exchange.declared"] * 7
    assert kinds[8:11] == ["permission.set", "queue.declared", "queue.deleted"]
    assert kinds.count("exchange.deleted") == 7
    assert kinds[-2:] == ["permission.cleared", "vhost.deleted"]


async def test_a_follower_behind_the_trimmed_feed_reloads(stores: Stores) -> None:
    store = stores.fresh(change_feed_max_len=100)
    position = await store.change_position()
    for i in range(400):
        await store.put_control(ConsumptionControl(scope="node", name=f"n{i}", state="stopped"))
    async with aclosing(store.follow(position)) as feed:
        (reload,) = await next_events(feed, 1)
        assert isinstance(reload, Reload)
        assert "trimmed" in reload.reason
        assert reload.position == await store.change_position()
        await store.delete_control("node", "", "n0")
        (after,) = await next_events(feed, 1)
    assert isinstance(after, Change) and after.kind == "control.deleted"


async def test_a_follower_close_to_the_head_of_a_trimmed_feed_does_not_reload(
    stores: Stores,
) -> None:
    store = stores.fresh(change_feed_max_len=100)
    for i in range(300):
        await store.put_control(ConsumptionControl(scope="node", name=f"n{i}", state="stopped"))
    position = await store.change_position()
    async with aclosing(store.follow(position)) as feed:
        await store.delete_control("node", "", "n1")
        (event,) = await next_events(feed, 1)
    assert isinstance(event, Change) and event.name == "n1"


async def test_an_unknown_change_id_reloads(store: MetadataStore) -> None:
    async with aclosing(store.follow("not-an-id")) as feed:
        (event,) = await next_events(feed, 1)
    assert isinstance(event, Reload)
