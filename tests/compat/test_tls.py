"""AMQP over TLS (pika, aio-pika, kombu, Node amqplib), client certificates, EXTERNAL, HTTPS.

A private CA made with trustme signs the server certificate (localhost, 127.0.0.1, ::1) and
the client certificates (CN = the user name). Gateways are real processes on loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import kombu
import pika
import pytest
import trustme
from cryptography import x509

from bench.servers import free_port
from gateway.amqp.frame_reader import PROTOCOL_HEADER
from tests.gateway.amqp.helpers import parse
from tests.harness.processes import REPO, GatewayProcess, check_for, die_with_parent

NODE_DIR = Path(__file__).parent / "node"


def write_leaf(leaf: trustme.LeafCert, cert_path: Path, key_path: Path) -> None:
    """Replace the files atomically (write aside, rename), key first, as a deploy tool does."""
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
    for path, data in ((key_path, leaf.private_key_pem.bytes()), (cert_path, chain)):
        aside = path.with_name(path.name + ".new")
        aside.write_bytes(data)
        os.replace(aside, path)


class Pki:
    """A CA, the server's certificate files, client certificates and client contexts."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA()
        self.ca_path = directory / "ca.pem"
        self.cert_path = directory / "server.pem"
        self.key_path = directory / "server.key"
        self.ca.cert_pem.write_to_path(str(self.ca_path))
        self.server = self.issue_server()
        write_leaf(self.server, self.cert_path, self.key_path)

    def issue_server(self) -> trustme.LeafCert:
        return self.ca.issue_cert("localhost", "127.0.0.1", "::1")

    def client(self, common_name: str) -> trustme.LeafCert:
        return self.ca.issue_cert(f"{common_name}.clients.test", common_name=common_name)

    def context(self, client: trustme.LeafCert | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if client is not None:
            client.configure_cert(context)
        return context

    def env(self, tls_port: int, **extra: str) -> dict[str, str]:
        return {
            "MQGW_TLS_PORT": str(tls_port),
            "MQGW_TLS_CERT": str(self.cert_path),
            "MQGW_TLS_KEY": str(self.key_path),
            "MQGW_TLS_CA": str(self.ca_path),
            "MQGW_TLS_VERIFY": "peer",
            **extra,
        }

    @staticmethod
    def serial(leaf: trustme.LeafCert) -> int:
        return x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).serial_number


def start_gateway(tmp_path: Path, pki: Pki, **extra: str) -> GatewayProcess:
    args = ["--admin-port", str(free_port())]
    gateway = GatewayProcess(tmp_path / "data", args, env=pki.env(free_port(), **extra)).start()
    assert gateway.tls_port, gateway.log()
    return gateway


def tls_params(
    gateway: GatewayProcess,
    pki: Pki,
    client: trustme.LeafCert | None = None,
    credentials: pika.credentials.PlainCredentials
    | pika.credentials.ExternalCredentials
    | None = None,
    host: str = "127.0.0.1",
) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host=host,
        port=gateway.tls_port,
        credentials=credentials or pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(pki.context(client), "localhost"),
        connection_attempts=1,
    )


def _start_frame(sock: socket.socket | ssl.SSLSocket) -> object:
    sock.sendall(PROTOCOL_HEADER)
    data = b""
    while len(data) < 7 or len(data) < struct.unpack(">I", data[3:7])[0] + 8:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before connection.start"
        data += chunk
    [(_channel, start)] = parse(data)
    return start


def offered_mechanisms(port: int, context: ssl.SSLContext | None = None) -> str:
    """The mechanisms of connection.start, over TLS when ``context`` is given."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        if context is None:
            return str(_start_frame(raw).mechanisms)  # type: ignore[attr-defined]
        with context.wrap_socket(raw, server_hostname="localhost") as sock:
            return str(_start_frame(sock).mechanisms)  # type: ignore[attr-defined]


def server_serial(port: int, pki: Pki, host: str = "127.0.0.1") -> int:
    """The serial number of the certificate a new TLS connection is given."""
    with (
        socket.create_connection((host, port), timeout=10) as raw,
        pki.context().wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        certificate = sock.getpeercert()
        assert certificate is not None
        return int(str(certificate["serialNumber"]), 16)


def publish_and_get(connection: pika.BlockingConnection, queue: str, count: int = 10) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for i in range(count):
        channel.basic_publish("", queue, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    bodies = []
    for method, _props, body in channel.consume(queue, inactivity_timeout=10):
        assert method is not None, "no delivery within 10 s"
        channel.basic_ack(method.delivery_tag)
        bodies.append(body)
        if len(bodies) == count:
            break
    channel.cancel()
    assert bodies == [b"m%d" % i for i in range(count)]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


@pytest.fixture
def tls_gateway(tmp_path: Path, pki: Pki) -> Iterator[GatewayProcess]:
    """tls_verify = peer: a client certificate is optional, verified if sent."""
    gateway = start_gateway(tmp_path, pki)
    yield gateway
    gateway.stop()


def test_pika_over_tls(tls_gateway: GatewayProcess, pki: Pki) -> None:
    connection = pika.BlockingConnection(tls_params(tls_gateway, pki))
    publish_and_get(connection, "pika_tls")
    connection.close()
    assert server_serial(tls_gateway.tls_port, pki) == pki.serial(pki.server)
    plain = pika.BlockingConnection(pika.URLParameters(tls_gateway.url))  # still there
    publish_and_get(plain, "pika_plain")
    plain.close()


def test_tls_and_external_on_trio(tmp_path: Path, pki: Pki) -> None:
    args = ["--backend", "trio"]
    gateway = GatewayProcess(tmp_path / "data", args, env=pki.env(free_port())).start()
    try:
        guest = pki.client("guest")
        external = pika.credentials.ExternalCredentials()
        connection = pika.BlockingConnection(tls_params(gateway, pki, guest, external))
        publish_and_get(connection, "trio_tls", 5)
        connection.close()
    finally:
        gateway.stop()


def test_aio_pika_over_tls(tls_gateway: GatewayProcess, pki: Pki) -> None:
    async def main() -> list[bytes]:
        url = f"amqps://guest:guest@127.0.0.1:{tls_gateway.tls_port}/"
        connection = await aio_pika.connect(url, ssl_context=pki.context())
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue("aio_tls", durable=True)
            for i in range(10):
                await channel.default_exchange.publish(aio_pika.Message(b"a%d" % i), "aio_tls")
            received = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        received.append(message.body)
                    if len(received) == 10:
                        break
            return received

    assert asyncio.run(asyncio.wait_for(main(), 60)) == [b"a%d" % i for i in range(10)]


def test_kombu_over_tls(tls_gateway: GatewayProcess, pki: Pki) -> None:
    options = {
        "ca_certs": str(pki.ca_path),
        "cert_reqs": ssl.CERT_REQUIRED,
        "server_hostname": "localhost",
    }
    url = f"amqp://guest:guest@127.0.0.1:{tls_gateway.tls_port}//"
    with kombu.Connection(url, ssl=options, connect_timeout=10) as connection:
        queue = connection.SimpleQueue("kombu_tls")
        for i in range(5):
            queue.put({"n": i})
        received = []
        for _ in range(5):
            message = queue.get(timeout=10)
            received.append(message.payload["n"])
            message.ack()
        queue.close()
    assert received == list(range(5))


def test_node_amqplib_over_tls(tls_gateway: GatewayProcess, pki: Pki) -> None:
    assert (NODE_DIR / "node_modules" / "amqplib").is_dir(), "run scripts/setup-dev first"
    url = f"amqps://guest:guest@localhost:{tls_gateway.tls_port}/%2F"
    result = subprocess.run(
        ["node", "publish_consume.js", url, "20"],
        cwd=NODE_DIR,
        env={**os.environ, "NODE_EXTRA_CA_CERTS": str(pki.ca_path)},
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=die_with_parent,
    )
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["received"] == [{"body": f"n{i}", "i": i} for i in range(20)]


def test_external_login_with_a_client_certificate(tls_gateway: GatewayProcess, pki: Pki) -> None:
    assert tls_gateway.admin("PUT", "/api/users/app", {"password": "unused", "tags": ""})[0] < 300
    permission = {"configure": ".*", "write": ".*", "read": ".*"}
    assert tls_gateway.admin("PUT", "/api/permissions/%2F/app", permission)[0] < 300
    app = pki.client("app")
    # EXTERNAL is offered only on TLS with a verified client certificate.
    assert offered_mechanisms(tls_gateway.amqp_port) == "PLAIN AMQPLAIN"
    assert offered_mechanisms(tls_gateway.tls_port, pki.context()) == "PLAIN AMQPLAIN"
    with_cert = offered_mechanisms(tls_gateway.tls_port, pki.context(app))
    assert with_cert == "PLAIN AMQPLAIN EXTERNAL"

    external = pika.credentials.ExternalCredentials()
    connection = pika.BlockingConnection(tls_params(tls_gateway, pki, app, external))
    publish_and_get(connection, "external_q", 3)
    status, listed = tls_gateway.admin("GET", "/api/connections")
    assert status == 200 and [c["user"] for c in listed] == ["app"]
    connection.close()

    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(tls_params(tls_gateway, pki, pki.client("nobody"), external))
    assert "ACCESS_REFUSED" in str(info.value)
    refused = "login refused: user 'nobody' - invalid credentials"
    check_for(10, lambda: refused in tls_gateway.log())  # the log is read by another thread
    # A certificate does not stand in for a password on PLAIN.
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        wrong = pika.PlainCredentials("app", "wrong")
        pika.BlockingConnection(tls_params(tls_gateway, pki, app, wrong))


def test_client_without_certificate_is_refused_when_one_is_required(
    tmp_path: Path, pki: Pki
) -> None:
    gateway = start_gateway(tmp_path, pki, MQGW_TLS_FAIL_IF_NO_PEER_CERT="true")
    try:
        with_cert = pika.BlockingConnection(tls_params(gateway, pki, pki.client("guest")))
        channel = with_cert.channel()
        channel.queue_declare("kept")
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(tls_params(gateway, pki))
        with socket.create_connection(("127.0.0.1", gateway.tls_port), timeout=10) as raw:
            raw.sendall(PROTOCOL_HEADER)  # plain AMQP on the TLS port
            raw.settimeout(10)
            assert raw.recv(100) == b""
        check_for(10, lambda: gateway.log().count("TLS handshake with 127.0.0.1:") >= 2)
        assert "failed" in gateway.log()
        # The connection that was open, and the plain listener, carry on.
        channel.basic_publish("", "kept", b"still here")
        assert channel.queue_declare("kept", passive=True).method.message_count == 1
        with_cert.close()
        plain = pika.BlockingConnection(pika.URLParameters(gateway.url))
        publish_and_get(plain, "plain_q", 3)
        plain.close()
    finally:
        gateway.stop()


def test_admin_api_over_https(tmp_path: Path, pki: Pki) -> None:
    extra = {"MQGW_ADMIN_TLS_CERT": str(pki.cert_path), "MQGW_ADMIN_TLS_KEY": str(pki.key_path)}
    gateway = start_gateway(tmp_path, pki, **extra)
    try:
        assert f"admin on 127.0.0.1:{gateway.admin_port} (https)" in gateway.log()
        url = f"https://127.0.0.1:{gateway.admin_port}/api/health"
        with urllib.request.urlopen(url, context=pki.context(), timeout=10) as response:
            assert response.status == 200
            assert json.loads(response.read())["status"] == "ok"
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(url.replace("https", "http"), timeout=10)
        assert server_serial(gateway.admin_port, pki) == pki.serial(pki.server)
    finally:
        gateway.stop()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MQGW_TLS_PORT": "5671"}, "tls_port is 5671 but tls_cert is not set"),
        ({"MQGW_ADMIN_TLS_CERT": "/tmp/x.pem"}, "admin_tls_key is not set"),
    ],
)
def test_tls_settings_that_cannot_work_stop_the_start(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", "serve", "--host", "127.0.0.1",
         "--amqp-port", "0", "--admin-port", "0", "--data-dir", str(tmp_path / "data")],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=die_with_parent,
    )  # fmt: skip
    assert result.returncode != 0
    assert message in result.stderr
