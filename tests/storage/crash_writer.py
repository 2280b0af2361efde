"""Run as a subprocess by test_crash: appends with sync flush, prints each completed batch."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from storage import FlushPolicy, Record, StoreConfig, open_embedded_store


async def main(data_dir: str, start: int) -> None:
    config = StoreConfig(
        Path(data_dir),
        segment_size_bytes=64 << 10,
        cq_entries_per_segment=256,
        max_record_bytes=8 << 10,
        flush=FlushPolicy.SYNC,
        checkpoint_interval_ms=30,
    )
    async with open_embedded_store(config) as store:
        for q in range(3):
            await store.create_queue(q, 2)
        n = start
        while True:
            batch = []
            for i in range(1 + n % 7):
                seq = n + i
                dest = ((seq % 3, seq % 2),)
                batch.append(Record(b"x", b"k", b"", b"%d." % seq + b"p" * (seq % 300), dest))
            await store.append(batch)
            print(n, len(batch), flush=True)
            n += len(batch)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
