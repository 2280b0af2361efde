"""Headers exchange matching with explicit wire types, compared with RabbitMQ 3.10.

rabbit_exchange_type_headers 3.10 compares values with Erlang's ``==``: across numeric
types by value (long 1 matches double 1.0), but tables and arrays whole, with the type of
every nested value. Clients cannot choose wire types, so the raw client sends them
(tests/diff/field_tables.py).
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as c

from tests.diff.field_tables import W, properties_with_headers, queue_bind_payload
from tests.diff.raw import Message, RawClient
from tests.diff.support import Server

Table = dict[str, W]

# (binding arguments, message headers, routed?) as RabbitMQ 3.10.8 answers.
CASES: list[tuple[Table, Table, bool]] = [
    ({"a": W("l", 1)}, {"a": W("d", 1.0)}, True),  # numbers by value
    ({"a": W("d", 1.0)}, {"a": W("b", 1)}, True),
    ({"a": W("i", 7)}, {"a": W("l", 7)}, True),
    ({"a": W("l", 1)}, {"a": W("d", 1.5)}, False),
    ({"a": W("f", 1.5)}, {"a": W("d", 1.5)}, True),
    ({"a": W("f", 0.1)}, {"a": W("d", 0.1)}, False),  # 0.1 as a 32-bit float is not 0.1
    ({"a": W("l", 1)}, {"a": W("t", True)}, False),  # true is an atom, not 1
    ({"a": W("T", 5)}, {"a": W("l", 5)}, True),  # timestamps are their seconds
    ({"a": W("T", 5)}, {"a": W("T", 5)}, True),
    ({"a": W("S", "abc")}, {"a": W("x", b"abc")}, True),  # both binaries
    ({"a": W("D", "15")}, {"a": W("l", 15)}, False),  # {0,15} is no number
    ({"a": W("D", "1.5")}, {"a": W("D", "1.50")}, False),  # {1,15} =/= {2,150}
    ({"a": W("V", None)}, {"a": W("l", 0)}, True),  # void: presence only
    ({"a": W("l", 0)}, {"a": W("V", None)}, False),
    # Tables and arrays compare with their nested wire types, in order.
    ({"a": W("F", {"k": W("l", 1)})}, {"a": W("F", {"k": W("b", 1)})}, False),
    ({"a": W("F", {"k": W("l", 1)})}, {"a": W("F", {"k": W("l", 1)})}, True),
    ({"a": W("F", {"k": W("d", 1.0)})}, {"a": W("F", {"k": W("l", 1)})}, False),
    ({"a": W("F", {"k": W("S", "x")})}, {"a": W("F", {"k": W("x", b"x")})}, False),
    (
        {"a": W("F", {"k": W("l", 1), "j": W("l", 2)})},
        {"a": W("F", {"j": W("l", 2), "k": W("l", 1)})},
        False,
    ),
    ({"a": W("A", [W("l", 1)])}, {"a": W("A", [W("I", 1)])}, False),
    ({"a": W("A", [W("l", 1)])}, {"a": W("A", [W("l", 1)])}, True),
    ({"a": W("A", [W("F", {"k": W("s", 3)})])}, {"a": W("A", [W("F", {"k": W("s", 3)})])}, True),
    ({"a": W("F", {})}, {"a": W("A", [])}, True),  # both the empty list
    ({"x-match": W("S", "any"), "a": W("S", "x"), "b": W("l", 2)}, {"b": W("d", 2.0)}, True),
]


def _route_each(client: RawClient, p: str, cases: list[tuple[Table, Table, bool]]) -> list[bool]:
    """One queue per case, bound by its arguments; each message published once; whether
    case i's queue got message i."""
    client.rpc(1, c.Exchange.Declare(exchange=f"{p}-h", exchange_type="headers"))
    for i, (arguments, _, _) in enumerate(cases):
        client.rpc(1, c.Queue.Declare(queue=f"{p}-q{i}", auto_delete=False))
        client.send_frame(1, 1, queue_bind_payload(f"{p}-q{i}", f"{p}-h", "", arguments))
        reply = client.next_method(1)
        assert isinstance(reply, c.Queue.BindOk), reply
    client.rpc(1, c.Confirm.Select())
    for i, (_, headers, _) in enumerate(cases):
        client.publish(1, f"{p}-h", "", b"m%d" % i, raw_properties=properties_with_headers(headers))
        client.next_item(1)  # the confirm: stored (and routed) before the gets below
    routed = []
    for i in range(len(cases)):
        got = set()
        while isinstance(
            item := client.rpc(1, c.Basic.Get(queue=f"{p}-q{i}", no_ack=True)), Message
        ):
            got.add(item.body)
        routed.append(b"m%d" % i in got)
        client.rpc(1, c.Queue.Delete(queue=f"{p}-q{i}"))
    client.rpc(1, c.Exchange.Delete(exchange=f"{p}-h"))
    return routed


def _scenario(cases: list[tuple[Table, Table, bool]]) -> Any:
    def scenario(server: Server, p: str) -> list[bool]:
        with server.raw() as client:
            client.open_channel(1)
            return _route_each(client, p, cases)

    return scenario


def test_typed_header_values_route_as_in_rabbitmq(servers: list[Server], names: str) -> None:
    rabbit, gateway = (_scenario(CASES)(server, names) for server in servers)
    assert rabbit == [routed for _, _, routed in CASES]  # what the table says RabbitMQ does
    assert gateway == rabbit


_INTEGER = st.sampled_from("bBsuIil").flatmap(
    lambda code: st.builds(W, st.just(code), st.integers(0, 2))
)
_FLOAT = st.sampled_from("fd").flatmap(
    lambda code: st.builds(W, st.just(code), st.sampled_from([0.0, 1.0, 1.5, 2.0]))
)
_SCALAR = st.one_of(
    _INTEGER,
    _FLOAT,
    st.builds(W, st.just("t"), st.booleans()),
    st.builds(W, st.sampled_from("Sx"), st.sampled_from(["1", "a"])),
    st.builds(W, st.just("T"), st.integers(0, 2)),
    st.builds(W, st.just("D"), st.sampled_from(["1", "1.0", "2"])),
    st.just(W("V", None)),
)
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.builds(W, st.just("F"), st.dictionaries(st.sampled_from("jk"), inner, max_size=2)),
        st.builds(W, st.just("A"), st.lists(inner, max_size=2)),
    ),
    max_leaves=4,
)
_TABLE = st.dictionaries(st.sampled_from(["a", "b"]), _VALUE, min_size=1, max_size=2)


_examples = itertools.count()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(st.tuples(_TABLE, _TABLE, st.just(False)), min_size=4, max_size=4))
def test_random_typed_values_route_as_in_rabbitmq(
    servers: list[Server], names: str, cases: list[tuple[Table, Table, bool]]
) -> None:
    prefix = f"{names}-{next(_examples)}"
    rabbit, gateway = (_scenario(cases)(server, prefix) for server in servers)
    differ = [(b, h) for (b, h, _), r, g in zip(cases, rabbit, gateway, strict=True) if r != g]
    assert gateway == rabbit, differ
