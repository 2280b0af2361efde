"""Timeouts and intervals of failover, in one place: the controller, the brokers (through the
contract helpers) and the simulation all read the same numbers, because the safety of an
election rests on how they relate (see ``ControllerConfig.check``).

The defaults aim at a failover under 3 s: a master that dies is silent for
``master_timeout_ms + safety_margin_ms`` (2 s) before the controller may elect another,
the controller looks every ``tick_ms`` and the new master learns it at its next heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass


class ConfigError(ValueError):
    """Timeouts that cannot keep the fencing guarantee."""


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    # Brokers write a heartbeat this often.
    heartbeat_interval_ms: int = 200
    # A master stops confirming when its last acknowledged heartbeat was *sent* this long ago
    # (by its own clock); the controller counts from when Redis stored it.
    master_timeout_ms: int = 1500
    # Added to master_timeout_ms before an election: covers clock-rate drift between the
    # master's clock and Redis's over the timeout (a few ms at 1 %), with room to spare.
    safety_margin_ms: int = 500
    # A slave silent this long is down: it leaves the in-sync set.
    broker_timeout_ms: int = 1500
    # A replica that has not acknowledged new entries for this long is lagging (master side).
    lag_timeout_ms: int = 500
    # The controller's leader lease, and how often the controller looks at Redis.
    lease_ms: int = 2000
    tick_ms: int = 100
    # A planned switchover gives up (the master confirms again) after this long.
    switchover_timeout_ms: int = 2000
    # Appends are refused while fewer replicas (master included) are in sync.
    min_in_sync: int = 1
    # Elect from outside the in-sync set when none of it is alive (may lose confirmed data).
    unclean_election: bool = False

    @property
    def election_silence_ms(self) -> int:
        """How long a master must have been silent (Redis time) before another is elected."""
        return self.master_timeout_ms + self.safety_margin_ms

    @property
    def bootstrap_wait_ms(self) -> int:
        """A group's first election waits this long after its first heartbeat, so every
        broker of the group has reported and the most complete one is chosen."""
        return self.election_silence_ms

    def check(self) -> ControllerConfig:
        if min(self.heartbeat_interval_ms, self.master_timeout_ms, self.lease_ms) <= 0:
            raise ConfigError("intervals and timeouts must be positive")
        if self.heartbeat_interval_ms * 2 > self.master_timeout_ms:
            raise ConfigError("master_timeout_ms must cover at least two heartbeats")
        if self.safety_margin_ms < self.master_timeout_ms // 50:
            raise ConfigError("safety_margin_ms must cover 2 % clock drift over the timeout")
        if self.tick_ms * 2 > self.lease_ms:
            raise ConfigError("the controller must look at least twice per lease")
        if self.min_in_sync < 1:
            raise ConfigError("min_in_sync counts the master: at least 1")
        return self
