"""Publisher worker: one process, one connection, one channel, pre-built publish frames.

Message i goes to route ``i % R`` with per-route sequence number ``i // R``, so a consumer can
check each queue's sequence independently. With confirms, at most ``confirm_window`` messages
are unconfirmed; batches are joined and sent with one ``sendall``.
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass
from typing import Any

from pamqp import commands

from bench.load.connection import RECV_BYTES, RawConnection
from bench.load.frames import STAMP, PublishTemplate
from bench.load.workers import WorkerLink, worker_main

BATCH = 256  # messages per sendall: large enough to amortise the syscall, small for latency


@dataclass(frozen=True)
class PublishPlan:
    url: str
    routes: tuple[tuple[str, str], ...]  # (exchange, routing key)
    count: int
    body_bytes: int
    persistent: bool
    confirm_window: int  # 0: no confirms
    deadline_mono: float
    mark_every: int = 0  # record when each multiple of this many is confirmed (backlog rates)
    one_sequence: bool = False  # every route into one queue (keyed): one sequence, not one each


class _Confirms:
    """Counts confirmed publishes from acks that may be multiple or single, in any mix."""

    def __init__(self) -> None:
        self.upto = 0  # every tag <= upto is confirmed
        self.singles: set[int] = set()  # confirmed tags above ``upto``
        self.nacked = 0

    @property
    def count(self) -> int:
        return self.upto + len(self.singles)

    def apply(self, confirms: list[tuple[int, int, bool, bool]]) -> None:
        for _channel, tag, multiple, nack in confirms:
            before = self.count
            if multiple:
                if tag > self.upto:
                    self.upto = tag
                    if self.singles:
                        self.singles = {t for t in self.singles if t > tag}
            elif tag > self.upto:
                self.singles.add(tag)
            if nack:
                self.nacked += self.count - before
        confirms.clear()
        # fold singles that became contiguous, so the set stays small
        while self.upto + 1 in self.singles:
            self.upto += 1
            self.singles.discard(self.upto)


def publish(plan: PublishPlan, link: WorkerLink) -> dict[str, Any]:
    conn = RawConnection(plan.url)
    conn.open_channel(1)
    if plan.confirm_window:
        conn.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    templates = [
        PublishTemplate.build(1, exchange, key, plan.body_bytes, plan.persistent)
        for exchange, key in plan.routes
    ]
    pieces = [(t.prefix, t.suffix) for t in templates]
    routes = len(pieces)
    per_seq = 1 if plan.one_sequence else routes  # sequence number = i // per_seq
    sock, parser = conn.sock, conn.parser
    confirms = _Confirms()
    window = plan.confirm_window
    marks: list[tuple[int, int]] = []
    next_mark = plan.mark_every or plan.count + 1
    pack, now_ns = STAMP.pack, time.monotonic_ns
    link.ready()
    sent = 0
    started_ns = now_ns()
    check_at = 0.0
    # Blocking socket, no timeout: MSG_DONTWAIT then really does not wait (with a timeout set,
    # Python polls for the whole timeout first); waits for confirms go through select.
    sock.settimeout(None)
    while True:
        if window and confirms.count >= next_mark:
            marks.append((confirms.count, now_ns()))
            next_mark += plan.mark_every
        if sent >= plan.count and (not window or confirms.count >= sent):
            break
        if time.monotonic() > check_at:  # deadline and stop, a few times a second only
            if time.monotonic() > plan.deadline_mono or link.stopped():
                break
            check_at = time.monotonic() + 0.05
            link.report(confirms.count if window else sent)
        room = min(BATCH, plan.count - sent)
        if window:
            room = min(room, window - (sent - confirms.count))
        if room < min(BATCH, window // 4 or BATCH, plan.count - sent) or room == 0:
            if not select.select([sock], [], [], 0.2)[0]:  # window full: wait for confirms
                continue
            data = sock.recv(RECV_BYTES)
            if not data:
                raise ConnectionError("the server closed the connection")
            parser.feed(data)
            confirms.apply(parser.confirms)
            conn.check_others()
            continue
        parts: list[bytes] = []
        for i in range(sent, sent + room):
            prefix, suffix = pieces[i % routes]
            parts += (prefix, pack(i // per_seq, now_ns()), suffix)
        sock.sendall(b"".join(parts))
        sent += room
        try:  # pick up whatever confirms are already here, without blocking
            data = sock.recv(RECV_BYTES, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        if not data:
            raise ConnectionError("the server closed the connection")
        parser.feed(data)
        confirms.apply(parser.confirms)
        conn.check_others()
    finished_ns = now_ns()
    link.report(confirms.count if window else sent)
    conn.close()
    per_route = [sent // routes + (1 if r < sent % routes else 0) for r in range(routes)]
    return {
        "sent": sent,
        "confirmed": confirms.count if window else sent,
        "nacked": confirms.nacked,
        "started_ns": started_ns,
        "finished_ns": finished_ns,
        "marks": marks,
        "sent_per_route": per_route,
    }


def main(plan: PublishPlan, link: WorkerLink) -> None:
    """Process entry point."""
    worker_main(publish, plan, link)
