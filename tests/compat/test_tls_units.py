"""TLS, EXTERNAL and listen addresses without a gateway process: contexts, reload, sans-IO."""

from __future__ import annotations

import errno
import logging
import shutil
import socket
import ssl
from pathlib import Path
from typing import Any

import anyio
import pytest
from pamqp import commands

from gateway.amqp import ServerConnection, events
from gateway.amqp.frame_reader import PROTOCOL_HEADER
from gateway.amqp.sasl import certificate_login
from gateway.config.settings import GatewaySettings
from gateway.net.listeners import describe, listen_hosts, open_listener
from gateway.net.tls import (
    CertFiles,
    ReloadingContext,
    TLSSettingsError,
    TLSSetup,
    build_context,
    version_range,
)
from tests.compat.test_tls import Pki, write_leaf
from tests.gateway.amqp.helpers import parse, start_ok


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


def _settings(pki: Pki, **values: object) -> GatewaySettings:
    base: dict[str, object] = {
        "tls_port": 5671,
        "tls_cert": pki.cert_path,
        "tls_key": pki.key_path,
        "tls_ca": pki.ca_path,
    }
    return GatewaySettings(**{**base, **values})


# -- listen addresses -------------------------------------------------------------------


def test_default_amqp_host_means_every_interface_ipv4_and_ipv6() -> None:
    assert GatewaySettings.model_fields["amqp_host"].default == ""
    assert listen_hosts("") == ["0.0.0.0", "::"]
    assert listen_hosts("*") == ["0.0.0.0", "::"]
    assert listen_hosts("0.0.0.0") == ["0.0.0.0"]
    assert listen_hosts("127.0.0.1, [::1]") == ["127.0.0.1", "::1"]


def test_a_list_of_hosts_binds_one_port_on_each() -> None:
    async def main() -> None:
        listener = await open_listener("127.0.0.1,::1", 0)
        try:
            ports = {one.extra(anyio.abc.SocketAttribute.local_port) for one in listener.listeners}
            assert len(listener.listeners) == 2 and len(ports) == 1
            port = ports.pop()
            assert describe(listener) == f"127.0.0.1:{port},[::1]:{port}"
            for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
                with socket.socket(family) as sock:
                    sock.settimeout(5)
                    sock.connect((host, port))
        finally:
            await listener.aclose()

    anyio.run(main)


def _loopback_instead(monkeypatch: pytest.MonkeyPatch, *, ipv6: bool) -> list[tuple[str, int]]:
    """Record what open_listener asks for; bind loopback instead (nothing public in tests)."""
    calls: list[tuple[str, int]] = []
    real = anyio.create_tcp_listener

    async def fake(*, local_host: str, local_port: int, **kwargs: Any) -> Any:
        calls.append((local_host, local_port))
        if local_host == "::" and not ipv6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        loopback = {"0.0.0.0": "127.0.0.1", "::": "::1"}[local_host]
        return await real(local_host=loopback, local_port=local_port, **kwargs)

    monkeypatch.setattr(anyio, "create_tcp_listener", fake)
    return calls


@pytest.mark.parametrize("ipv6", [True, False])
def test_the_default_binds_both_wildcards_on_one_port(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, ipv6: bool
) -> None:
    calls = _loopback_instead(monkeypatch, ipv6=ipv6)

    async def main() -> str:
        listener = await open_listener("", 0)
        try:
            return describe(listener)
        finally:
            await listener.aclose()

    bound = anyio.run(main)
    port = calls[1][1]
    assert calls == [("0.0.0.0", 0), ("::", port)]
    if ipv6:
        assert bound == f"127.0.0.1:{port},[::1]:{port}"
    else:  # a host without IPv6 still starts, on IPv4, and says so
        assert bound == f"127.0.0.1:{port}"
        assert "IPv6 unavailable" in caplog.text


# -- contexts ---------------------------------------------------------------------------


def test_verify_modes_follow_rabbitmq_ssl_options(pki: Pki) -> None:
    def mode(**values: object) -> ssl.VerifyMode:
        files = CertFiles(pki.cert_path, pki.key_path, pki.ca_path)
        return build_context(_settings(pki, **values), files, client_auth=True).verify_mode

    assert mode(tls_verify="none") == ssl.CERT_NONE
    assert mode(tls_verify="peer") == ssl.CERT_OPTIONAL
    assert mode(tls_verify="peer", tls_fail_if_no_peer_cert=True) == ssl.CERT_REQUIRED


def test_versions_and_ciphers(pki: Pki) -> None:
    assert version_range(["tlsv1.3"]) == (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_3)
    assert version_range(["TLSv1.3", "tlsv1.2"]) == (
        ssl.TLSVersion.TLSv1_2,
        ssl.TLSVersion.TLSv1_3,
    )
    with pytest.raises(TLSSettingsError, match="tls_versions"):
        version_range(["sslv3"])
    files = CertFiles(pki.cert_path, pki.key_path)
    context = build_context(
        _settings(pki, tls_ciphers="ECDHE-ECDSA-AES256-GCM-SHA384"), files, client_auth=False
    )
    tls12 = [c["name"] for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 == ["ECDHE-ECDSA-AES256-GCM-SHA384"]
    with pytest.raises(TLSSettingsError, match="tls_ciphers"):
        build_context(_settings(pki, tls_ciphers="NO-SUCH-CIPHER"), files, client_auth=False)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tls_cert": None}, "tls_port is 5671 but tls_cert is not set"),
        ({"tls_key": None}, "tls_port is 5671 but tls_key is not set"),
        ({"tls_verify": "peer", "tls_ca": None}, "needs tls_ca"),
        ({"admin_tls_cert": Path("x.pem")}, "admin_tls_key is not set"),
        ({"admin_tls_key": Path("x.key")}, "admin_tls_cert is not set"),
        ({"tls_key": Path("/nonexistent/key.pem")}, "tls_key /nonexistent/key.pem"),
    ],
)
def test_settings_that_cannot_work_are_startup_errors(
    pki: Pki, values: dict[str, object], message: str
) -> None:
    with pytest.raises(TLSSettingsError, match=message):
        TLSSetup.from_settings(_settings(pki, **values))


def test_tls_off_by_default() -> None:
    setup = TLSSetup.from_settings(GatewaySettings())
    assert (setup.amqp, setup.admin, setup.contexts) == (None, None, [])


def test_a_failed_reload_keeps_the_previous_context(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    reloading = ReloadingContext(
        "AMQP", _settings(pki), CertFiles(pki.cert_path, pki.key_path), client_auth=True
    )
    before = reloading.context
    assert not reloading.changed()
    other = pki.ca.issue_cert("localhost")
    other.cert_chain_pems[0].write_to_path(str(pki.cert_path))  # the key no longer matches
    assert reloading.changed()
    with caplog.at_level(logging.INFO, logger="mqgw.tls"):
        assert not reloading.reload("files changed")
        assert reloading.context is before
        assert "not reloaded (files changed)" in caplog.text
        assert not reloading.changed()  # stamped: no error every poll until the next change
        write_leaf(other, pki.cert_path, pki.key_path)
        assert reloading.changed()
        assert reloading.reload("SIGHUP")
    assert reloading.context is not before and reloading.reloads == 1
    assert "TLS certificate for AMQP reloaded (SIGHUP)" in caplog.text


def test_in_place_reload_keeps_the_object(pki: Pki, tmp_path: Path) -> None:
    cert, key = tmp_path / "admin.pem", tmp_path / "admin.key"
    shutil.copy(pki.cert_path, cert)
    shutil.copy(pki.key_path, key)
    files = CertFiles(cert, key, names=("admin_tls_cert", "admin_tls_key"))
    reloading = ReloadingContext(
        "the admin API", _settings(pki), files, client_auth=False, in_place=True
    )
    before = reloading.context
    write_leaf(pki.ca.issue_cert("localhost"), cert, key)
    assert reloading.reload("SIGHUP") and reloading.context is before


# -- EXTERNAL ---------------------------------------------------------------------------


def test_certificate_login_is_the_first_common_name() -> None:
    subject = ((("organizationName", "acme"),), (("commonName", "app"),))
    assert certificate_login({"subject": subject}) == "app"
    assert certificate_login({"subject": ((("organizationName", "acme"),),)}) == ""


def _mechanisms(conn: ServerConnection) -> str:
    conn.receive_data(PROTOCOL_HEADER)
    [(_, start)] = parse(conn.data_to_send())
    assert isinstance(start, commands.Connection.Start)
    return str(start.mechanisms)


def test_external_is_offered_only_with_a_verified_certificate() -> None:
    assert _mechanisms(ServerConnection()) == "PLAIN AMQPLAIN"
    conn = ServerConnection(external_login="app")
    assert _mechanisms(conn) == "PLAIN AMQPLAIN EXTERNAL"
    [event] = conn.receive_data(start_ok(mechanism="EXTERNAL", response=""))
    assert isinstance(event, events.AuthRequested)
    assert (event.mechanism, event.username, event.password) == ("EXTERNAL", "app", b"")


def test_external_without_a_certificate_is_an_unknown_mechanism() -> None:
    conn = ServerConnection()
    _mechanisms(conn)
    [event] = conn.receive_data(start_ok(mechanism="EXTERNAL", response=""))
    assert isinstance(event, events.ConnectionClosed)
    assert event.reply_code == 503
    assert "unknown authentication mechanism 'EXTERNAL'" in event.reply_text
