"""Rate limits that total over the gateways of a cluster: each gateway's share, by demand.

An operator's global (or vhost, client, queue) limit of N msgs/s is N for the cluster, not
per gateway. Every gateway holds a share of N in its own token bucket (gateway/controls.py),
so the per-message path stays local; every ``PERIOD_S`` it reports through Redis what each
shared bucket let through and whether anything waited for a token, over the last two periods
(meta/throttle_shares.py), reads every live gateway's report, and sets its share by the same
rule the others apply to the same reports (``divide``):

- a gateway that was never short of tokens gets what it used plus ``HEADROOM``; one that
  used nothing and was never short (no consumers or publishers in scope) gets nothing;
- the rest of N goes evenly to the gateways that were short (max-min fairness: with one
  consumer on one gateway and five on another, both busy, each gets half);
- when nobody was short, what is left goes evenly to those that used any, so a rising
  demand finds tokens at once.

A report older than ``FRESH_MS`` (Redis's clock) is a gateway gone: the others divide N
without it at their next exchange, so after a kill the total is N again within about
``FRESH_MS + PERIOD_S``; a clean stop withdraws its report at once. While Redis cannot be
reached each gateway keeps the share it last had (never unlimited), logs it once, and
``/api/controls`` says so (``Controls.share_note``).

Cost: one Lua call of a few hundred bytes per gateway per period, whatever the message rate.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio

from gateway.controls import Controls
from gateway.queues.rate_limit import TokenBucket
from meta.errors import MetadataUnavailable
from meta.throttle_shares import ThrottleDemand

log = logging.getLogger("mqgw.cluster")

PERIOD_S = 0.25
FRESH_MS = 1_000  # a report older than this is a gateway gone
HEADROOM = 1.25  # a gateway not short of tokens may grow this much per period
MIN_SHARE = 1.0  # the least a gateway that used its share keeps (msgs or bytes per second)


@dataclass(frozen=True)
class Use:
    """What one gateway reported of one shared rate over its last period."""

    used: float  # per second
    short: bool  # something waited for a token


def divide(total: float, uses: Mapping[str, Use]) -> dict[str, float]:
    """Each gateway's share of ``total`` (see the module doc); shares add up to ``total``
    whenever some gateway used any or was short."""
    capped = {g: u.used * HEADROOM for g, u in uses.items() if not u.short and u.used > 0}
    capped = {g: max(MIN_SHARE, cap) for g, cap in capped.items()}
    short = sorted(g for g, u in uses.items() if u.short)
    shares = dict.fromkeys(uses, 0.0)
    if sum(capped.values()) > total:  # everyone capped wants more than there is: by use
        scale = total / sum(capped.values())
        shares.update({g: cap * scale for g, cap in capped.items()})
        return shares
    shares.update(capped)
    left = total - sum(capped.values())
    takers = short or sorted(capped)
    for gateway in takers:
        shares[gateway] += left / len(takers)
    return shares


class ThrottleShares:
    """The share task of one gateway (ClusterLink runs it)."""

    def __init__(self, controls: Controls, demand: ThrottleDemand, gateway_id: str) -> None:
        self.controls = controls
        self.demand = demand
        self.gateway_id = gateway_id
        # Per rate: what its bucket had spent at the last exchange, and its use over the
        # period before.
        self._seen: dict[str, tuple[float, Use]] = {}
        self._last = time.monotonic()
        self.exchanges = 0

    async def run(self) -> None:
        try:
            while True:
                await anyio.sleep(PERIOD_S)
                await self.exchange_once()
        finally:
            # Redis away: the report lapses after FRESH_MS instead.
            with anyio.move_on_after(1.0, shield=True), suppress(MetadataUnavailable):
                await self.demand.leave(self.gateway_id)

    async def exchange_once(self) -> None:
        buckets = self.controls.shared_buckets()
        now = time.monotonic()
        elapsed = max(1e-3, now - self._last)
        self._last = now
        mine: dict[str, list[float]] = {}
        totals: dict[str, tuple[float, TokenBucket]] = {}
        for key, field, total, bucket in buckets:
            name = json.dumps([*key, field])
            spent_then, before = self._seen.get(name, (bucket.spent, None))
            spent = bucket.spent - spent_then
            now_use = Use(spent / elapsed, bucket.short)
            bucket.short = False
            # Reported: the larger of this period and the one before, so that one quiet
            # period (a fill from the broker, a pause of the consumers) costs no share.
            before = before or now_use
            self._seen[name] = (bucket.spent, now_use)
            used, short = max(now_use.used, before.used), now_use.short or before.short
            mine[name] = [round(used, 3), 1.0 if short else 0.0]
            totals[name] = (total, bucket)
        for gone in self._seen.keys() - totals.keys():  # controls cleared since
            del self._seen[gone]
        try:
            reports = await self.demand.exchange(self.gateway_id, json.dumps(mine), FRESH_MS)
        except MetadataUnavailable as error:
            if self.controls.share_note is None:
                since = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
                self.controls.share_note = f"kept since {since}: metadata store unreachable"
                log.warning("cluster: rate limit shares kept as they are (%s)", error)
            return
        if self.controls.share_note is not None:
            log.info("cluster: rate limit shares divided again (metadata store back)")
            self.controls.share_note = None
        self.exchanges += 1
        self._apply(_parse(reports), totals)

    def _apply(
        self,
        reports: dict[str, dict[str, Use]],
        totals: dict[str, tuple[float, TokenBucket]],
    ) -> None:
        rose = False
        now = self.controls.node.scheduler.clock.monotonic()
        for name, (total, bucket) in totals.items():
            uses = {g: r[name] for g, r in reports.items() if name in r}
            share = divide(total, uses).get(self.gateway_id, 0.0)
            rose = rose or (bucket.rate_per_s < 1 <= share)
            bucket.set_rate(share, now)
        if rose:
            self.controls.wake_consumers()


def _parse(reports: Mapping[str, str]) -> dict[str, dict[str, Use]]:
    """Reports as written by ``exchange_once``; one that cannot be read counts as none."""
    parsed: dict[str, dict[str, Use]] = {}
    for gateway, report in reports.items():
        try:
            entries = json.loads(report)
            parsed[gateway] = {k: Use(float(v[0]), bool(v[1])) for k, v in entries.items()}
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            log.warning("cluster: unreadable rate report from gateway %s ignored", gateway)
    return parsed
