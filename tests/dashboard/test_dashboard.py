"""The web dashboard in Debian's chromium against a real gateway: login, a queue appearing
after a publish, stop and start from the page as a pika consumer sees them, errors from the
API and from a bad login shown in the page, and a screenshot of the overview."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from tests.dashboard import png
from tests.dashboard.conftest import QUEUE_ROW, Dashboard, error_for, publish
from tests.harness.processes import GatewayProcess

TOTAL = '#overview-totals .tile[data-key="{}"] .value'


def collect(channel: BlockingChannel, got: list[bytes], until: float, want: int) -> list[bytes]:
    """Deliveries that come before ``until`` (monotonic), stopping early at ``want``."""
    while len(got) < want and time.monotonic() < until:
        channel.connection.process_data_events(time_limit=0.1)
    return got


def test_the_shell_shows_only_a_login_form_and_does_not_shadow_the_api(
    gateway: GatewayProcess,
) -> None:
    base = f"http://127.0.0.1:{gateway.admin_port}"
    with urllib.request.urlopen(base + "/") as answer:
        html = answer.read().decode()
        assert answer.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in answer.headers["content-security-policy"]
    assert 'id="login"' in html and 'id="app" hidden' in html
    for asset, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        with urllib.request.urlopen(f"{base}/dashboard/{asset}") as answer:
            assert answer.headers["content-type"].startswith(kind)
    try:
        urllib.request.urlopen(base + "/dashboard/../pyproject.toml")
        raise AssertionError("a file outside the dashboard's was served")
    except urllib.error.HTTPError as error:
        assert error.code == 404
    assert gateway.admin("GET", "/api/health", auth=None)[0] == 200
    assert gateway.admin("GET", "/api/queues", auth=None)[0] == 401


def test_a_wrong_password_shows_an_error_and_nothing_else(dashboard: Dashboard) -> None:
    dashboard.login("adm", "not-the-password")
    shown = dashboard.find("#login-error")
    message = dashboard.wait(lambda: shown.text if shown.is_displayed() else None)
    assert "invalid credentials" in message and "401" in message
    for hidden in ("#app", "#nav", "#session"):
        assert not dashboard.find(hidden).is_displayed()
    assert dashboard.driver.execute_script("return sessionStorage.length") == 0


def test_stop_and_start_a_queue_from_the_page(
    dashboard: Dashboard, gateway: GatewayProcess
) -> None:
    dashboard.logged_in("adm")
    dashboard.go("#/queues")
    publish(gateway, "dash.orders", [b"one", b"two", b"three"])
    row = QUEUE_ROW.format("dash.orders")
    dashboard.wait(lambda: dashboard.find(f"{row} td:nth-child(4)").text == "3")

    dashboard.click(f'{row} button[data-action="stop"]')
    dashboard.wait(lambda: dashboard.find(row).get_attribute("data-state") == "stopped")
    assert "stopped" in dashboard.text(f"{row} td.state")
    status, control = gateway.admin("GET", "/api/controls/queues/%2F/dash.orders")
    assert (status, control["state"], control["set_by"]) == (200, "stopped", "adm")

    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    got: list[bytes] = []

    def on_message(ch: BlockingChannel, method: Any, _props: Any, body: bytes) -> None:
        got.append(body)
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume("dash.orders", on_message)
    # Stopped: the consumer is there (the page counts it) and still receives nothing.
    dashboard.wait(lambda: dashboard.find(f"{row} td:nth-child(10)").text == "1")
    assert collect(channel, got, time.monotonic() + 1.5, 1) == []

    dashboard.click(f'{row} button[data-action="start"]')
    assert collect(channel, got, time.monotonic() + 10, 3) == [b"one", b"two", b"three"]
    dashboard.wait(lambda: dashboard.find(row).get_attribute("data-state") == "running")

    dashboard.fill(f"{row} input.rate", "5")
    dashboard.click(f'{row} button[data-action="throttle"]')
    dashboard.wait(lambda: "≤ 5 msg/s" in dashboard.text(f"{row} td.state"))
    status, control = gateway.admin("GET", "/api/controls/queues/%2F/dash.orders")
    assert (control["state"], control["rate_msgs"]) == ("running", 5)

    dashboard.click(f'{row} button[data-action="clear"]')
    dashboard.wait(lambda: gateway.admin("GET", "/api/controls/queues/%2F/dash.orders")[0] == 404)
    connection.close()
    assert dashboard.script_errors() == []


def test_api_errors_show_in_the_page(dashboard: Dashboard, gateway: GatewayProcess) -> None:
    publish(gateway, "dash.errors", [b"x"])
    dashboard.logged_in("mgmt")  # may look, may not stop anything (needs administrator)
    dashboard.go("#/queues")
    row = QUEUE_ROW.format("dash.errors")
    dashboard.click(f'{row} button[data-action="stop"]')
    refused = dashboard.wait(
        lambda: [e for e in dashboard.errors() if "PUT /api/controls/queues" in e]
    )
    assert "403" in refused[0] and "administrator" in refused[0], refused
    assert gateway.admin("GET", "/api/controls/queues/%2F/dash.errors")[0] == 404

    dashboard.go("#/queue/%2F/no-such-queue")
    missing = dashboard.wait(lambda: [e for e in dashboard.errors() if "no-such-queue" in e])
    assert "404" in missing[0] and "no queue 'no-such-queue'" in missing[0], missing


def publish_line_heights(dashboard: Dashboard) -> list[str]:
    line = dashboard.find("#chart-rates polyline.s1").get_attribute("points") or ""
    return [point.split(",")[1] for point in line.split()]


def test_overview_screenshot_is_not_blank_and_fits_a_laptop_screen(
    dashboard: Dashboard,
    gateway: GatewayProcess,
    documented: set[tuple[str, str]],
    tmp_path: Path,
) -> None:
    publish(gateway, "dash.overview", [])
    dashboard.logged_in("adm")
    dashboard.go("#/overview")
    if ("GET", "/api/overview") in documented:
        _, overview = gateway.admin("GET", "/api/overview")
        queues = str(overview["object_totals"]["queues"])
        dashboard.wait(lambda: dashboard.text(TOTAL.format("queues")) == queues)
        assert dashboard.text(TOTAL.format("connections")).isdigit()
        disk = dashboard.text('#overview-store [data-key="store.disk_bytes"] .value')
        assert disk.endswith(("B", "KiB", "MiB", "GiB")), disk
        # A line per series; publishes made while the page watches show in the rates (the
        # probe keeps publishing: the node's rate needs two of its samples around them).
        dashboard.wait(lambda: len(dashboard.all("#chart-queued polyline")) == 2)
        connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
        channel = connection.channel()

        def publishes_show() -> bool:
            channel.basic_publish("", "dash.overview", b"m")
            return len(set(publish_line_heights(dashboard))) > 1

        dashboard.wait(publishes_show, timeout_s=15)
        connection.close()
    else:
        assert "404" in error_for(dashboard, "GET /api/overview")
    shot = tmp_path / "overview.png"
    assert dashboard.driver.save_screenshot(str(shot))
    width, height, colours, spread = png.summary(shot.read_bytes())
    assert (width, height) == tuple(
        dashboard.driver.execute_script("return [innerWidth, innerHeight]")
    )
    assert colours > 20 and spread > 10, (colours, spread)

    for page in ("overview", "queues", "connections", "vhosts"):
        dashboard.go(f"#/{page}")
        dashboard.wait(dashboard.find(f"#page-{page}").is_displayed)
        overflow = dashboard.driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{page} scrolls sideways by {overflow}px at 1366 wide"
    assert dashboard.script_errors() == []
    print(json.dumps({"screenshot": str(shot), "colours": colours, "brightness_stdev": spread}))
