"""`mqgw ctl gray on|off|list|delete` as operators run them: against a real gateway for the
rules they leave behind, and against a stand-in admin API whose rule stays pending a while
(or forever) for the wait of ``off --drain``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from localcluster.ports import free_port
from tests.cli.commands import clean_env, mqgw
from tests.harness.processes import GatewayProcess

OPS = ("ops", "s3cret")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    users = json.dumps([{"name": OPS[0], "password": OPS[1], "tags": ["administrator"]}])
    args = ["--users", users, "--admin-port", str(free_port())]
    process = GatewayProcess(tmp_path_factory.mktemp("gw") / "data", args).start()
    yield process
    process.stop()


def _ctl(url: str, home: Path, *args: str, user: bool = True) -> tuple[int, str, str]:
    login = {"MQGW_ADMIN_USER": OPS[0]} if user else {}
    env = clean_env(home, MQGW_ADMIN_URL=url, MQGW_ADMIN_PASSWORD=OPS[1], **login)
    done = mqgw("ctl", "gray", *args, env=env)
    return done.returncode, done.stdout, done.stderr.strip()


def _rule(gateway: GatewayProcess, name: str) -> dict[str, Any]:
    status, body = gateway.admin("GET", f"/api/gray/rules/{name}", auth=OPS)
    assert status == 200, body
    return dict(body)


def test_on_off_list_and_delete(gateway: GatewayProcess, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{gateway.admin_port}"
    code, _, text = _ctl(url, tmp_path, "on", "canary")
    assert code == 2 and "no gray rule 'canary' yet" in text and "--connection-name" in text
    match = ["--connection-name", "billing-canary-*", "--address", "10.1.0.0/16"]
    assert _ctl(url, tmp_path, "on", "canary", *match, "--switch", "off") == (
        0,
        "",
        "gray rule 'canary': gray on (created)",
    )
    rule = _rule(gateway, "canary")
    stored = {"connection_name": "billing-canary-*", "user": None, "address": "10.1.0.0/16"}
    assert (rule["match"], rule["gray"], rule["switch"]) == (stored, True, False)

    # off keeps the match and the switch; on without match options keeps them too.
    assert _ctl(url, tmp_path, "off", "canary", "--drain", "--no-wait")[::2] == (
        0,
        "gray rule 'canary': gray off",
    )
    rule = _rule(gateway, "canary")
    assert (rule["match"], rule["gray"], rule["switch"], rule["drain"]) == (
        stored, False, False, True
    )  # fmt: skip
    assert _ctl(url, tmp_path, "on", "canary")[::2] == (0, "gray rule 'canary': gray on (replaced)")
    rule = _rule(gateway, "canary")
    assert (rule["match"], rule["gray"], rule["switch"], rule["drain"]) == (
        stored, True, False, False
    )  # fmt: skip
    assert _ctl(url, tmp_path, "off", "canary")[0] == 0
    assert (_rule(gateway, "canary")["gray"], _rule(gateway, "canary")["drain"]) == (False, False)

    # Match options replace the match whole; --match-user is the match's user.
    code, _, text = _ctl(url, tmp_path, "on", "canary", "--match-user", "alice")
    assert (code, text) == (0, "gray rule 'canary': gray on (replaced)")
    rule = _rule(gateway, "canary")
    assert rule["match"] == {"connection_name": None, "user": "alice", "address": None}
    assert rule["switch"] is False

    # A drain with nothing gray left to read ends at the first poll.
    code, out, _ = _ctl(url, tmp_path, "off", "canary", "--drain")
    assert code == 0 and out.startswith("gray rule 'canary': gray off, drained in "), out

    assert _ctl(url, tmp_path, "on", "v6", "--address", "::1")[0] == 0
    code, out, _ = _ctl(url, tmp_path, "list")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3, out
    assert lines[0].split() == [
        "NAME", "GRAY", "CONNECTION", "NAME", "USER", "ADDRESS", "SWITCH", "DRAIN", "SET", "AT"
    ]  # fmt: skip
    assert lines[1].split()[:7] == ["canary", "off", "-", "alice", "-", "off", "yes"]
    assert lines[2].split()[:7] == ["v6", "on", "-", "-", "::1", "-", "no"]
    code, out, _ = _ctl(url, tmp_path, "list", "--json")
    assert code == 0 and [r["name"] for r in json.loads(out)] == ["canary", "v6"]

    for name in ("canary", "v6"):
        assert _ctl(url, tmp_path, "delete", name)[::2] == (0, f"gray rule '{name}': deleted")
    code, _, text = _ctl(url, tmp_path, "delete", "canary")
    assert code == 1 and "DELETE" in text and "answered 404 no gray rule 'canary'" in text
    code, _, text = _ctl(url, tmp_path, "off", "canary")
    assert code == 1 and "answered 404 no gray rule 'canary'" in text
    assert _ctl(url, tmp_path, "list") == (0, "", "no gray rules")


def test_refusals_are_one_line(gateway: GatewayProcess, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{gateway.admin_port}"
    code, _, text = _ctl(url, tmp_path, "on", "bad", "--address", "db-host")
    assert code == 1 and len(text.splitlines()) == 1, text
    assert "answered 400 match.address: Value error, 'db-host' is neither an IP" in text
    code, _, text = _ctl(url, tmp_path, "list", user=False)  # as guest: no such user here
    assert code == 1 and "answered 401" in text and "user 'guest'" in text


@dataclass
class StandIn:
    """An admin API with one rule, "canary", whose status stays pending for
    ``pending_polls`` GETs after a PUT (None: forever)."""

    pending_polls: int | None
    puts: list[Any] = field(default_factory=list)
    polls: int = 0
    rule: dict[str, Any] = field(
        default_factory=lambda: {
            "name": "canary",
            "match": {"connection_name": "billing-*", "user": None, "address": None},
            "gray": True,
            "switch": None,
            "drain": False,
            "set_at": "2026-03-01T10:00:00Z",
        }
    )

    def answer(self, method: str, body: Any) -> tuple[int, Any]:
        if method == "PUT":
            self.puts.append(body)
            self.rule.update(body)
            return 204, None
        pending: list[dict[str, Any]] = []
        if self.puts:
            self.polls += 1
            if self.pending_polls is None or self.polls <= self.pending_polls:
                pending = [{"queue": "orders", "partition": 1, "gray_ready": 3}]
        return 200, {**self.rule, "status": {"connections": [], "pending": pending}}


@pytest.fixture
def stand_in(request: pytest.FixtureRequest) -> Iterator[tuple[str, StandIn]]:
    state = StandIn(request.param)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.reply(None)

        def do_PUT(self) -> None:
            self.reply(json.loads(self.rfile.read(int(self.headers["content-length"]))))

        def reply(self, body: Any) -> None:
            assert self.path == "/api/gray/rules/canary", self.path
            status, answer = state.answer(self.command, body)
            data = b"" if answer is None else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("stand_in", [2], indirect=True)
def test_off_drain_waits_until_nothing_is_pending(
    stand_in: tuple[str, StandIn], tmp_path: Path
) -> None:
    url, state = stand_in
    started = time.monotonic()
    code, out, text = _ctl(url, tmp_path, "off", "canary", "--drain")
    assert code == 0, text
    match = {"connection_name": "billing-*", "user": None, "address": None}
    assert state.puts == [{"match": match, "gray": False, "switch": None, "drain": True}]
    lines = out.splitlines()
    assert len(lines) == 3, out
    for line in lines[:2]:
        assert line.startswith("waiting (") and line.endswith(
            ' s) for 1: {"queue":"orders","partition":1,"gray_ready":3}'
        ), line
    assert lines[2].startswith("gray rule 'canary': gray off, drained in "), lines[2]
    assert state.polls == 3 and time.monotonic() - started >= 1.0  # two 0.5 s pauses


@pytest.mark.parametrize("stand_in", [None], indirect=True)
def test_off_drain_gives_up_after_the_timeout(
    stand_in: tuple[str, StandIn], tmp_path: Path
) -> None:
    url, state = stand_in
    code, out, text = _ctl(url, tmp_path, "off", "canary", "--drain", "--timeout", "1")
    assert code == 1
    assert text == (
        "mqgw ctl gray off: gray rule 'canary' still waits for 1 after 1 s"
        " (gray is off; the switch back goes on without us)"
    )
    assert 2 <= len(out.splitlines()) == state.polls - 1 <= 4, out
