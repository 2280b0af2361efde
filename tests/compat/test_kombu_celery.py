"""kombu and a real Celery worker (acks_late, a retry) against the gateway."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import kombu

from tests.harness.processes import REPO, GatewayProcess, check_for, die_with_parent


def test_kombu_producer_and_consumer(gateway: GatewayProcess) -> None:
    exchange = kombu.Exchange("kombu_ex", type="direct", durable=True)
    queue = kombu.Queue("kombu_q", exchange, routing_key="k")
    received: list[object] = []
    with kombu.Connection(gateway.url) as conn:
        producer = conn.Producer()
        for i in range(5):
            producer.publish(
                {"n": i},
                exchange=exchange,
                routing_key="k",
                declare=[queue],
                serializer="json",
                retry=True,
            )

        def on_message(body: object, message: kombu.Message) -> None:
            received.append(body)
            message.ack()

        with conn.Consumer(queue, callbacks=[on_message]):
            while len(received) < 5:
                conn.drain_events(timeout=5)
    assert received == [{"n": i} for i in range(5)]


CELERY_APP = """
import os
from celery import Celery

app = Celery("tasks", broker=os.environ["BROKER_URL"], backend="rpc://")
app.conf.task_acks_late = True
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_prefetch_multiplier = 1

@app.task(bind=True, max_retries=3, default_retry_delay=0.1)
def add(self, x, y):
    marker = os.path.join(os.environ["MARKER_DIR"], f"{x}-{y}")
    if not os.path.exists(marker):  # fail the first attempt: exercise retry
        open(marker, "w").close()
        raise self.retry(exc=RuntimeError("first attempt fails"))
    return x + y
"""


def test_celery_worker_round_trip_with_acks_late_and_retry(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    (tmp_path / "tasks.py").write_text(textwrap.dedent(CELERY_APP))
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {
        **os.environ,
        "BROKER_URL": gateway.url,
        "MARKER_DIR": str(markers),
        "PYTHONPATH": f"{tmp_path}:{REPO}",
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "worker",
            "--pool=solo",
            "--concurrency=1",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
            "--loglevel=WARNING",
        ],
        cwd=tmp_path,
        env=env,
        preexec_fn=die_with_parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = subprocess.run(
            [
                sys.executable,
                "-c",
                "from tasks import add; r = add.delay(2, 3); print(r.get(timeout=30))",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert client.stdout.strip() == "5", client.stderr
        assert (markers / "2-3").exists()  # the first attempt ran and asked for a retry
    finally:
        worker.terminate()
        output = worker.communicate(timeout=30)[0]
    assert "Traceback" not in output or "Retry" in output, output
    check_for(5, lambda: worker.returncode is not None)
