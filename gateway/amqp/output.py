"""What a connection has queued for its client, in order, until the writer takes it.

Parts are bytes, or views of a stored message's body (frame_writer.body_frames): the writer
joins them a piece at a time (frame_writer.coalesce). A channel's frames can be held back
for a moment and released after a reply, so that the reply comes first (see hold).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.amqp.frame_writer import Buffer


class Output:
    def __init__(self) -> None:
        self.parts: list[Buffer] = []
        self._held: dict[int, list[Buffer]] = {}  # channel -> frames kept back

    def add(self, channel: int, frames: Sequence[Buffer]) -> None:
        held = self._held.get(channel)
        (self.parts if held is None else held).extend(frames)

    def take(self) -> list[Buffer]:
        parts, self.parts = self.parts, []
        return parts

    def hold(self, channel: int) -> None:
        """Keep ``channel``'s frames back until release()."""
        self._held.setdefault(channel, [])

    def release(self, channel: int) -> list[Buffer]:
        """Stop holding ``channel``; what was kept back, for the caller to send."""
        return self._held.pop(channel, [])
