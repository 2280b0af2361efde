"""A replicated broker's life in its group: heartbeats, following the group record, and, as a
slave, fetching the master's log (docs/controller.md, "The contract", rules 1 to 6 and 12).

- Every ``heartbeat_interval_ms`` the broker reports where it stands through Redis
  (``meta.groups.link.GroupLink.heartbeat``); the answer is the group record, the only
  source of its role. An answer older than the record followed is ignored; one below the
  highest epoch seen (Redis lost data) is not followed. A role or fence change is reported at
  once with another heartbeat.
- As slave of (master, epoch): ask the master for its epoch file, cut the log back to the
  last common point, then fetch chunks from the end of the log. Each fetch names the offset
  this log holds durably: that is the acknowledgement the master's confirms wait for. The
  queue registry and the consumer offsets come with the chunks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import anyio
from redis.exceptions import RedisError

from meta.groups.contract import ANYONE, Promise, common_point, stale
from meta.groups.link import GroupLink
from meta.groups.records import SEQ_BOOT_SHIFT, GroupRecord, ReplicaReport
from meta.redis_conn import closed_transport as closed
from storage.clients.remote import RemoteStore
from storage.errors import StoreError
from storage.log.state_files import QueueInfo
from storage.repeated_failure import RepeatedFailure
from storage.replication.replica_log import Chunk, truncate_log, write_chunk
from storage.replication.replicated_store import ReplicatedStore
from storage.results import AppendResult
from storage.wire.replication import Replicate, Replicated


def _first_leaf(error: BaseException) -> BaseException:
    """The first error inside nested exception groups (the one worth a log line)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


class Diverged(Exception):
    """Following the master would cut entries this broker knows were confirmed."""

    def __init__(self, shared: int, confirmed: int) -> None:
        super().__init__(shared, confirmed)
        self.shared, self.confirmed = shared, confirmed


log = logging.getLogger("mqgw.storage.replication")

Connect = Callable[[str], AbstractAsyncContextManager[RemoteStore]]


class ReplicationMember:
    def __init__(self, store: ReplicatedStore, link: GroupLink, address: str, connect: Connect):
        self.store = store
        self.link = link
        self.address = address
        self.connect = connect
        self.settings = store.settings
        self.state = store.state
        self.record: GroupRecord | None = None
        self.beats = 0
        self.beat_failures = RepeatedFailure()
        # replica_standing: meanwhile it follows no other master and does not become one.
        self.promise = Promise()
        self.resigned_epoch = self.state.master_epoch  # rule 6: back from a restart
        self.following: tuple[str, int] | None = None
        self._follow_changed = anyio.Event()
        self._beat_now = anyio.Event()

    async def run(self) -> None:
        self.state.boot += 1
        self.state.save()
        self.hold_after_restart()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._heartbeats)
            tg.start_soon(self._slave_forever)
            tg.start_soon(self.store.flush_forever)

    # -- heartbeats ----------------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        interval_s = self.settings.timing.heartbeat_interval_ms / 1000
        while True:
            await self._beat()
            with anyio.move_on_after(interval_s):
                await self._beat_now.wait()
            self._beat_now = anyio.Event()

    async def _beat(self) -> None:
        store, state = self.store, self.state
        self.beats += 1
        seq = state.boot << SEQ_BOOT_SHIFT | self.beats
        lag = store.review(seq) if store.role == "master" else None
        report = ReplicaReport(
            group=self.settings.group,
            broker_id=store.me,
            seq=seq,
            epoch=state.highest_epoch,
            role=store.role,
            log_epoch=state.log_epoch(),
            end=store.log.commit_log.write_offset,
            confirmed=store.confirmed,
            priority=self.settings.priority,
            fenced_version=store.fenced_version,
            resigned_epoch=self.resigned_epoch,
            address=self.address,
        )
        sent_ms = store.now_ms()
        try:
            with anyio.fail_after(self.settings.timing.master_timeout_ms / 1000):
                _, record = await self.link.heartbeat(report, lag)
        except Exception as error:  # Redis away: standing runs out by itself (rule 7)
            if (reason := self.beat_failures.failed(error)) is not None:
                log.warning("broker %s: heartbeat failed: %s (logged again when the reason "
                            "changes or heartbeats are answered)", store.me, reason)  # fmt: skip
            return
        if failed := self.beat_failures.recovered():
            log.info("broker %s: heartbeats answered again after %d failed", store.me, failed)
        self._on_answer(record, seq, sent_ms)

    def _on_answer(self, record: GroupRecord, seq: int, sent_ms: int) -> None:
        store, state = self.store, self.state
        if record.epoch < state.highest_epoch or stale(record, self.record):
            return
        if record.epoch > state.highest_epoch:
            state.highest_epoch = record.epoch
            state.save()  # rule 3: persisted before acting on it
        self.record = record
        before = (store.role, store.role_epoch, store.fenced_version)
        if record.master == store.me and record.epoch > self.resigned_epoch:
            if store.role != "master" or store.role_epoch != record.epoch:
                self._set_following(None)
                if self._promised_elsewhere(store.me):
                    return  # a later answer takes the term, once the promise ran out
                store.become_master(record)
            store.follow_standing(record, seq, sent_ms)
        else:
            if store.role == "master":
                store.step_down()
            following = (record.master, record.epoch)
            if record.master and record.master != store.me and self.following != following:
                if self._promised_elsewhere(record.master):
                    self._set_following(None)
                    return
                log.info("broker %s follows %s at epoch %d", store.me, *following)
                store.become_slave(record.epoch)
                self._set_following(following)
        if (store.role, store.role_epoch, store.fenced_version) != before:
            self._beat_now.set()  # rule 4: tell the controller at once

    def hold_after_restart(self) -> None:
        """A promise made before a crash may still hold (replica_standing): a broker that
        starts takes no role for one promise's length, whoever the record names."""
        if self.settings.replica_standing:
            self._make_promise(ANYONE)

    def _make_promise(self, master: str) -> None:
        timing = self.settings.timing  # the margin: clock-rate drift, as for elections
        self.promise.make(
            master, self.store.now_ms(), timing.master_timeout_ms, timing.safety_margin_ms
        )

    def _promised_elsewhere(self, master: str) -> bool:
        """Still bound by a promise to another master (replica_standing): it may be
        confirming on it, so this broker must neither lead nor acknowledge another yet."""
        return self.promise.binds(master, self.store.now_ms())

    def _promise(self, master: str, answer: Replicated) -> dict[str, object]:
        """The next fetch's promise to ``master`` for what its answer said (nothing when
        replica standing is off, or the master is fenced: then no promise holds)."""
        sent_ms = answer.head.get("sent_ms")
        if not self.settings.replica_standing or sent_ms is None:
            return {}
        if answer.head.get("fenced"):
            self.promise.release()
            return {}
        self._make_promise(master)
        return {"echo_ms": int(sent_ms), "grant": True}

    def _set_following(self, following: tuple[str, int] | None) -> None:
        if following != self.following:
            self.following = following
            self._follow_changed.set()

    # -- as slave ------------------------------------------------------------------------------

    async def _slave_forever(self) -> None:
        while True:
            following = self.following
            self._follow_changed = anyio.Event()
            if following is None:
                await self._follow_changed.wait()
                continue
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._stop_on_change, tg.cancel_scope)
                    await self._follow(*following)
            # Redis errors too: the master's address is looked up there, and Redis may be cut
            # off just then (the nemesis run: two slaves exited on an uncaught timeout).
            except* (StoreError, OSError, KeyError, ValueError, RedisError) as errors:
                await self._retry_follow(following[0], errors)
            except* RuntimeError as errors:
                # uvloop's answer to a Redis connection that died under a call (nemesis seed
                # 115: the broker exited on it); anything else is a bug and goes up.
                _, other = errors.split(lambda e: isinstance(e, RuntimeError) and closed(e))
                if other is not None:
                    raise other from None
                await self._retry_follow(following[0], errors)

    async def _retry_follow(self, master: str, errors: BaseException) -> None:
        log.warning(
            "broker %s: replication from %s stopped: %s; retrying",
            self.store.me, master, _first_leaf(errors),
        )  # fmt: skip
        await anyio.sleep(0.2)

    async def _stop_on_change(self, scope: anyio.CancelScope) -> None:
        await self._follow_changed.wait()
        scope.cancel()

    async def _master_address(self, master: str) -> str:
        keys = self.link.keys
        found = await self.link.client.hget(keys.replica(self.settings.group, master), "address")
        if not found:
            raise KeyError(f"no address known for master {master}")
        return str(found)

    async def _follow(self, master: str, epoch: int) -> None:
        address = await self._master_address(master)
        async with self.connect(address) as remote:
            answer = await remote.replicate(Replicate("epochs", {"epoch": epoch}))
            try:
                self._truncate_to_common_point(answer)
            except Diverged as refusal:
                log.error(  # once per master followed: it waits for the record to move
                    "broker %s will not follow %s at epoch %d: they share the log only up to "
                    "%d and entries up to %d are confirmed here; waiting for the controller "
                    "to elect a broker that holds them",
                    self.store.me, master, epoch, refusal.shared, refusal.confirmed,
                )  # fmt: skip
                self.store.diverge(epoch)
                self._beat_now.set()
                await self._follow_changed.wait()
                return
            registry_version, first = 0, True
            committer = self.store.inner.committer
            promise: dict[str, object] = {}
            while True:
                # The offset a fetch names is its acknowledgement: durable here first.
                await committer.wait_durable(self.store.log.commit_log.write_offset)
                offset = self.store.log.durable_offset
                head = {
                    "id": self.store.me,
                    "epoch": epoch,
                    "offset": offset,
                    "wait_ms": self.settings.fetch_wait_ms,
                    "registry_version": registry_version,
                    "all_offsets": first,
                    **promise,
                }
                answer = await remote.replicate(Replicate("fetch", head))
                promise = self._promise(master, answer)  # made on receipt, before applying
                registry_version = self._apply(answer, registry_version)
                first = False

    def _truncate_to_common_point(self, answer: Replicated) -> None:
        store, state = self.store, self.state
        master_epochs = [(int(e), int(s)) for e, s in answer.head["epochs"]]
        end = store.log.commit_log.write_offset
        cut = common_point(state.epochs, end, master_epochs, int(answer.head["end"]))
        if cut < store.confirmed:
            # The master lacks entries confirmed here: it was elected from a record that
            # Redis lost writes of (a failover to a replica that missed them). Following it
            # would lose confirmed messages; say so instead (role "diverged") and let the
            # controller elect a broker that holds them (docs/controller.md, rule 13).
            raise Diverged(cut, store.confirmed)
        if cut < end:
            cut_bytes = truncate_log(store.log, cut)
            log.warning(
                "broker %s: log cut back to %d (%d bytes written after the last point it "
                "shares with master epochs %s)",
                store.me, cut, cut_bytes, master_epochs,
            )  # fmt: skip
        if state.cut(cut):
            state.save()
        store.confirmed = min(store.confirmed, cut)

    def _apply(self, answer: Replicated, registry_version: int) -> int:
        store, head = self.store, answer.head
        log_store = store.log
        if "registry" in head:
            self._apply_registry(json.loads(head["registry"]))
            registry_version = int(head["registry_version"])
        chunk = Chunk(int(head["start"]), answer.data, int(head["end"]))
        if chunk.data:
            write_chunk(log_store, chunk)
        for group, queue_id, partition, offset in head.get("offsets", ()):
            if (queue_id, partition) in log_store.cqs:
                log_store.offsets.offsets[(group, queue_id, partition)] = offset
                log_store.offsets.changed = True
        for group, queue_id, partition, fence in head.get("fences", ()):
            key = (group, queue_id, partition)
            if (queue_id, partition) in log_store.cqs and fence > log_store.offsets.fences.get(
                key, 0
            ):
                end = log_store.partition_range(queue_id, partition)[1]
                log_store.offsets.fence(key, fence, end)
        for batch_id, start, end, count in head.get("batches", ()):
            store.batches[batch_id] = AppendResult(start, end, count)
        if self.state.adopt([(int(e), int(s)) for e, s in head["epochs"]], chunk.end):
            self.state.save()
        store.confirmed = max(store.confirmed, min(int(head["confirmed"]), chunk.end))
        return registry_version

    def _apply_registry(self, document: dict[str, dict[str, dict[str, object]]]) -> None:
        log_store = self.store.log
        theirs = {int(k): QueueInfo(**v) for k, v in document["queues"].items()}  # type: ignore[arg-type]
        for queue_id in set(log_store.registry.queues) - set(theirs):
            log_store.delete_queue(queue_id)
        partitions_added = False
        for queue_id, info in theirs.items():
            mine = log_store.registry.queues.get(queue_id)
            if mine is not None and (
                mine.created_at != info.created_at or mine.partitions > info.partitions
            ):
                # The master deleted the queue and declared it again: another queue.
                log_store.delete_queue(queue_id)
                mine = None
            if mine is None or mine.partitions < info.partitions:
                # Creates it, or grows it as the master did: what it holds stays.
                log_store.create_queue(queue_id, info.partitions)
                mine = log_store.registry.queues[queue_id]
                partitions_added = True
            mine.created_at, mine.floors, mine.dropped = info.created_at, info.floors, info.dropped
            mine.added_at = info.added_at
        log_store.registry.dirty = True
        if partitions_added:
            # Saved before the chunk that came with it is indexed, as an append saves it
            # first on a master: a restart must know every partition the log has reached.
            log_store.registry.save()
