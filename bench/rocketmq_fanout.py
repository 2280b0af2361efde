"""`python -m bench.rocketmq_fanout --dir D`: how to write a message fanned out to N queues
into RocketMQ, measured on a running `mqgw rocketmq up --dir D` (docs/rocketmq.md, "Choices").

- **per-queue batches** (what the store does): each publish batch of ``--batch`` records is
  one SEND_BATCH_MESSAGE per destination topic, the N sends at once, one in flight per topic
  (a partition's order).
- **multi-dispatch**: every record is one SEND_MESSAGE_V2 to a carrier topic with
  ``INNER_MULTI_DISPATCH`` naming N light queues (LMQ), the broker's one write shared by
  the N. RocketMQ 5.3.3 assigns LMQ offsets only on its single-message path (a batch send is
  stored but never dispatched to the LMQs), so each record is a request of its own; with the
  broker's send threads free to reorder requests, a partition's order allows one in flight,
  ``--window`` more only where order does not matter.

Figures per way: records/s, the broker JVM's CPU seconds per 100k records, and the ends of
the N queues afterwards (each must hold every record: the check that a way really wrote
them). A line per way as it finishes, and a table at the end.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from rich.console import Console
from rich.table import Table

from bench.processes import tree_cpu_s
from storage.rocketmq.client import SYSTEM_BUSY, RocketMQClient, RocketMQError, send_header
from storage.rocketmq.connection import open_pool
from storage.rocketmq.messages import batch_body, encode_properties
from storage.rocketmq.remoting import request

SEND_MESSAGE_V2 = 310  # a single message: the only send RocketMQ dispatches to LMQs
LMQ = "%LMQ%"
console = Console(stderr=True, highlight=False)


async def _again_while_busy(call: Callable[[], Awaitable[object]]) -> None:
    """``call`` until the broker's flow control lets it through, as the store sends again."""
    while True:
        try:
            await call()
            return
        except RocketMQError as error:
            if error.code != SYSTEM_BUSY:
                raise
            await anyio.sleep(0.01)


async def _send_one(client: RocketMQClient, broker: str, topic: str, props: str,
                    body: bytes) -> None:  # fmt: skip
    fields = send_header(topic, 0, int(time.time() * 1000), batch=False, properties=props)
    command = request(SEND_MESSAGE_V2, fields, body)
    await _again_while_busy(lambda: client._call(broker, command, f"send to {topic}"))


async def per_queue_batches(client: RocketMQClient, broker: str, tag: str, fanout: int,
                            records: int, batch: int, body: bytes) -> list[str]:  # fmt: skip
    topics = [f"{tag}_q{i}" for i in range(fanout)]
    for topic in topics:
        await client.create_topic(broker, topic, 1)
    props = encode_properties({"MQGW_X": "fan"}).encode()
    chunk = batch_body([(props, body)] * batch)
    for _ in range(records // batch):
        async with anyio.create_task_group() as tg:
            for topic in topics:
                tg.start_soon(_again_while_busy, lambda t=topic: client.send_batch(
                    broker, t, 0, chunk, int(time.time() * 1000)))  # fmt: skip
    return topics


async def multi_dispatch(client: RocketMQClient, broker: str, tag: str, fanout: int,
                         records: int, window: int, body: bytes) -> list[str]:  # fmt: skip
    carrier = f"{tag}_carrier"
    await client.create_topic(broker, carrier, 1)
    lmqs = [f"{LMQ}{tag}_q{i}" for i in range(fanout)]
    props = encode_properties({"MQGW_X": "fan", "INNER_MULTI_DISPATCH": ",".join(lmqs)})
    slots = anyio.Semaphore(window)

    async def one() -> None:
        try:
            await _send_one(client, broker, carrier, props, body)
        finally:
            slots.release()

    async with anyio.create_task_group() as tg:
        for _ in range(records):
            await slots.acquire()
            tg.start_soon(one)
    return lmqs


Queues = Callable[[], Awaitable[list[str]]]
Ends = Callable[[list[str]], Awaitable[list[int]]]


async def _measure(
    name: str, broker_pid: int, records: int, run: Queues, ends: Ends
) -> dict[str, object]:
    cpu0, t0 = tree_cpu_s(broker_pid), time.perf_counter()
    queues = await run()
    elapsed = time.perf_counter() - t0
    await anyio.sleep(0.5)  # the broker's dispatch indexes a moment after acknowledging
    cpu = tree_cpu_s(broker_pid) - cpu0
    found = await ends(queues)
    row = {"way": name, "records": records, "records_per_s": round(records / elapsed),
           "broker_cpu_s_per_100k": round(cpu / records * 100_000, 2),
           "queue_ends": sorted(set(found))}  # fmt: skip
    rate, cpu_per = row["records_per_s"], row["broker_cpu_s_per_100k"]
    console.print(f"{name}: {rate:,} records/s, broker CPU {cpu_per} s per 100k, "
                  f"queue ends {row['queue_ends']}")  # fmt: skip
    return row


async def compare(directory: Path, fanout: int, records: int, batch: int, window: int,
                  size: int, rounds: int) -> list[dict[str, object]]:  # fmt: skip
    layout = json.loads((directory / "rocketmq.json").read_text())
    (broker,) = [p for p in layout["processes"] if p["role"] == "broker"]
    address, pid = f"127.0.0.1:{broker['ports']['listen']}", int(broker["pid"])
    body = bytes(size)
    rows = []
    async with open_pool() as pool:
        client = RocketMQClient(pool, [layout["namesrv"]], timeout_s=30)

        async def ends(queues: list[str]) -> list[int]:
            return [await client.max_offset(address, q, 0) for q in queues]

        def ways(tag: str) -> list[tuple[str, Queues]]:
            return [
                (f"per-queue batches of {batch}", lambda: per_queue_batches(
                    client, address, tag + "b", fanout, records, batch, body)),
                ("multi-dispatch, 1 in flight (order kept)", lambda: multi_dispatch(
                    client, address, tag + "m1", fanout, records, 1, body)),
                (f"multi-dispatch, {window} in flight (order not kept)", lambda: multi_dispatch(
                    client, address, tag + "mw", fanout, records, window, body)),
            ]  # fmt: skip

        # The first round warms the broker's JIT up; the table gives the last.
        for n in range(rounds):
            console.print(f"round {n + 1} of {rounds}")
            rows = [await _measure(name, pid, records, run, ends)
                    for name, run in ways(f"fan{uuid.uuid4().hex[:8]}")]  # fmt: skip
    table = Table(title=f"fan-out to {fanout} queues, {records:,} records of {size} B")
    for column in ("way", "records/s", "broker CPU s / 100k", "queue ends"):
        table.add_column(column)
    for row in rows:
        table.add_row(str(row["way"]), f"{row['records_per_s']:,}",
                      str(row["broker_cpu_s_per_100k"]), str(row["queue_ends"]))  # fmt: skip
    console.print(table)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="a `mqgw rocketmq up` directory")
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=64, help="records per publish batch")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rows = anyio.run(compare, args.dir, args.fanout, args.records, args.batch, args.window,
                     args.size, args.rounds)  # fmt: skip
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
