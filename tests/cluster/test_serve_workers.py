"""`mqgw serve --workers 2` as a real process: Redis, a broker and two gateways on one AMQP
port (SO_REUSEPORT). Connections land on both workers (the server property cluster_name
names the worker), confirmed messages are delivered exactly once whoever published and
consumed them, a killed worker is restarted, SIGTERM stops every child, the data survives a
restart, and the children go by themselves when the parent is killed outright."""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from bench.servers import check_for, free_port
from mqgw_cli.admin_client import admin_call

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("redis", "broker", "w1", "w2")
_READY = re.compile(r"✓ (\S+)\s+pid (\d+)")


def gone(pid: int) -> bool:
    """No such process, or a zombie (nothing left but its exit status)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


class Workers:
    """`mqgw serve --workers 2` in ``data_dir``; its output is in ``data_dir``/../serve.out."""

    def __init__(self, data_dir: Path, amqp_port: int, admin_port: int) -> None:
        self.data_dir, self.amqp_port, self.admin_port = data_dir, amqp_port, admin_port
        self.out = data_dir.parent / "serve.out"
        self.proc: subprocess.Popen[bytes] | None = None
        self._seen = 0  # output bytes before this start

    def start(self, *flags: str) -> Workers:
        self._seen = self.out.stat().st_size if self.out.exists() else 0
        argv = [
            sys.executable, "-m", "mqgw_cli.main", "serve", "--workers", "2",
            "--data-dir", str(self.data_dir), "--amqp-host", "127.0.0.1",
            "--amqp-port", str(self.amqp_port), "--admin-port", str(self.admin_port), *flags,
        ]  # fmt: skip
        with self.out.open("ab") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        check_for(90, lambda: "workers ready on AMQP port" in self.output() or self._exited())
        assert "workers ready on AMQP port" in self.output(), self.output()
        return self

    def _exited(self) -> bool:
        assert self.proc is not None
        return self.proc.poll() is not None

    def output(self) -> str:
        return self.out.read_bytes()[self._seen :].decode(errors="replace")

    def pids(self) -> dict[str, int]:
        """Each child's latest pid, from the parent's ready lines."""
        return {name: int(pid) for name, pid in _READY.findall(self.output())}

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    def connect(self) -> tuple[pika.BlockingConnection, str]:
        """A connection to the one port, and the worker it landed on ("w1" or "w2")."""
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        name = str(conn._impl.server_properties["cluster_name"])
        return conn, name.rsplit("-", 1)[1]

    def connect_to(self, worker: str, tries: int = 64) -> pika.BlockingConnection:
        for _ in range(tries):
            conn, landed = self.connect()
            if landed == worker:
                return conn
            conn.close()
        raise AssertionError(f"{tries} connections and none landed on {worker}")

    def kill_all(self) -> None:
        """Teardown: whatever still runs, parent and children, by pid."""
        pids = list(self.pids().values())
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    made = Workers(tmp_path / "data", free_port(), free_port())
    try:
        yield made
    finally:
        made.kill_all()


def publish(conn: pika.BlockingConnection, queue: str, bodies: list[bytes]) -> None:
    """Persistent messages with publisher confirms: each basic_publish returns once it is
    confirmed (pika raises on a nack)."""
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))


def consume(
    conn: pika.BlockingConnection, queue: str, got: list[bytes], stop: threading.Event
) -> None:
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)

    def on_message(channel: object, method: object, properties: object, body: bytes) -> None:
        got.append(body)
        ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

    ch.basic_consume(queue, on_message)
    while not stop.is_set():
        conn.process_data_events(time_limit=0.1)
    conn.close()


def test_one_port_both_workers_and_every_confirmed_message_once(workers: Workers) -> None:
    workers.start()
    assert set(workers.pids()) == set(NAMES)
    # The kernel spreads connections to the one port over both workers.
    landed: dict[str, list[pika.BlockingConnection]] = collections.defaultdict(list)
    for _ in range(64):
        conn, worker = workers.connect()
        landed[worker].append(conn)
        if all(len(landed[w]) >= 3 for w in ("w1", "w2")):
            break
    assert all(len(landed[w]) >= 3 for w in ("w1", "w2")), {w: len(c) for w, c in landed.items()}

    declarer = landed["w1"][0]
    declarer.channel().queue_declare("work", durable=True)
    got: list[bytes] = []
    stop = threading.Event()
    consumers = [  # one consumer on each worker
        threading.Thread(target=consume, args=(landed[w][1], "work", got, stop))
        for w in ("w1", "w2")
    ]
    per_publisher = 150
    batches = {
        (w, i): [f"{w}-{i}-{n}".encode() for n in range(per_publisher)]
        for w in ("w1", "w2")
        for i in (0, 1)
    }
    publishers = [
        # Connection 0 on each worker (w1's declared the queue) and connection 2.
        threading.Thread(target=publish, args=(landed[w][2 * i], "work", bodies))
        for (w, i), bodies in batches.items()
    ]
    for thread in consumers + publishers:
        thread.start()
    for thread in publishers:
        thread.join(60)
        assert not thread.is_alive()
    confirmed = {body for bodies in batches.values() for body in bodies}
    try:
        check_for(60, lambda: confirmed <= set(got))
    finally:
        stop.set()
        for thread in consumers:
            thread.join(10)
    repeats = [body for body, count in collections.Counter(got).items() if count > 1]
    assert repeats == [] and set(got) == confirmed and len(got) == 4 * per_publisher


def test_a_killed_worker_is_restarted_and_the_other_keeps_serving(workers: Workers) -> None:
    workers.start()
    old = workers.pids()
    survivor = workers.connect_to("w2")
    os.kill(old["w1"], signal.SIGKILL)
    check_for(
        10, lambda: "w1 (pid" in workers.output() and "SIGKILL unexpectedly" in workers.output()
    )
    # The other worker's connection goes on: declare, publish with confirms, get back.
    ch = survivor.channel()
    ch.queue_declare("after-kill")
    publish(survivor, "after-kill", [b"still here"])
    method, _, body = ch.basic_get("after-kill", auto_ack=True)
    assert method is not None and body == b"still here"
    # The parent restarts w1 (after a 1 s backoff) and new connections reach it.
    check_for(60, lambda: workers.pids()["w1"] != old["w1"])
    assert re.search(r"✓ w1\s+pid \d+ .* ready again in", workers.output())
    assert gone(old["w1"])
    fresh = workers.connect_to("w1")
    fresh.channel().queue_declare("after-kill", passive=True)
    publish(fresh, "after-kill", [b"on the new w1"])
    check_for(10, lambda: ch.queue_declare("after-kill", passive=True).method.message_count == 1)
    fresh.close()
    survivor.close()


def test_sigterm_stops_every_child_and_a_restart_keeps_the_data(workers: Workers) -> None:
    workers.start()
    conn, _ = workers.connect()
    conn.channel().queue_declare("keep", durable=True)
    bodies = [f"m{n}".encode() for n in range(100)]
    publish(conn, "keep", bodies)
    conn.close()
    pids = workers.pids()
    assert workers.proc is not None
    workers.proc.send_signal(signal.SIGTERM)
    assert workers.proc.wait(60) == 0
    assert all(gone(pid) for pid in pids.values()), pids
    out = workers.output()
    order = [out.index(f"  {name}: stopped") for name in ("w1", "broker", "redis")]
    assert order == sorted(order), out  # workers, then the broker, then Redis

    workers.start()  # the same data directory
    conn, _ = workers.connect()
    ch = conn.channel()
    assert ch.queue_declare("keep", durable=True, passive=True).method.message_count == 100
    got = []
    for _ in bodies:
        method, _, body = ch.basic_get("keep", auto_ack=True)
        assert method is not None
        got.append(body)
    assert got == bodies
    conn.close()


def test_children_exit_by_themselves_when_the_parent_is_killed(workers: Workers) -> None:
    workers.start()
    pids = workers.pids()
    assert workers.proc is not None
    workers.proc.kill()
    workers.proc.wait()
    check_for(30, lambda: all(gone(pid) for pid in pids.values()))


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--workers", "0"], "give 2 or more"),
        (["--workers", "2", "--meta", "redis://127.0.0.1:1/0"], "--meta joins an existing"),
    ],
)
def test_bad_worker_flags_exit_2(tmp_path: Path, flags: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", "serve", "--data-dir", str(tmp_path), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_without_redis_server_on_the_path_it_names_the_package(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mqgw_cli.main",
            "serve",
            "--workers",
            "2",
            "--data-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": str(tmp_path)},
    )
    assert done.returncode == 2 and "apt-get install redis-server" in done.stderr, done.stderr


@pytest.mark.slow  # 33 s; the same totals over gateways run in the default tier
def test_a_global_throttle_totals_over_the_workers(workers: Workers) -> None:
    """A global limit of 400 msgs/s is 400 for both workers together (cluster shares,
    gateway/cluster/shares.py), each worker delivering its own queue; 800 before."""
    workers.start()
    on = {w: [workers.connect_to(w), workers.connect_to(w)] for w in ("w1", "w2")}
    queues = {"w1": "t-w1", "w2": "t-w2"}
    for worker, queue in queues.items():
        on[worker][0].channel().queue_declare(queue, durable=True)
        publish(on[worker][0], queue, [b"m"] * 4000)
    base = f"http://127.0.0.1:{workers.admin_port}"
    status, answer = admin_call(
        base, "PUT", "/api/controls/global", {"rate_msgs": 400}, "guest", "guest", timeout_s=30
    )
    assert status == 200, answer
    counts = dict.fromkeys(queues, 0)
    stop = threading.Event()

    def count(worker: str) -> None:
        conn = on[worker][1]
        ch = conn.channel()

        def on_message(channel: object, method: object, properties: object, body: bytes) -> None:
            counts[worker] += 1

        ch.basic_consume(queues[worker], on_message, auto_ack=True)
        while not stop.is_set():
            conn.process_data_events(time_limit=0.1)

    threads = [threading.Thread(target=count, args=(w,)) for w in queues]
    for thread in threads:
        thread.start()
    try:
        stop.wait(3.0)  # the shares settle within a few periods of 0.25 s
        before, started = sum(counts.values()), time.monotonic()
        stop.wait(6.0)
        rate = (sum(counts.values()) - before) / (time.monotonic() - started)
        each = dict(counts)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    print(f"global 400 msgs/s over two workers: {rate:.0f} msgs/s ({each})")
    assert all(n > 0 for n in each.values()), each  # both workers delivered
    assert abs(rate - 400) <= 40, f"{rate:.0f} msgs/s, not 400 ± 10 %"
