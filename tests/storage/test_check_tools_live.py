"""`mqgw storage check|repair` against a real gateway: refused while it runs (exit 2, the
holder's pid, not a byte changed), accepted on the same data dir once it has stopped; and the
live copy docs/operations.md describes restores every message confirmed before it began."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pika

from tests.harness.processes import GatewayProcess
from tests.storage.test_check_tools import run_mqgw, snapshot


def _settled(store: Path) -> dict[str, bytes]:
    """The store's files once the node's own periodic writes (checkpoint, offsets) are done."""
    before = snapshot(store)
    for _ in range(20):
        time.sleep(1.2)  # checkpoints run every second
        now = snapshot(store)
        if now == before:
            return now
        before = now
    raise AssertionError("the node kept changing its store")


def test_tools_are_refused_while_a_gateway_runs_and_work_once_it_stopped(tmp_path: Path) -> None:
    data = tmp_path / "data"
    process = GatewayProcess(data).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(process.url))
        channel = conn.channel()
        channel.confirm_delivery()
        channel.queue_declare("orders", durable=True)
        for i in range(20):
            props = pika.BasicProperties(delivery_mode=2)
            channel.basic_publish("", "orders", b"order %d" % i, props)
        conn.close()
        before = _settled(data / "store")
        for command in ("repair", "check"):
            for path in (data, data / "store"):
                result = run_mqgw("storage", command, str(path))
                assert result.returncode == 2, result
                assert "Traceback" not in result.stderr
                assert (
                    f"the store at {data / 'store'} is in use by a running node "
                    f"(pid {process.pid})" in result.stderr
                )
                assert result.stdout == ""  # nothing was scanned
        assert snapshot(data / "store") == before  # the same bytes: nothing was touched
    finally:
        exit_code = process.stop()
    assert exit_code == 0

    for command in ("check", "repair", "check"):
        result = run_mqgw("storage", command, str(data))
        assert result.returncode == 0, result
        assert "ok: no damaged records" in result.stdout

    process.start()  # the repaired store opens and still holds every message
    try:
        conn = pika.BlockingConnection(pika.URLParameters(process.url))
        channel = conn.channel()
        assert channel.queue_declare("orders", passive=True).method.message_count == 20
        _, _, body = channel.basic_get("orders", auto_ack=True)
        assert body == b"order 0"
        conn.close()
    finally:
        process.stop()


def _live_copy(src: Path, dst: Path) -> None:
    """docs/operations.md's order: store JSON files, consume queues, commitlog, metadata."""
    (dst / "store").mkdir(parents=True)
    (dst / "meta").mkdir()
    for name in ("layout.json", "checkpoint.json", "offsets.json", "queues.json"):
        if (src / "store" / name).exists():
            shutil.copy2(src / "store" / name, dst / "store" / name)
    shutil.copytree(src / "store" / "consumequeue", dst / "store" / "consumequeue")
    time.sleep(0.2)  # publishes go on between the steps
    shutil.copytree(src / "store" / "commitlog", dst / "store" / "commitlog")
    time.sleep(0.2)
    shutil.copy2(src / "meta" / "metadata.json", dst / "meta" / "metadata.json")


def test_a_live_copy_in_the_documented_order_restores_every_confirmed_message(
    tmp_path: Path,
) -> None:
    process = GatewayProcess(tmp_path / "data").start()
    stop = threading.Event()
    confirmed = [0]

    def publish() -> None:
        conn = pika.BlockingConnection(pika.URLParameters(process.url))
        channel = conn.channel()
        channel.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        while not stop.is_set():
            channel.basic_publish("", "orders", b"%08d" % confirmed[0] + b"x" * 1000, props)
            confirmed[0] += 1
            if confirmed[0] % 100 == 0:  # queues declared during the copy too
                channel.queue_declare(f"side{confirmed[0]}", durable=True)
        conn.close()

    try:
        conn = pika.BlockingConnection(pika.URLParameters(process.url))
        conn.channel().queue_declare("orders", durable=True)
        conn.close()
        publisher = threading.Thread(target=publish)
        publisher.start()
        try:
            time.sleep(1.0)
            before_copy = confirmed[0]
            _live_copy(tmp_path / "data", tmp_path / "copy")
        finally:
            stop.set()
            publisher.join()
    finally:
        process.stop()
    assert before_copy > 0

    assert run_mqgw("storage", "check", str(tmp_path / "copy")).returncode == 0
    restored = GatewayProcess(tmp_path / "copy").start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(restored.url))
        channel = conn.channel()
        count = channel.queue_declare("orders", passive=True).method.message_count
        assert before_copy <= count <= confirmed[0]
        bodies = [channel.basic_get("orders", auto_ack=True)[2] for _ in range(count)]
        assert [int(body[:8]) for body in bodies] == list(range(count))  # in order, no gap
        conn.close()
    finally:
        restored.stop()
