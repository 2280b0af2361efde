"""The dashboard's other pages against a real gateway: a queue's partitions, redrive, purge
and reset-to-timestamp; a connection's controls and close; the firehose switch.

Where an endpoint may not exist yet on this gateway (it says which in /openapi.json), the
page must either do the thing or show the API's error: never neither."""

from __future__ import annotations

import urllib.parse

import pika

from tests.dashboard.conftest import Dashboard, error_for, publish
from tests.harness.processes import GatewayProcess

TILE = '#queue-tiles .tile[data-key="{}"] .value'


def pumped_until_closed(
    connection: pika.BlockingConnection,
) -> pika.exceptions.ConnectionClosedByBroker | None:
    try:
        connection.process_data_events(time_limit=0.1)
    except pika.exceptions.ConnectionClosedByBroker as closed:
        return closed
    return None


def test_queue_page_shows_partitions_and_redrives_dead_letters(
    dashboard: Dashboard, gateway: GatewayProcess
) -> None:
    publish(gateway, "dash.work", [b"w"])
    publish(gateway, "dash.work.dlq", [b"a", b"b"])
    dashboard.logged_in("adm")
    dashboard.go("#/queue/%2F/dash.work")
    dashboard.wait(lambda: dashboard.text(TILE.format("ready")) == "1")
    assert "dash.work" in dashboard.text("#queue-title")

    _, queue = gateway.admin("GET", "/api/queues/%2F/dash.work")
    partitions = queue["mqgw"].get("partition_details") or []
    if partitions:  # the page shows what the API gives, one row per partition
        rows = dashboard.all("#partitions-table tbody tr")
        assert len(rows) == len(partitions)
        for row, partition in zip(rows, partitions, strict=True):
            assert f"{partition['max_offset']:,}" in row.text.split()
    else:
        assert dashboard.find("#partitions-missing").is_displayed()

    dashboard.click("#redrive")
    assert dashboard.wait(lambda: dashboard.text("#queue-result")) == (
        "moved 2, 0 left in dash.work.dlq"
    )
    dashboard.wait(lambda: dashboard.text(TILE.format("ready")) == "3")
    assert gateway.admin("GET", "/api/queues/%2F/dash.work.dlq")[1]["messages_ready"] == 0


def test_purge_and_reset_do_it_or_show_why_not(
    dashboard: Dashboard, gateway: GatewayProcess, documented: set[tuple[str, str]]
) -> None:
    publish(gateway, "dash.purge", [b"p"] * 4)
    dashboard.logged_in("adm")
    dashboard.go("#/queue/%2F/dash.purge")
    dashboard.wait(lambda: dashboard.text(TILE.format("ready")) == "4")

    dashboard.click("#purge")
    assert "dash.purge" in dashboard.accept_confirm()
    if ("DELETE", "/api/queues/{vhost}/{name}/contents") in documented:
        dashboard.wait(lambda: dashboard.text(TILE.format("ready")) == "0")
        assert gateway.admin("GET", "/api/queues/%2F/dash.purge")[1]["messages"] == 0
    else:
        assert "404" in error_for(dashboard, "DELETE /api/queues/%2F/dash.purge/contents")
        assert gateway.admin("GET", "/api/queues/%2F/dash.purge")[1]["messages"] == 4

    dashboard.driver.execute_script(
        "document.getElementById('reset-time').value = '2026-01-02T03:04:05'"
    )
    dashboard.click("#reset-submit")
    assert "dash.purge" in dashboard.accept_confirm()
    if ("POST", "/api/queues/{vhost}/{name}/reset") in documented:
        result = dashboard.wait(lambda: dashboard.text("#queue-result"))
        assert result.startswith("reset to 2026-01-0") and "replayed" in result, result
    else:
        assert "404" in error_for(dashboard, "POST /api/queues/%2F/dash.purge/reset")
    assert dashboard.script_errors() == []


def test_connection_controls_close_and_the_firehose_switch(
    dashboard: Dashboard, gateway: GatewayProcess, documented: set[tuple[str, str]]
) -> None:
    params = pika.URLParameters(gateway.url)
    params.client_properties = {"connection_name": "dash-client"}
    connection = pika.BlockingConnection(params)
    _, connections = gateway.admin("GET", "/api/connections")
    name = next(
        c["name"]
        for c in connections
        if c["client_properties"].get("connection_name") == "dash-client"
    )
    control_path = f"/api/controls/connections/{urllib.parse.quote(name, safe='')}"
    dashboard.logged_in("adm")
    dashboard.go("#/connections")
    row = f'#connections-table tr[data-name="{name}"]'
    assert dashboard.wait(lambda: dashboard.find(row).text).count("dash-client") == 1
    node = next(c["node"] for c in connections if c["name"] == name)  # the gateway holding it
    assert node in dashboard.text(f"{row} td:nth-child(5)")

    dashboard.click(f'{row} button[data-action="stop"]')
    dashboard.wait(lambda: gateway.admin("GET", control_path)[1].get("state") == "stopped")
    dashboard.wait(lambda: "stopped" in dashboard.text(f"{row} td.state"))
    dashboard.click(f'{row} button[data-action="clear"]')
    dashboard.wait(lambda: gateway.admin("GET", control_path)[0] == 404)

    dashboard.click(f"{row} button[data-close]")
    dashboard.accept_confirm()
    if ("DELETE", "/api/connections/{name}") in documented:
        closed = dashboard.wait(lambda: pumped_until_closed(connection))
        assert closed.reply_code == 320 and "closed by adm from the mqgw dashboard" in str(closed)
        dashboard.wait(lambda: not dashboard.all(row))
    else:
        assert "404" in error_for(dashboard, "DELETE /api/connections/")
        connection.close()

    dashboard.go("#/vhosts")
    switch = '#vhosts-table tr[data-name="/"] button'
    cell = '#vhosts-table tr[data-name="/"] td.state'
    dashboard.click(switch)
    dashboard.wait(lambda: dashboard.text("#notice") == "firehose on for /: done")
    for _ in range(2):  # the page shows what the API says, then switches it back off
        tracing = gateway.admin("GET", "/api/vhosts/%2F")[1]["tracing"]
        dashboard.wait(lambda t=tracing: dashboard.text(cell) == ("on" if t else "off"))
        if not tracing:
            break
        dashboard.click(switch)
        dashboard.wait(lambda: dashboard.text("#notice") == "firehose off for /: done")
    assert gateway.admin("GET", "/api/vhosts/%2F")[1]["tracing"] is False
    assert dashboard.script_errors() == []


def test_gray_connections_and_gray_partitions_are_colored(
    dashboard: Dashboard, gateway: GatewayProcess
) -> None:
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as setup:
        arguments = {"x-mqgw-partitions": 4, "x-mqgw-gray-partitions": 2}
        setup.channel().queue_declare("dash.gray", arguments=arguments)
    params = pika.URLParameters(gateway.url)
    params.client_properties = {"connection_name": "dash-canary", "mqgw-gray": True}
    canary = pika.BlockingConnection(params)
    try:
        dashboard.logged_in("adm")
        dashboard.go("#/connections")
        _, connections = gateway.admin("GET", "/api/connections")
        names = {c["client_properties"].get("connection_name"): c["name"] for c in connections}
        row = f'#connections-table tr[data-name="{names["dash-canary"]}"]'
        cell = dashboard.wait(lambda: dashboard.find(f"{row} td.gray"))
        assert cell.text == "gray"
        dashboard.go("#/queue/%2F/dash.gray")
        dashboard.wait(lambda: len(dashboard.all("#partitions-table tbody tr")) == 4)
        rows = dashboard.all("#partitions-table tbody tr")
        assert ["gray" in (r.get_attribute("class") or "") for r in rows] == [
            True, False, False, True
        ]  # fmt: skip
    finally:
        canary.close()


def test_a_keyed_queue_shows_its_route(dashboard: Dashboard, gateway: GatewayProcess) -> None:
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as setup:
        arguments = {"x-mqgw-ordering": "key", "x-mqgw-partitions": 2}
        setup.channel().queue_declare("dash.keyed", arguments=arguments)
    status, _ = gateway.admin("POST", "/api/queues/%2F/dash.keyed/rescale",
                              {"split": 1, "wait": True})  # fmt: skip
    assert status == 200
    dashboard.logged_in("adm")
    dashboard.go("#/queue/%2F/dash.keyed")
    dashboard.wait(lambda: len(dashboard.all("#route-table tbody tr")) == 4)
    states = [r.get_attribute("data-state") for r in dashboard.all("#route-table tbody tr")]
    assert states == ["open", "removed", "open", "open"]
    summary = dashboard.text("#route-summary")
    assert summary.startswith("version 2 (split 1 at 768), 3 partitions open, 1024 logical")
    publish(gateway, "dash.plain", [b"p"])
    dashboard.go("#/queue/%2F/dash.plain")  # a queue without a route: no route section
    dashboard.wait(lambda: dashboard.text(TILE.format("ready")) == "1")
    assert not dashboard.find("#route-section").is_displayed()
    assert dashboard.script_errors() == []
