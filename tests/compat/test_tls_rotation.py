"""Certificates replaced while the gateway runs (SIGHUP, changed files); IPv4 + IPv6 listening."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pika
import pytest

from bench.servers import free_port
from tests.compat.test_tls import (
    Pki,
    publish_and_get,
    server_serial,
    start_gateway,
    tls_params,
    write_leaf,
)
from tests.harness.processes import GatewayProcess, check_for


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


class Publisher(threading.Thread):
    """Publishes persistent messages with confirms over TLS until stopped; counts them."""

    def __init__(self, params: pika.ConnectionParameters, queue: str) -> None:
        super().__init__(daemon=True)
        self.params, self.queue = params, queue
        self.confirmed = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(self.params)
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare(self.queue, durable=True)
            while not self.stopping.is_set():
                body = b"%d" % self.confirmed
                channel.basic_publish("", self.queue, body, pika.BasicProperties(delivery_mode=2))
                self.confirmed += 1
            connection.close()
        except BaseException as error:
            self.error = error

    def wait_for(self, count: int) -> None:
        check_for(30, lambda: self.confirmed >= count or self.error is not None)
        assert self.error is None, repr(self.error)

    def finish(self) -> int:
        self.stopping.set()
        self.join(30)
        assert not self.is_alive() and self.error is None, repr(self.error)
        return self.confirmed


def test_certificate_rotation_under_load_with_sighup(tmp_path: Path, pki: Pki) -> None:
    extra = {"MQGW_ADMIN_TLS_CERT": str(pki.cert_path), "MQGW_ADMIN_TLS_KEY": str(pki.key_path)}
    gateway = start_gateway(tmp_path, pki, **extra)
    try:
        old, new = pki.serial(pki.server), pki.issue_server()
        assert server_serial(gateway.tls_port, pki) == old
        publisher = Publisher(tls_params(gateway, pki), "rotation")
        publisher.start()
        publisher.wait_for(200)
        write_leaf(new, pki.cert_path, pki.key_path)
        os.kill(gateway.pid, signal.SIGHUP)
        check_for(10, lambda: "reloaded (SIGHUP)" in gateway.log())
        assert server_serial(gateway.tls_port, pki) == pki.serial(new)
        assert server_serial(gateway.admin_port, pki) == pki.serial(new)  # HTTPS too
        # The connection opened with the old certificate keeps publishing.
        publisher.wait_for(publisher.confirmed + 200)
        sent = publisher.finish()
        assert gateway.proc is not None and gateway.proc.poll() is None
        connection = pika.BlockingConnection(tls_params(gateway, pki))
        declared = connection.channel().queue_declare("rotation", passive=True)
        assert declared.method.message_count == sent
        connection.close()
        for name in ("AMQP", "the admin API"):
            line = f"TLS certificate for {name} reloaded (SIGHUP)"
            check_for(10, lambda line=line: line in gateway.log())
    finally:
        gateway.stop()


def test_changed_files_are_picked_up_and_a_bad_pair_keeps_the_old_certificate(
    tmp_path: Path, pki: Pki
) -> None:
    gateway = start_gateway(tmp_path, pki)
    try:
        old, new = pki.serial(pki.server), pki.issue_server()
        # Only the certificate changes: it does not match the key, so nothing changes.
        new.cert_chain_pems[0].write_to_path(str(pki.cert_path))
        check_for(10, lambda: "not reloaded (files changed)" in gateway.log(), interval_s=0.2)
        assert server_serial(gateway.tls_port, pki) == old
        connection = pika.BlockingConnection(tls_params(gateway, pki))
        publish_and_get(connection, "during_bad_pair", 3)
        # Then the key follows: the next poll (every 2 s, no signal) loads the pair.
        time.sleep(0.05)  # a later mtime for the poll to notice, even on coarse clocks
        write_leaf(new, pki.cert_path, pki.key_path)
        check_for(10, lambda: server_serial(gateway.tls_port, pki) == pki.serial(new))
        check_for(10, lambda: "TLS certificate for AMQP reloaded (files changed)" in gateway.log())
        publish_and_get(connection, "after_reload", 3)  # opened before, still served
        connection.close()
    finally:
        gateway.stop()


def test_amqp_host_list_listens_on_ipv4_and_ipv6_loopback(tmp_path: Path, pki: Pki) -> None:
    """amqp_host = "127.0.0.1,::1": both families, one port each for AMQP and AMQPS. (The
    default, every interface, is checked without binding it in test_tls_units.py.)"""
    env = {**pki.env(free_port()), "MQGW_AMQP_HOST": "127.0.0.1,::1"}
    gateway = GatewayProcess(tmp_path / "data", env=env, host=None).start()
    try:
        amqp, tls = gateway.amqp_port, gateway.tls_port
        assert f"AMQP on 127.0.0.1:{amqp},[::1]:{amqp}, admin on off" in gateway.log()
        assert f"AMQPS on 127.0.0.1:{tls},[::1]:{tls}, data in" in gateway.log()
        for host in ("127.0.0.1", "::1"):
            credentials = pika.PlainCredentials("guest", "guest")  # loopback: guest is fine
            params = pika.ConnectionParameters(host=host, port=amqp, credentials=credentials)
            connection = pika.BlockingConnection(params)
            publish_and_get(connection, f"plain_{host}", 3)
            connection.close()
            connection = pika.BlockingConnection(tls_params(gateway, pki, host=host))
            publish_and_get(connection, f"tls_{host}", 3)
            connection.close()
            assert server_serial(tls, pki, host) == pki.serial(pki.server)
        check_for(10, lambda: "accepting AMQP connection ::1:" in gateway.log())
    finally:
        gateway.stop()
