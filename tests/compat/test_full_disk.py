"""Full disk is a state, not a crash (RabbitMQ's behaviour): a gateway killed on a truly full
disk starts again, raises its disk alarm at once, lets a consumer drain every confirmed
message and a queue be deleted, and clears the alarm (publishing resumes, acks are written)
once space is free again, without a restart.

The disk is a 64 MiB tmpfs; where it cannot be mounted (not root) the gateway runs with a
fault layer instead (a sitecustomize written below: a directory of fixed capacity whose
writes fail with ENOSPC past it, and whose free space is what the disk alarm reads).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from bench.servers import free_port
from storage import QUEUE_GROUP
from tests.harness.processes import GatewayProcess, check_for
from tests.storage.test_full_disk_start_tmpfs import SmallDisk

DISK = 64 << 20
ROOM = 24 << 20  # what the gateway may fill; a filler file takes the rest
BODY = b"." * 60_000
PERSISTENT = pika.BasicProperties(delivery_mode=2)

FAULT_LAYER_SITE = '''
"""The gateway's disk is MQGW_FAKE_DISK_ROOT, of MQGW_FAKE_DISK_BYTES (test_full_disk.py)."""
import collections
import errno
import os
import shutil

import meta.metadata_file

_ROOT = os.environ["MQGW_FAKE_DISK_ROOT"]
_CAPACITY = int(os.environ["MQGW_FAKE_DISK_BYTES"])
_Usage = collections.namedtuple("_Usage", "total used free")


def _free():
    used = 0
    for directory, _, files in os.walk(_ROOT):
        for name in files:
            try:
                used += os.stat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                pass
    return max(0, _CAPACITY - used)


def _enospc():
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


_pwrite = os.pwrite


def pwrite(fd, data, offset):
    room = max(0, os.fstat(fd).st_size - offset) + _free()
    if room <= 0:
        raise _enospc()
    return _pwrite(fd, memoryview(data)[:room], offset)


_write_metadata = meta.metadata_file.write_file_atomically


def write_metadata(path, payload):
    if len(payload) > _free():
        raise _enospc()
    _write_metadata(path, payload)


os.pwrite = pwrite
shutil.disk_usage = lambda path: _Usage(_CAPACITY, _CAPACITY - _free(), _free())
meta.metadata_file.write_file_atomically = write_metadata
'''


def _env(disk: SmallDisk) -> dict[str, str]:
    env = {
        "MQGW_SEGMENT_SIZE_BYTES": str(4 << 20),
        "MQGW_MAX_MESSAGE_SIZE_BYTES": str(1 << 20),  # a segment must hold the largest message
        "MQGW_MIN_FREE_DISK_BYTES": str(1 << 20),
        "MQGW_CHECKPOINT_INTERVAL_MS": "200",
        "MQGW_OFFSET_PERSIST_INTERVAL_MS": "200",
        # Reclaim could free space by itself once the drained offsets are written: kept out
        # of the way, so that removing the filler is what clears the alarm here.
        "MQGW_RETENTION_CHECK_INTERVAL_MS": "3600000",
    }
    if not disk.mounted:
        site = disk.path.parent / "fault-layer-site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(FAULT_LAYER_SITE)
        path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
        env |= {
            "PYTHONPATH": path,
            "MQGW_FAKE_DISK_ROOT": str(disk.path),
            "MQGW_FAKE_DISK_BYTES": str(disk.size_bytes),
        }
    return env


def _publish_until_refused(url: str) -> tuple[list[int], str]:
    """Publish with confirms until a nack (the store is full) or the disk alarm blocks us;
    returns the confirmed sequence numbers and why publishing stopped."""
    params = pika.URLParameters(url)
    params.blocked_connection_timeout = 3
    conn = pika.BlockingConnection(params)
    blocked: list[bool] = []
    conn.add_on_connection_blocked_callback(lambda *_: blocked.append(True))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("orders", durable=True)
    ch.queue_declare("scratch", durable=True)
    for _ in range(5):
        ch.basic_publish("", "scratch", b"scratch", PERSISTENT)
    confirmed: list[int] = []
    stopped = "not stopped"
    try:
        for i in range(2 * DISK // len(BODY)):
            if blocked:
                stopped = "blocked"
                break
            ch.basic_publish("", "orders", b"%08d" % i + BODY, PERSISTENT)
            confirmed.append(i)
    except pika.exceptions.NackError:
        stopped = "nacked"
    except pika.exceptions.AMQPConnectionError:
        stopped = "blocked (timed out waiting)"
    if conn.is_open:
        conn.close()
    return confirmed, stopped


def _alarms(gateway: GatewayProcess) -> list[str]:
    status, health = gateway.admin("GET", "/api/health")
    assert status == 200
    return list(health["alarms"])


def _committed_total(data: Path) -> int:
    path = data / "store" / "offsets.json"
    if not path.exists():
        return 0
    groups = json.loads(path.read_bytes())["groups"]
    return sum(groups.get(QUEUE_GROUP, {}).values())


def _drain(ch: BlockingChannel, count: int) -> list[int]:
    ch.basic_qos(prefetch_count=200)
    got: list[int] = []
    for method, _props, body in ch.consume("orders", inactivity_timeout=10):
        assert method is not None, f"only {len(got)} of {count} arrived"
        got.append(int(body[:8]))
        ch.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    ch.cancel()
    return got


def test_a_gateway_killed_on_a_full_disk_starts_drains_deletes_and_recovers(
    tmp_path: Path,
) -> None:
    with SmallDisk(tmp_path / "disk", DISK) as disk:
        data = disk.path / "data"
        gateway = GatewayProcess(data, ["--admin-port", str(free_port())], env=_env(disk))
        try:
            gateway.start()
            disk.fill(leave_bytes=ROOM)
            confirmed, stopped = _publish_until_refused(gateway.url)
            assert stopped != "not stopped" and len(confirmed) > 100, stopped
            gateway.kill()  # SIGKILL
            filler = disk.fill()  # what the gateway left: the disk is truly full now
            assert disk.free() == 0

            gateway.start()  # starts on the full disk ...
            assert "disk" in _alarms(gateway)  # ... with its alarm raised at once
            assert "disk full: checkpoint not written, will retry" in gateway.log()
            with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
                ch = conn.channel()
                ready = ch.queue_declare("orders", passive=True).method.message_count
                received = _drain(ch, ready)
                assert len(received) == len(set(received)) == ready
                assert set(confirmed) <= set(received)  # every confirmed message arrives
                assert ch.queue_declare("orders", passive=True).method.message_count == 0
                assert ch.queue_delete("scratch").method.message_count == 5
            assert gateway.admin("GET", "/api/queues/%2F/scratch")[0] == 404
            assert "disk" in _alarms(gateway)  # the delete freed only its index pages

            filler.unlink()  # space is free again: no restart
            check_for(15, lambda: _alarms(gateway) == [])
            params = pika.URLParameters(gateway.url)
            params.blocked_connection_timeout = 10
            with pika.BlockingConnection(params) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                ch.basic_publish("", "orders", b"%08d" % 99_999_999 + b" after", PERSISTENT)
                assert _drain(ch, 1) == [99_999_999]
            # The acks made on the full disk (and this one) reach offsets.json.
            check_for(15, lambda: _committed_total(data) == len(received) + 1)
            log = gateway.log()
            assert "disk alarm cleared" in log
            assert "disk full: metadata not written, kept in memory, will retry" in log
            assert "disk space is back: metadata written" in log  # the queue delete

            gateway.kill()  # nothing consumed or deleted comes back after a crash
            gateway.start()
            assert _alarms(gateway) == []
            with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
                ch = conn.channel()
                assert ch.queue_declare("orders", passive=True).method.message_count == 0
                with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="scratch"):
                    ch.queue_declare("scratch", passive=True)
        finally:
            gateway.stop()
