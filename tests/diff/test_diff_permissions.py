"""Permissions, compared with RabbitMQ 3.10: which operation checks what, in which order, and
the 403 ACCESS_REFUSED / 530 NOT_ALLOWED closes that follow (code, text, class/method id).

The same users exist on both servers (rabbitmqctl there, the admin API here). Resources are
named ``{p}-<name>-<rights>`` and the restricted user's regexes grant by the suffix:
configure on -c, -cw, -cr, -all; write on -w, -cw, -wr, -all; read on -r, -cr, -wr, -all.
Resources the user lacks rights to create are made first by guest (``setup``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from pamqp import commands as c

from tests.diff.raw import RawClient
from tests.diff.support import Server, describe, run_both
from tests.diff.test_diff_errors import Step, m, publish, q, rpc, x
from tests.harness.processes import GatewayProcess
from tests.harness.rabbitmq import RabbitMQProcess

PASSWORD = "perm-secret"
# Users of this module only (both servers are shared by every differential test).
RESTRICTED = "perm-restricted"  # rights by name suffix, see the module docstring
DEFAULT_ONLY = "perm-default-only"  # write on the default exchange, nothing else
SERVER_NAMED = "perm-server-named"  # configure on server-named queues only
NO_VHOST = "perm-no-vhost"  # no permission entry in '/'
CHANGED = "perm-changed"  # full rights, cleared and set again by a test
IMPERSONATOR = "perm-impersonator"  # full rights and the 'impersonator' tag
TAGS = {IMPERSONATOR: "impersonator"}

PERMISSIONS: dict[str, tuple[str, str, str] | None] = {
    RESTRICTED: (
        "^(amq\\.)?d[0-9]+-.*-(c|cw|cr|all)$",  # never a server-generated name
        "^d[0-9]+-.*-(w|cw|wr|all)$",
        "^d[0-9]+-.*-(r|cr|wr|all)$",
    ),
    DEFAULT_ONLY: ("", "^amq\\.default$", "^$"),
    SERVER_NAMED: ("^amq\\.gen-", "", ""),
    NO_VHOST: None,
    CHANGED: (".*", ".*", ".*"),
    IMPERSONATOR: (".*", ".*", ".*"),
}


def _set_permission(
    rabbitmq: RabbitMQProcess, gateway: GatewayProcess, user: str, rights: tuple[str, str, str]
) -> None:
    rabbitmq.ctl("set_permissions", "-p", "/", user, *rights)
    body = dict(zip(("configure", "write", "read"), rights, strict=True))
    status, reply = gateway.admin("PUT", f"/api/permissions/%2F/{user}", body)
    assert status in (201, 204), (status, reply)


def _clear_permission(rabbitmq: RabbitMQProcess, gateway: GatewayProcess, user: str) -> None:
    rabbitmq.ctl("clear_permissions", "-p", "/", user)
    status, reply = gateway.admin("DELETE", f"/api/permissions/%2F/{user}")
    assert status == 204, (status, reply)


@pytest.fixture(scope="module")
def users(rabbitmq: RabbitMQProcess, diff_gateway: GatewayProcess) -> Iterator[None]:
    for user, rights in PERMISSIONS.items():
        rabbitmq.ctl("add_user", user, PASSWORD)
        if user in TAGS:
            rabbitmq.ctl("set_user_tags", user, TAGS[user])
        status, reply = diff_gateway.admin(
            "PUT", f"/api/users/{user}", {"password": PASSWORD, "tags": TAGS.get(user, "")}
        )
        assert status in (201, 204), (status, reply)
        if rights is not None:
            _set_permission(rabbitmq, diff_gateway, user, rights)
    yield
    for user in PERMISSIONS:
        rabbitmq.ctl("delete_user", user)
        diff_gateway.admin("DELETE", f"/api/users/{user}")


_GENERATED = re.compile(r"amq\.gen-[A-Za-z0-9_-]+")


def _normalize(value: Any) -> Any:
    """Server-generated queue names differ by design, in fields and in reply texts."""
    if isinstance(value, str):
        return _GENERATED.sub("amq.gen-*", value)
    if isinstance(value, list | tuple):
        return type(value)(_normalize(v) for v in value)
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    return value


def _connect(server: Server, user: str) -> tuple[RawClient, Any]:
    client = RawClient(server.port, username=user, password=PASSWORD)
    return client, client.connect()


def scenario(steps: list[Step], setup: list[Step] | None = None, user: str = RESTRICTED) -> Any:
    """``setup`` as guest (must succeed), then ``steps`` as ``user`` on channel 1."""

    def run(server: Server, p: str) -> Any:
        if setup:
            with server.raw() as admin:
                admin.open_channel(1)
                for step in setup:
                    outcome = step(admin, p)
                    assert "Close" not in repr(outcome), (server.name, outcome)
        client, opened = _connect(server, user)
        try:
            if not isinstance(opened, c.Connection.OpenOk):
                return ["open", describe(opened)]
            client.open_channel(1)
            observed = []
            for step in steps:
                observed.append(step(client, p))
                if client.closed is not None:
                    break  # a hard error ended the connection
            return _normalize(observed)
        finally:
            client.close()

    return run


def _formatted(arguments: dict[str, Any] | None, p: str) -> dict[str, Any] | None:
    if arguments is None:
        return None
    return {k: v.format(p=p) if isinstance(v, str) else v for k, v in arguments.items()}


def declare_x(name: str, kind: str = "direct", arguments: Any = None, **kw: Any) -> Step:
    return rpc(lambda p: x(kind, exchange=name, arguments=_formatted(arguments, p), **kw)(p))


def declare_q(name: str, arguments: Any = None, **kw: Any) -> Step:
    return rpc(lambda p: q(queue=name, arguments=_formatted(arguments, p), **kw)(p))


def dlx(name: str) -> dict[str, Any]:
    return {"x-dead-letter-exchange": name}


def ae(name: str) -> dict[str, Any]:
    return {"alternate-exchange": name}


OTHER_USER_ID = c.Basic.Properties(user_id="someone-else")

# fmt: off
SCENARIOS: dict[str, Any] = {
    # exchange.declare: configure; for a new exchange with alternate-exchange, read on it and
    # write on the alternate; passive declares check nothing.
    "exchange-declare": scenario([
        declare_x("{p}-x-w"), declare_x("{p}-x-c"), declare_x("{p}-x-c", "fanout"),
    ]),
    "exchange-declare-passive": scenario(
        [declare_x("{p}-x-none", passive=True), declare_x("{p}-gone-none", passive=True)],
        setup=[declare_x("{p}-x-none")],
    ),
    "exchange-declare-alternate": scenario([
        declare_x("{p}-x1-c", arguments=ae("{p}-ae-w")),   # no read on the exchange
        declare_x("{p}-x2-cr", arguments=ae("{p}-ae-r")),  # no write on the alternate
        declare_x("{p}-x3-cr", arguments=ae("{p}-ae-w")),  # both: declared
        declare_x("{p}-x4-cr", arguments=ae("")),          # '' is amq.default
    ]),
    "exchange-redeclare-alternate": scenario(  # existing: no alternate-exchange check
        [declare_x("{p}-x-c", arguments=ae("{p}-ae-r"))],
        setup=[declare_x("{p}-x-c", arguments=ae("{p}-ae-r"))],
    ),
    "exchange-declare-order": scenario([
        declare_x("{p}-x-none", "nonsense"),  # the type is checked first (hard 503)
    ]),
    "exchange-declare-default-and-reserved": scenario([
        declare_x(""), declare_x("amq.{p}-x-c"), declare_x("amq.{p}-x-none"),
        declare_x("amq.direct"),
    ]),
    # exchange.delete: configure, after the default/amq.* refusals; missing ones too.
    "exchange-delete": scenario(
        [rpc(m(c.Exchange.Delete, exchange="{p}-x-w")),
         rpc(m(c.Exchange.Delete, exchange="{p}-gone-w")),
         rpc(m(c.Exchange.Delete, exchange="{p}-x-c")),
         rpc(m(c.Exchange.Delete, exchange="amq.direct")),
         rpc(m(c.Exchange.Delete, exchange=""))],
        setup=[declare_x("{p}-x-w"), declare_x("{p}-x-c")],
    ),
    # queue.declare: configure; new queues with x-dead-letter-exchange: read on the queue,
    # write on the exchange; passive declares check nothing.
    "queue-declare": scenario(
        [declare_q("{p}-q-w"), declare_q("{p}-q-c"), declare_q("{p}-q-none", passive=True),
         declare_q("{p}-gone-none", passive=True)],
        setup=[declare_q("{p}-q-none")],
    ),
    "queue-declare-dead-letter-exchange": scenario([
        declare_q("{p}-q1-c", arguments=dlx("{p}-dlx-w")),   # no read on the queue
        declare_q("{p}-q2-cr", arguments=dlx("{p}-dlx-r")),  # no write on the exchange
        declare_q("{p}-q3-cr", arguments=dlx("")),           # '' is amq.default
        declare_q("{p}-q4-cr", arguments=dlx("{p}-dlx-w")),  # both: declared
        declare_q("{p}-q5-cr", arguments={"x-dead-letter-exchange": 5}),  # type first
    ]),
    "queue-redeclare-dead-letter-exchange": scenario(  # existing: no check but configure
        [declare_q("{p}-q-c", arguments=dlx("{p}-dlx-r"))],
        setup=[declare_q("{p}-q-c", arguments=dlx("{p}-dlx-r"))],
    ),
    "queue-declare-reserved-name": scenario(  # before the check, unlike exchanges
        [declare_q("amq.{p}-q-none"), declare_q("amq.{p}-q-c")]
    ),
    "queue-declare-server-named-refused": scenario([declare_q("")]),
    "queue-declare-server-named": scenario(
        [declare_q("", exclusive=True), declare_q("{p}-q-none")], user=SERVER_NAMED
    ),
    # queue.delete: configure (a missing queue too); queue.purge: read.
    "queue-delete": scenario(
        [rpc(m(c.Queue.Delete, queue="{p}-q-w")), rpc(m(c.Queue.Delete, queue="{p}-gone-w")),
         rpc(m(c.Queue.Delete, queue="{p}-q-c")), rpc(m(c.Queue.Delete, queue="{p}-gone-c"))],
        setup=[declare_q("{p}-q-w"), declare_q("{p}-q-c")],
    ),
    "queue-purge": scenario(
        [rpc(m(c.Queue.Purge, queue="{p}-q-c")), rpc(m(c.Queue.Purge, queue="{p}-gone-w")),
         rpc(m(c.Queue.Purge, queue="{p}-q-r")), rpc(m(c.Queue.Purge, queue="{p}-gone-r"))],
        setup=[declare_q("{p}-q-c"), declare_q("{p}-q-r")],
    ),
    "queue-shortcut-name": scenario(  # '' is the last declared queue, checked by its name
        [declare_q("{p}-q-c", passive=True), rpc(m(c.Queue.Purge, queue="")),
         declare_q("{p}-q-r", passive=True), rpc(m(c.Queue.Purge, queue="")),
         rpc(m(c.Queue.Delete, queue=""))],
        setup=[declare_q("{p}-q-c"), declare_q("{p}-q-r")],
    ),
    # queue.bind / unbind: write on the queue, then read on the exchange.
    "queue-bind": scenario(
        [rpc(m(c.Queue.Bind, queue="{p}-q-r", exchange="{p}-x-r")),   # no write on the queue
         rpc(m(c.Queue.Bind, queue="{p}-q-w", exchange="{p}-x-w")),   # no read on the exchange
         rpc(m(c.Queue.Bind, queue="{p}-q-w", exchange="{p}-x-r")),   # bound
         rpc(m(c.Queue.Bind, queue="{p}-q-w", exchange="")),          # default: refused
         rpc(m(c.Queue.Bind, queue="{p}-q-r", exchange="")),          # write comes first
         rpc(m(c.Queue.Bind, queue="{p}-gone-w", exchange="{p}-gone-r"))],  # 404
        setup=[declare_q("{p}-q-r"), declare_q("{p}-q-w"), declare_x("{p}-x-r"),
               declare_x("{p}-x-w")],
    ),
    "queue-unbind": scenario(
        [rpc(m(c.Queue.Unbind, queue="{p}-q-r", exchange="{p}-x-r")),
         rpc(m(c.Queue.Unbind, queue="{p}-q-w", exchange="{p}-x-w")),
         rpc(m(c.Queue.Unbind, queue="{p}-q-w", exchange="{p}-x-r"))],
        setup=[declare_q("{p}-q-r"), declare_q("{p}-q-w"), declare_x("{p}-x-r"),
               declare_x("{p}-x-w"),
               rpc(m(c.Queue.Bind, queue="{p}-q-w", exchange="{p}-x-r"))],
    ),
    # exchange.bind / unbind: write on the destination, then read on the source.
    "exchange-bind": scenario(
        [rpc(m(c.Exchange.Bind, destination="{p}-d-r", source="{p}-s-r")),
         rpc(m(c.Exchange.Bind, destination="{p}-d-w", source="{p}-s-w")),
         rpc(m(c.Exchange.Bind, destination="{p}-d-w", source="{p}-s-r")),
         rpc(m(c.Exchange.Bind, destination="", source="{p}-s-r")),   # amq.default: write
         rpc(m(c.Exchange.Bind, destination="{p}-d-w", source=""))],  # default: refused
        setup=[declare_x("{p}-d-r"), declare_x("{p}-d-w"), declare_x("{p}-s-r"),
               declare_x("{p}-s-w")],
    ),
    "exchange-unbind": scenario(
        [rpc(m(c.Exchange.Unbind, destination="{p}-d-r", source="{p}-s-r")),
         rpc(m(c.Exchange.Unbind, destination="{p}-d-w", source="{p}-s-w")),
         rpc(m(c.Exchange.Unbind, destination="{p}-d-w", source="{p}-s-r"))],
        setup=[declare_x("{p}-d-r"), declare_x("{p}-d-w"), declare_x("{p}-s-r"),
               declare_x("{p}-s-w"),
               rpc(m(c.Exchange.Bind, destination="{p}-d-w", source="{p}-s-r"))],
    ),
    # basic.publish: write on the exchange (before it is looked up); '' is amq.default.
    "publish": scenario(
        [publish("{p}-x-w", "k"), publish("{p}-x-r", "k"), publish("{p}-gone-r", "k"),
         publish("{p}-gone-w", "k"), publish("", "{p}-q-all"), publish("{p}-i-r", "k"),
         publish("{p}-i-w", "k")],
        setup=[declare_x("{p}-x-w"), declare_x("{p}-x-r"), declare_q("{p}-q-all"),
               declare_x("{p}-i-r", internal=True), declare_x("{p}-i-w", internal=True)],
    ),
    "publish-default-exchange": scenario(
        [publish("", "{p}-q"), publish("amq.direct", "{p}-q"), publish("", "{p}-q")],
        setup=[declare_q("{p}-q")], user=DEFAULT_ONLY,
    ),
    "publish-confirmed": scenario(
        [rpc(lambda p: c.Confirm.Select()), publish("{p}-x-w", "k"), publish("{p}-x-r", "k")],
        setup=[declare_x("{p}-x-w"), declare_x("{p}-x-r")],
    ),
    # user-id must be the user's own, unless the user is tagged 'impersonator'; after write.
    "publish-user-id": scenario(
        [publish("{p}-x-r", "k", properties=OTHER_USER_ID),
         publish("{p}-x-w", "k", properties=OTHER_USER_ID),
         publish("{p}-x-w", "k", properties=c.Basic.Properties(user_id=RESTRICTED))],
        setup=[declare_x("{p}-x-w"), declare_x("{p}-x-r")],
    ),
    "publish-user-id-impersonator": scenario(
        [publish("amq.direct", "k", properties=OTHER_USER_ID),
         rpc(lambda p: c.Confirm.Select()),
         publish("amq.direct", "k", properties=OTHER_USER_ID)],
        user=IMPERSONATOR,
    ),
    # basic.consume / basic.get: read on the queue (before it is looked up).
    "consume": scenario(
        [rpc(m(c.Basic.Consume, queue="{p}-q-w")), rpc(m(c.Basic.Consume, queue="{p}-gone-w")),
         rpc(m(c.Basic.Consume, queue="{p}-q-r", consumer_tag="t")),
         rpc(m(c.Basic.Consume, queue="{p}-gone-r"))],
        setup=[declare_q("{p}-q-w"), declare_q("{p}-q-r")],
    ),
    "consume-tag-reuse-first": scenario(  # 530 for the reused tag comes before read
        [rpc(m(c.Basic.Consume, queue="{p}-q-r", consumer_tag="t")),
         rpc(m(c.Basic.Consume, queue="{p}-q-w", consumer_tag="t"))],
        setup=[declare_q("{p}-q-w"), declare_q("{p}-q-r")],
    ),
    "consume-reply-to": scenario(  # the pseudo-queue checks nothing
        [rpc(m(c.Basic.Consume, queue="amq.rabbitmq.reply-to", consumer_tag="t",
               no_ack=True))],
    ),
    "get": scenario(
        [rpc(m(c.Basic.Get, queue="{p}-q-w")), rpc(m(c.Basic.Get, queue="{p}-gone-w")),
         rpc(m(c.Basic.Get, queue="{p}-q-r")), rpc(m(c.Basic.Get, queue="{p}-gone-r"))],
        setup=[declare_q("{p}-q-w"), declare_q("{p}-q-r")],
    ),
    # connection.open: a permission entry in the vhost is needed.
    "vhost-no-permission": scenario([], user=NO_VHOST),
}
# fmt: on


@pytest.mark.usefixtures("users")
@pytest.mark.parametrize("name", list(SCENARIOS), ids=str)
def test_permission_matches_rabbitmq(servers: list[Server], names: str, name: str) -> None:
    rabbit, gateway = run_both(servers, SCENARIOS[name], names)
    assert gateway == rabbit


def test_scenarios_refuse_and_allow(servers: list[Server], users: None, names: str) -> None:
    """A broker that refused everything (or nothing) would not match: both kinds occur."""
    rabbit, _ = run_both(servers, SCENARIOS["queue-declare"], names)
    assert rabbit[0][0:2] == ("channel", 403) and rabbit[1][0] == "Queue.DeclareOk"


def _update_secret(secret: str) -> Step:
    def step(client: RawClient, p: str) -> Any:
        reply = client.rpc(0, c.Connection.UpdateSecret(secret, "rotation"))
        return describe(reply)

    return step


@pytest.mark.usefixtures("users")
@pytest.mark.parametrize("user", ["guest", RESTRICTED])
def test_update_secret_matches_rabbitmq(servers: list[Server], names: str, user: str) -> None:
    """RabbitMQ 3.10 answers update-secret-ok for a good and a bad secret alike (its internal
    users' state cannot expire, so the secret is not checked); the connection goes on."""
    password = "guest" if user == "guest" else PASSWORD
    steps = [
        _update_secret(password),
        _update_secret("not-the-password"),
        _update_secret(""),
        declare_q("{p}-q-c"),
    ]

    def run(server: Server, p: str) -> Any:
        with RawClient(server.port, username=user, password=password) as client:
            client.open_channel(1)
            return [step(client, p) for step in steps]

    rabbit, gateway = run_both(servers, run, names)
    assert gateway == rabbit
    assert rabbit[0] == ("Connection.UpdateSecretOk", {})


def test_permission_change_reaches_new_channels(
    rabbitmq: RabbitMQProcess, diff_gateway: GatewayProcess, servers: list[Server], users: None
) -> None:
    """Cleared: a new channel is refused, a new connection too; set again: allowed again."""
    p = "perm-change"
    outcomes: dict[str, list[Any]] = {server.name: [] for server in servers}
    clients = {}
    for server in servers:
        client, opened = _connect(server, CHANGED)
        assert isinstance(opened, c.Connection.OpenOk)
        client.open_channel(1)
        outcomes[server.name].append(declare_q("{p}-q1")(client, p))
        clients[server.name] = client
    _clear_permission(rabbitmq, diff_gateway, CHANGED)
    for server in servers:
        client = clients[server.name]
        client.open_channel(2)
        outcomes[server.name].append(rpc(q(queue="{p}-q2"), channel=2)(client, p))
        other, opened = _connect(server, CHANGED)
        outcomes[server.name].append(describe(opened))
        other.close()
    _set_permission(rabbitmq, diff_gateway, CHANGED, ("^perm-change-q3$", ".*", ".*"))
    for server in servers:
        client = clients[server.name]
        client.open_channel(3)
        outcomes[server.name].append(rpc(q(queue="{p}-q3"), channel=3)(client, p))
        client.open_channel(4)
        outcomes[server.name].append(rpc(q(queue="{p}-q4"), channel=4)(client, p))
        client.close()
    _set_permission(rabbitmq, diff_gateway, CHANGED, (".*", ".*", ".*"))
    rabbit, gateway = outcomes["rabbitmq"], outcomes["gateway"]
    assert gateway == rabbit
    assert rabbit[1][0:2] == ("channel", 403) and rabbit[2][0:2] == ("connection", 530)
    assert rabbit[3][0] == "Queue.DeclareOk"
