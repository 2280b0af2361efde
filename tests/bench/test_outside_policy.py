"""`mqgw bench run --url URL`: the policy reported for a server the bench did not start is
what is true of it (it said "unknown (server not started by the bench)")."""

from __future__ import annotations

import re

from bench.load.compare import url_target
from localcluster.ports import free_port
from tests.harness.processes import GatewayProcess


def test_a_server_started_elsewhere_is_named_by_its_connection_start(
    gateway: GatewayProcess,
) -> None:
    # Its flush policy is not known (nothing it can be asked says it); what it is, is.
    target = url_target(gateway.url)
    assert re.fullmatch(
        r"not known: server started outside the bench \(its connection.start says mqgw \S+\)",
        target.policy,
    ), target.policy
    nobody = url_target(f"amqp://guest:guest@127.0.0.1:{free_port()}/")
    assert nobody.policy == "not known: server started outside the bench"
