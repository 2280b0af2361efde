"""Users and vhosts from the config file; durable vs transient across a restart."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tests.harness.processes import GatewayProcess


def test_users_and_vhosts_come_from_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "mqgw.toml"
    config.write_text('vhosts = ["/", "orders"]\n[[users]]\nname = "app"\npassword = "s3cret"\n')
    process = GatewayProcess(tmp_path / "data", args=["--config", str(config)]).start()
    try:
        url = f"amqp://app:s3cret@127.0.0.1:{process.amqp_port}/orders"
        conn = pika.BlockingConnection(pika.URLParameters(url))
        assert conn.channel().queue_declare("in_orders").method.queue == "in_orders"
        conn.close()
        bad = f"amqp://app:wrong@127.0.0.1:{process.amqp_port}/orders"
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika.URLParameters(bad))
        # The configured users replace the default: guest is not there any more.
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika.URLParameters(process.url))
    finally:
        process.stop()


def test_transient_things_vanish_on_restart_durable_ones_stay(tmp_path: Path) -> None:
    process = GatewayProcess(tmp_path / "data").start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(process.url))
        ch = conn.channel()
        ch.exchange_declare("keep_x", "direct", durable=True)
        ch.exchange_declare("lose_x", "direct", durable=False)
        ch.queue_declare("keep_q", durable=True)
        ch.queue_declare("lose_q", durable=False)
        ch.queue_bind("keep_q", "keep_x", "k")
        ch.basic_publish("keep_x", "k", b"persistent", pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", "lose_q", b"gone")
        conn.close()
        process.stop()
        process.start()
        conn = pika.BlockingConnection(pika.URLParameters(process.url))
        ch = conn.channel()
        ch.exchange_declare("keep_x", "direct", passive=True)
        assert ch.queue_declare("keep_q", passive=True).method.message_count == 1
        ch.basic_publish("keep_x", "k", b"again")  # the binding survived too
        assert ch.queue_declare("keep_q", passive=True).method.message_count == 2
        for name, method in (("lose_x", "exchange_declare"), ("lose_q", "queue_declare")):
            ch = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                getattr(ch, method)(name, passive=True)
            assert info.value.reply_code == 404
        conn.close()
    finally:
        process.stop()
