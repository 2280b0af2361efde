"""Router: exchange types, default exchange, e2e chains and cycles, AEs, CC/BCC."""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.routing import Router, UnknownExchange, exchange_router, header_routing_keys, strip_bcc
from meta.errors import PreconditionFailed
from meta.models import BindingDef, Deletions, ExchangeDef, QueueDef, VHost
from meta.state import MetadataState


def exchange(name: str, type_: str = "direct", ae: str | None = None, **kw: Any) -> ExchangeDef:
    arguments = {"alternate-exchange": ae} if ae is not None else {}
    return ExchangeDef(vhost="/", name=name, type=type_, arguments=arguments, **kw)


def to_queue(source: str, queue: str, key: str = "", **kw: Any) -> BindingDef:
    return BindingDef(
        vhost="/", source=source, destination=queue, destination_type="queue", routing_key=key, **kw
    )


def to_exchange(source: str, dest: str, key: str = "") -> BindingDef:
    return BindingDef(
        vhost="/", source=source, destination=dest, destination_type="exchange", routing_key=key
    )


def make_router(
    exchanges: list[ExchangeDef], queues: list[str], bindings: list[BindingDef]
) -> Router:
    return Router.from_definitions("/", exchanges, queues, bindings)


def test_exchange_types() -> None:
    router = make_router(
        [exchange("d"), exchange("f", "fanout"), exchange("t", "topic"), exchange("h", "headers")],
        ["q1", "q2", "q3"],
        [
            to_queue("d", "q1", "k1"),
            to_queue("d", "q2", "k2"),
            to_queue("d", "q3", "k1"),
            to_queue("f", "q1", "ignored"),
            to_queue("f", "q2"),
            to_queue("t", "q1", "a.*"),
            to_queue("t", "q2", "a.#"),
            to_queue("h", "q3", arguments={"x-match": "any", "kind": "x"}),
        ],
    )
    assert router.route("d", "k1").queues == {"q1", "q3"}
    assert router.route("d", "nope").queues == set()
    assert router.route("f", "whatever").queues == {"q1", "q2"}
    assert router.route("t", "a.b").queues == {"q1", "q2"}
    assert router.route("t", "a").queues == {"q2"}
    assert router.route("h", "", {"kind": "x"}).queues == {"q3"}
    assert router.route("h", "", {"kind": "y"}).queues == set()
    assert router.route("h", "", None).queues == set()


def test_default_exchange_routes_to_existing_queue_only() -> None:
    router = make_router([], ["orders"], [])
    assert router.route("", "orders").queues == {"orders"}
    assert router.route("", "missing").queues == set()
    router.remove_queue("orders")
    assert router.route("", "orders").queues == set()


def test_unknown_exchange_and_internal_flag() -> None:
    router = make_router([exchange("int", internal=True)], [], [])
    with pytest.raises(UnknownExchange):
        router.route("missing", "k")
    assert router.is_internal("int") and not router.is_internal("")
    assert router.get_exchange("int") is not None


def test_e2e_chain_and_fanout_dedup() -> None:
    router = make_router(
        [exchange("a", "fanout"), exchange("b", "topic"), exchange("c")],
        ["q1", "q2"],
        [
            to_exchange("a", "b"),
            to_exchange("b", "c", "x.#"),
            to_queue("c", "q1", "x.y"),
            to_queue("a", "q1"),
            to_queue("b", "q2", "x.*"),
        ],
    )
    result = router.route("a", "x.y")
    assert result.queues == {"q1", "q2"}
    assert set(result.exchanges_visited) == {"a", "b", "c"}
    assert router.route("a", "z").queues == {"q1"}


def test_e2e_cycle_visits_each_exchange_once() -> None:
    router = make_router(
        [exchange("a", "fanout"), exchange("b", "fanout"), exchange("c", "fanout")],
        ["q"],
        [
            to_exchange("a", "b"),
            to_exchange("b", "c"),
            to_exchange("c", "a"),
            to_exchange("a", "a"),
            to_queue("c", "q"),
        ],
    )
    result = router.route("b", "k")
    assert result.queues == {"q"}
    assert sorted(result.exchanges_visited) == ["a", "b", "c"]


def test_alternate_exchange_only_when_nothing_routed() -> None:
    router = make_router(
        [exchange("main", ae="ae"), exchange("ae", "fanout"), exchange("sink")],
        ["normal", "unrouted"],
        [to_queue("main", "normal", "k"), to_queue("ae", "unrouted")],
    )
    assert router.route("main", "k").queues == {"normal"}
    result = router.route("main", "other")
    assert result.queues == {"unrouted"} and result.alternate_exchange_used
    # A match on a bound exchange counts as routed, even if that exchange routes nowhere.
    router.add_binding(to_exchange("main", "sink", "to-sink"))
    assert router.route("main", "to-sink").queues == set()


def test_alternate_exchange_chain_cycle_and_missing() -> None:
    router = make_router(
        [
            exchange("x1", ae="x2"),
            exchange("x2", ae="x3"),
            exchange("x3", ae="x1"),
            exchange("y", ae="does-not-exist"),
        ],
        ["q"],
        [],
    )
    result = router.route("x1", "k")
    assert result.queues == set() and sorted(result.exchanges_visited) == ["x1", "x2", "x3"]
    router.add_binding(to_queue("x3", "q", "k"))
    assert router.route("x1", "k").queues == {"q"}
    assert router.route("y", "k").queues == set()


def test_alternate_exchange_can_be_the_default_exchange() -> None:
    router = make_router([exchange("x", ae="")], ["k"], [])
    assert router.route("x", "k").queues == {"k"}


def test_cc_and_bcc_add_routing_keys() -> None:
    router = make_router(
        [exchange("d")],
        ["q1", "q2", "q3"],
        [to_queue("d", "q1", "k1"), to_queue("d", "q2", "k2"), to_queue("d", "q3", "k3")],
    )
    headers = {"CC": ["k2", 7], "BCC": ["k3"]}
    assert router.route("d", "k1", headers).queues == {"q1", "q2", "q3"}
    assert router.route("", "q1", {"CC": ["q2"], "BCC": ["nope"]}).queues == {"q1", "q2"}
    assert header_routing_keys({"CC": ["a", b"x", "b"], "BCC": ["c"]}) == ["a", "b", "c"]
    assert header_routing_keys(None) == []
    with pytest.raises(PreconditionFailed) as info:
        header_routing_keys({"CC": "k2"})
    assert info.value.detail == 'invalid message: {unacceptable_type_in_header,"CC",longstr}'
    stripped = strip_bcc({"BCC": ["x"], "other": 1})
    assert stripped == {"other": 1}
    plain = {"a": 1}
    assert strip_bcc(plain) is plain


def test_bindings_differing_in_arguments_are_counted() -> None:
    router = make_router(
        [exchange("d"), exchange("f", "fanout"), exchange("t", "topic")], ["q"], []
    )
    for source, key in (("d", "k"), ("f", ""), ("t", "a.#")):
        one = to_queue(source, "q", key, arguments={"v": 1})
        two = to_queue(source, "q", key, arguments={"v": 2})
        router.add_binding(one)
        router.add_binding(two)
        router.add_binding(two)  # duplicate: no effect
        router.remove_binding(one)
        assert router.route(source, key.replace("#", "z")).queues == {"q"}
        router.remove_binding(two)
        assert router.route(source, key.replace("#", "z")).queues == set()


def test_incremental_updates_and_deletions() -> None:
    router = make_router(
        [exchange("a", "fanout"), exchange("b", "fanout")],
        ["q"],
        [to_exchange("a", "b"), to_queue("b", "q")],
    )
    assert router.route("a", "").queues == {"q"}
    router.remove_exchange("b")
    assert router.route("a", "").queues == set()
    router.add_exchange(exchange("b", "fanout"))
    router.add_binding(to_exchange("a", "b"))
    router.add_binding(to_queue("b", "q"))
    router.add_exchange(exchange("b", "fanout", ae="a"))  # redefinition keeps bindings
    assert router.route("a", "").queues == {"q"}
    router.apply_deletions(Deletions(bindings=(to_queue("b", "q"),)))
    assert router.route("a", "").queues == set()
    with pytest.raises(UnknownExchange):
        router.add_binding(to_queue("missing", "q"))


def test_delayed_message_exchange_routes_by_delayed_type() -> None:
    delayed = ExchangeDef(
        vhost="/", name="dl", type="x-delayed-message", arguments={"x-delayed-type": "topic"}
    )
    router = make_router([delayed], ["q"], [to_queue("dl", "q", "a.*")])
    assert router.route("dl", "a.b").queues == {"q"}


def test_router_follows_store_cascades() -> None:
    ids = iter(range(1, 100))
    state = MetadataState(lambda: next(ids))
    state.add_vhost(VHost(name="/"))
    state.declare_exchange(exchange("ad", "fanout", auto_delete=True), passive=False)
    state.declare_queue(QueueDef(vhost="/", name="q"), passive=False, connection_id=None)
    for binding in (to_exchange("amq.fanout", "ad"), to_queue("ad", "q")):
        state.bind(binding, connection_id=None, check_exclusive=True)
    vhost = state.vhost("/")
    router = Router.from_definitions(
        "/",
        vhost.exchanges.values(),
        vhost.queues,
        [b for group in vhost.by_source.values() for b in group.values()],
    )
    assert router.route("amq.fanout", "").queues == {"q"}
    deletions = state.delete_queue("/", "q", connection_id=None, check_exclusive=True)
    router.apply_deletions(deletions)
    assert router.get_exchange("ad") is None  # auto-deleted with its last binding
    assert router.route("amq.fanout", "").queues == set()
    assert router.route("", "q").queues == set()


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("bind"), st.sampled_from(["d", "f", "t"]), st.sampled_from(["q1", "q2"]),
                  st.sampled_from(["k1", "a.*", ""])),
        st.tuples(st.just("unbind"), st.sampled_from(["d", "f", "t"]),
                  st.sampled_from(["q1", "q2"]), st.sampled_from(["k1", "a.*", ""])),
        st.tuples(st.just("bind exchange"), st.sampled_from(["e2e"]), st.sampled_from(["d", "f"])),
        st.tuples(st.just("queue"), st.sampled_from(["add", "remove"]),
                  st.sampled_from(["q1", "q2"])),
        st.tuples(st.just("exchange"), st.sampled_from(["add", "remove", "ae"]),
                  st.sampled_from(["d", "f", "gone"])),
    ),
    max_size=40,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(OPERATIONS)
def test_a_cached_route_is_what_routing_again_gives_after_any_change(ops: list[Any]) -> None:
    """Publishes without headers are answered from a cache (the same exchange and key give
    the same queues); every change to the topology must empty it."""
    router = make_router(
        [exchange("d"), exchange("f", "fanout"), exchange("t", "topic"), exchange("e2e", "fanout")],
        ["q1", "q2"],
        [to_queue("d", "q1", "k1"), to_queue("f", "q2"), to_exchange("e2e", "d", "")],
    )
    for op in ops:
        kind = op[0]
        if kind == "bind" and router.get_exchange(op[1]) is not None:
            router.add_binding(to_queue(op[1], op[2], op[3]))
        elif kind == "unbind":
            router.remove_binding(to_queue(op[1], op[2], op[3]))
        elif kind == "bind exchange" and router.get_exchange(op[2]) is not None:
            router.add_binding(to_exchange(op[1], op[2], "k1"))
        elif kind == "queue":
            (router.add_queue if op[1] == "add" else router.remove_queue)(op[2])
        elif kind == "exchange" and op[1] == "remove":
            router.remove_exchange(op[2])
        elif kind == "exchange":
            ae = "f" if op[1] == "ae" else None
            router.add_exchange(exchange(op[2], "direct", ae=ae))
        for name in ("d", "f", "t", "e2e", "gone"):  # every route, cached from here on
            for key in ("k1", "k2", "a.b", ""):
                _assert_routes_as_uncached(router, name, key)


def _assert_routes_as_uncached(router: Router, name: str, key: str) -> None:
    try:
        cached = router.route(name, key)
    except UnknownExchange:
        with pytest.raises(UnknownExchange):
            router._route(name, key, None, None, False)
        return
    assert cached == router._route(name, key, None, None, False)
    assert cached.ordered == tuple(sorted(cached.queues))


def test_headers_and_delayed_publishes_are_routed_each_time_and_the_cache_stays_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    router = make_router([exchange("t", "topic")], ["q1"], [to_queue("t", "q1", "#")])
    first = router.route("t", "a")
    assert router.route("t", "a") is first  # cached
    assert router.route("t", "a", {"x": 1}) is not first  # with headers: routed again
    assert router.route("t", "a", hold_delayed=True) is not first
    monkeypatch.setattr(exchange_router, "ROUTE_CACHE_SIZE", 3)
    for key in ("b", "c", "d", "e"):
        router.route("t", key)
    assert len(router._cache) <= 3
