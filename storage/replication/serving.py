"""A replicated master's side of its slaves' calls (op REPLICATE, storage/wire/replication.py).

``serve_epochs`` hands a slave the master's epoch file and log end (to find where the logs
part); ``serve_fetch`` takes a slave's acknowledgement (the offset durable there, and the
promise it makes for the master's standing), holds the fetch while nothing is new, and answers
with the next commitlog chunk (storage/replication/replica_log.py), the ids of the batches it
holds, the queue registry when the slave's is behind, and the offsets and fencing tokens
changed since its last fetch.
"""

from __future__ import annotations

from typing import Any

import anyio

from storage.errors import NotMaster, StoreError
from storage.replication.replica_log import read_chunk
from storage.replication.role import ReplicaRole
from storage.wire.replication import Replicated


class SlaveServing(ReplicaRole):
    """The REPLICATE calls a master answers (see the module doc)."""

    def serve_epochs(self, head: dict[str, Any]) -> Replicated:
        if self.role != "master" or head.get("epoch") != self.role_epoch:
            raise NotMaster(f"broker {self.me} is not master at epoch {head.get('epoch')}")
        answer = {"epochs": self.state.epochs, "end": self.log.commit_log.write_offset}
        return Replicated(answer, b"")

    async def serve_fetch(self, head: dict[str, Any]) -> Replicated:
        """A slave's fetch: its acknowledgement (``offset``, durable there) and the next chunk,
        held up to ``wait_ms`` when there is nothing new."""
        epoch, replica, offset = int(head["epoch"]), str(head["id"]), int(head["offset"])
        if self.role != "master" or epoch != self.role_epoch:
            raise NotMaster(f"broker {self.me} is not master at epoch {epoch}")
        end = self.log.commit_log.write_offset
        if offset > end:
            raise StoreError(f"replica {replica} at {offset} is past this log's end {end}")
        if head.get("grant") and not self.fenced_version:
            self.grants.grant(replica, int(head["echo_ms"]), self.settings.timing.master_timeout_ms)
        self._acknowledged(replica, offset, end)
        applied = int(head.get("registry_version", 0))
        if applied != self.registry_acks.get(replica):
            self.registry_acks[replica] = applied
            self._wake()
        if offset >= end:
            data = self._data
            with anyio.move_on_after(int(head.get("wait_ms", 0)) / 1000):
                await data.wait()
        chunk = read_chunk(self.log, offset, self.settings.fetch_bytes)
        answer: dict[str, Any] = {
            "epoch": self.role_epoch,
            # What a replica's promise counts from, and whether this master may still
            # confirm on one (a fenced one never will in this term).
            "sent_ms": self.now_ms(),
            "fenced": bool(self.fenced_version),
            "start": chunk.start,
            "end": chunk.end,
            "confirmed": self.confirmed,
            "epochs": self.state.epochs,
            "batches": [
                [batch_id, r.start_offset, r.end_offset, r.record_count]
                for batch_id, r in self.batches.items()
                if chunk.start <= r.start_offset and r.end_offset <= chunk.end
            ]
            if chunk.data
            else [],
        }
        if int(head.get("registry_version", 0)) != self.registry_version:
            answer["registry_version"] = self.registry_version
            # Not a snapshot: that would count as written, and the master's next append
            # would not save a registry its file may not hold yet.
            answer["registry"] = self.log.registry.document().decode()
        answer["offsets"], answer["fences"] = self._offsets_for(
            replica, bool(head.get("all_offsets"))
        )
        return Replicated(answer, chunk.data)

    def _acknowledged(self, replica: str, offset: int, end: int) -> None:
        advanced = offset > self.acks.get(replica, -1)
        if advanced:
            self.acks[replica] = offset
        if advanced or offset >= end:
            self.progress[replica] = self.now_ms()
        self.confirm()

    def _offsets_for(
        self, replica: str, everything: bool
    ) -> tuple[list[list[Any]], list[list[Any]]]:
        """The offsets and fencing tokens changed since ``replica``'s last fetch (all of
        them on its first)."""
        offsets, fences = self.log.offsets.offsets, self.log.offsets.fences
        dirty = self.dirty_offsets.get(replica)
        if everything or dirty is None:
            keys: Any = list(offsets) + [k for k in fences if k not in offsets]
        else:
            keys = dirty
        self.dirty_offsets[replica] = set()
        return (
            [[g, q, p, offsets[(g, q, p)]] for g, q, p in keys if (g, q, p) in offsets],
            [[g, q, p, fences[(g, q, p)]] for g, q, p in keys if (g, q, p) in fences],
        )
