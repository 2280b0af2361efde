"""A failure that repeats on every round of a loop (a heartbeat, a poll) while something is
away: one log line when it starts and when its reason changes, and one when it ends, not a
line per round for the whole outage."""

from __future__ import annotations


class RepeatedFailure:
    def __init__(self) -> None:
        self.reason = ""  # the last one logged
        self.count = 0  # rounds failed in a row

    def failed(self, error: BaseException) -> str | None:
        """Count a failed round; its reason when that is worth a line (new or changed)."""
        self.count += 1
        reason = str(error) or type(error).__name__
        if reason == self.reason:
            return None
        self.reason = reason
        return reason

    def recovered(self) -> int:
        """A round went through: how many failed before it (0: nothing to say)."""
        count, self.count, self.reason = self.count, 0, ""
        return count
