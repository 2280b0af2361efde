"""The controller's I/O on Redis: read the state into a ``Snapshot``, carry out actions.

Everything goes through the scripts of controller/scripts.py; nothing here decides. The
holder of the lease is "<name>/<random>" so that a restarted controller with the same
``--name`` is a new holder: its predecessor's late writes cannot pass as its own.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from redis.asyncio import Redis

from controller import scripts
from controller.actions import (
    Demote,
    Elect,
    MarkDown,
    ResumeConfirming,
    SetInSync,
    StopConfirming,
    Write,
    WriteResult,
)
from controller.events import LeaseAcquired, LeaseLost
from controller.snapshot import Snapshot
from meta.groups.keys import ControllerKeys
from meta.groups.records import parse_heartbeat, parse_record
from meta.groups.timing import ControllerConfig

STREAM_MAX_LEN = 10_000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def flat_to_dict(flat: list[Any]) -> dict[str, str]:
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}


def _ids(ids: frozenset[str]) -> str:
    return json.dumps(sorted(ids), separators=(",", ":"))


def parse_state(raw: str, run_id: str) -> Snapshot:
    """The READ_STATE script's JSON as a Snapshot."""
    state = json.loads(raw)
    records, replicas, switchovers = [], [], []
    for group in sorted(state["groups"] or {}):
        found = state["groups"][group]
        records.append(parse_record(group, found["record"] or {}))
        for broker_id in sorted(found["replicas"] or {}):
            replicas.append(parse_heartbeat(group, broker_id, found["replicas"][broker_id]))
        if found["switchover"]:
            request = json.loads(found["switchover"])
            switchovers.append((group, str(request["id"]), str(request.get("target", ""))))
    registrations = sorted(
        (str(group), str(broker_id), bool(alive))
        for group, broker_id, alive in (state["registry"] or [])
    )
    return Snapshot(
        now_ms=int(state["now"]),
        run_id=run_id,
        lease_holder=state["lease"],
        records=tuple(records),
        replicas=tuple(replicas),
        registrations=tuple(registrations),
        switchovers=tuple(switchovers),
    )


class RedisApply:
    def __init__(self, client: Redis, keys: ControllerKeys, name: str, config: ControllerConfig):
        self.client, self.keys, self.config = client, keys, config
        self.holder = f"{name}/{secrets.token_hex(4)}"
        register = client.register_script
        self._read = register(scripts.READ_STATE)
        self._hold = register(scripts.HOLD_LEASE)
        self._drop = register(scripts.DROP_LEASE)
        self._demote = register(scripts.DEMOTE)
        self._writes = {
            Elect: register(scripts.ELECT),
            SetInSync: register(scripts.SET_IN_SYNC),
            StopConfirming: register(scripts.STOP_CONFIRMING),
            ResumeConfirming: register(scripts.RESUME_CONFIRMING),
            MarkDown: register(scripts.MARK_DOWN),
        }

    async def read(self) -> Snapshot:
        keys = self.keys
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.info("server")
            await self._read(  # queues it in the pipeline
                keys=[keys.lease, keys.groups, keys.registry],
                args=[keys.prefix, keys.registry_lease_prefix],
                client=pipe,
            )
            info, raw = await pipe.execute()
        return parse_state(_text(raw), str(info["run_id"]))

    async def hold(self) -> LeaseAcquired | LeaseLost:
        token, expires_ms, holder = await self._hold(
            keys=[self.keys.lease, self.keys.tokens], args=[self.holder, self.config.lease_ms]
        )
        if int(token):
            return LeaseAcquired(int(token), int(expires_ms))
        return LeaseLost(_text(holder))

    async def release(self) -> None:
        await self._drop(keys=[self.keys.lease], args=[self.holder])

    async def write(self, action: Write, token: int) -> WriteResult:
        keys = self.keys
        group = action.group
        args: list[str | int] = [
            f"{self.holder} {token}",
            token,
            action.expect_version,
            STREAM_MAX_LEN,
            group,
        ]
        extra_keys: list[str] = []
        match action:
            case Elect():
                args += [action.master, _ids(action.in_sync), action.min_epoch,
                         self.config.election_silence_ms, "1" if action.unclean else "0",
                         action.reason, keys.replica_prefix(group)]  # fmt: skip
            case SetInSync():
                args += [action.epoch, _ids(action.in_sync), _ids(action.added), action.reason,
                         keys.replica_prefix(group)]  # fmt: skip
            case StopConfirming():
                args += [action.epoch, action.target, action.request_id,
                         "1" if action.rescue else "0"]  # fmt: skip
                extra_keys.append(keys.switchover(group))
            case ResumeConfirming():
                args += [action.epoch, action.reason]
            case MarkDown():
                args += [_ids(action.down), action.jump]
        script = self._writes[type(action)]
        reply = await script(
            keys=[keys.lease, keys.record(group), keys.changes, keys.groups, *extra_keys],
            args=args,
        )
        if not int(reply[0]):
            return WriteResult(False, _text(reply[1]), None)
        return WriteResult(True, "", parse_record(group, flat_to_dict(reply[2])))

    async def demote(self, action: Demote, token: int) -> bool:
        reply = await self._demote(
            keys=[self.keys.lease, self.keys.changes],
            args=[f"{self.holder} {token}", STREAM_MAX_LEN, action.group, action.broker_id,
                  action.stale_epoch, action.epoch],
        )  # fmt: skip
        return bool(int(reply[0]))
