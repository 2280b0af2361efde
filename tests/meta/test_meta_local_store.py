"""LocalMetadataStore's own behaviour: atomic persistence of its JSON file.

The rules it shares with the Redis store (RabbitMQ's semantics and texts, cascades, the
change feed) are in test_meta_contract.py, which runs on both.
"""

import json
from pathlib import Path

import anyio
import pytest

from meta.local_document import FILE_NAME
from meta.local_store import LocalMetadataStore
from meta.models import ConsumptionControl, Permission, User, VHost
from meta.password import hash_password
from tests.meta.builders import qbind, qdef, xbind, xdef

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


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


async def test_vhost_and_user_deletions_persist(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.add_vhost(VHost(name="v"))
    await store.set_permission(Permission(user="guest", vhost="v"))
    await store.delete_vhost("v")
    assert await store.delete_user("guest")
    reopened = LocalMetadataStore(tmp_path)
    assert await reopened.get_vhost("v") is None
    assert await reopened.get_user("guest") is None
    assert await reopened.list_permissions() == []


async def test_consumption_controls_persist(tmp_path: Path) -> None:
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
    await reopened.delete_vhost("shop")
    assert await reopened.list_controls() == []
    assert await LocalMetadataStore(tmp_path).list_controls() == []


def test_a_rate_must_be_positive() -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError):
            ConsumptionControl(scope="global", rate_msgs=bad)
