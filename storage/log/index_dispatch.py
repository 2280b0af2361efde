"""A batch's index entries into its queues' consume queues: the dispatch step of the append
path (storage/log/appending.py), one consume-queue append per destination of each run.

For each destination it notes what a rollback needs (``undo``: the consume queue, its end
and its last commit offset before) and where the queue's new entries start (``starts``, the
first run's), then appends; ``defer`` lets transient entries wait in memory (the consume
queue's write-behind). This pure module is the reference and calls ``ConsumeQueue.append``;
its compiled twin (speedups/mqgw_speedups/index_dispatch.pyx, picked by storage/twins.py)
does the deferred append itself for a ConsumeQueue whose tail has room, as the method would,
and calls the method otherwise. tests/storage/test_index_dispatch_twins.py holds the two
equal on real consume queues.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage import twins
from storage.record import CQ_ENTRY, CQ_ENTRY_SIZE, Destination, DispatchRun

if TYPE_CHECKING:
    from storage.log.consume_queue import ConsumeQueue


def dispatch(
    cqs: dict[Destination, ConsumeQueue],
    runs: list[DispatchRun],
    undo: list[tuple[ConsumeQueue, int, int]],
    starts: dict[Destination, int],
    defer: bool,
) -> None:
    """Append each run's entries to each of its destinations' consume queues (a queue
    deleted since routing has none: skipped). Raises OSError from a write."""
    for destinations, entries, _ in runs:
        last_commit = CQ_ENTRY.unpack_from(entries, len(entries) - CQ_ENTRY_SIZE)[0]
        for destination in destinations:
            cq = cqs.get(destination)
            if cq is None:
                continue  # queue deleted between routing and append: nothing to index
            undo.append((cq, cq.max_offset, cq.last_commit_offset))
            starts.setdefault(destination, cq.max_offset)
            cq.append(entries, last_commit, defer)


picked = twins.pick(dispatch)  # what Appending uses
