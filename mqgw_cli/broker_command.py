"""`mqgw broker`: a storage node serving its log store over the broker protocol.

    mqgw broker --data-dir D --port P [--host 127.0.0.1] [--group G] [--id I] [--meta URL]
        [--replication off|sync|async] [--min-in-sync N] [--replica-standing] [--priority N]

With --meta it registers (group, id, address) in the metadata store on Redis and renews that
lease every few seconds, which is how gateways find it. With --replication sync|async (needs
--meta) it is a member of a replicated group: its role (master or slave) comes from the
controller (`mqgw controller`), never from a flag; docs/replication.md.

The store lives in D/store, as under `mqgw serve` (so `mqgw storage check D` works on
either), and takes the store settings `mqgw serve` takes (flags, MQGW_* environment, --config
file): flush policy, segment sizes, retention, intervals. One log line says it is up:
"broker G/I ready on HOST:PORT data D (flush sync)". SIGTERM or SIGINT: stop accepting,
answer what is in flight, close the store cleanly (fsync, checkpoint, offsets).
docs/broker-protocol.md describes what it speaks.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from gateway.config.sources import ConfigError
from mqgw_cli.config_commands import add_settings_flags, resolve_args

log = logging.getLogger("mqgw.storage.broker")

STORE_KEYS = (
    "config_file", "data_dir", "flush", "segment_size_bytes", "cq_entries_per_segment",
    "max_message_size_bytes", "retention_ms", "min_retention_ms", "disk_budget_bytes",
    "async_flush_interval_ms", "checkpoint_interval_ms", "offset_persist_interval_ms",
    "retention_check_interval_ms", "verify_crc_on_read", "recent_records_bytes",
)  # fmt: skip


BROKER_LEASE_MS = 5_000  # a broker silent this long is taken for dead


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401 - only probing whether it is installed
    except ImportError:
        return False
    return True


def _broker(args: argparse.Namespace) -> int:
    import anyio

    from gateway.config.logging_setup import configure_from_settings
    from storage import serve_broker
    from storage.broker.gc_tuning import tune_gc
    from storage.errors import StoreError

    try:
        resolved = resolve_args(args)
        configure_from_settings(resolved.settings)
    except (ConfigError, OSError, ValueError) as error:
        print(f"mqgw broker: configuration error: {error}", file=sys.stderr)
        return 2
    settings = resolved.settings
    config = settings.store_config()
    name = f"{args.group}/{args.id}"
    if args.meta and args.backend != "asyncio":
        print("mqgw broker: --meta needs the asyncio backend (redis.asyncio)", file=sys.stderr)
        return 2
    listening: list[str] = []
    events: list[Any] = []  # the "listening" event, made inside the event loop

    def ready(host: str, port: int) -> None:
        # What gateways are told: the listen address unless it is a wildcard or a name only
        # this host knows (containers: --host 0.0.0.0 --advertise broker-0.svc:7000).
        listening.append(args.advertise or f"{host}:{port}")
        for event in events:
            event.set()
        tune_gc()  # recovered: what the store holds now lives as long as the process
        log.info(
            "broker %s ready on %s:%d data %s (flush %s)",
            name,
            host,
            port,
            settings.data_dir,
            config.flush.value,
        )

    if args.replication != "off" and not args.meta:
        print("mqgw broker: --replication needs --meta (the controller's Redis)", file=sys.stderr)
        return 2

    async def main() -> None:
        if args.replication != "off":
            await _replicated(args, config, ready, events, listening)
            return
        if not args.meta:
            await serve_broker(config, args.host, args.port, ready, name=name)
            return
        events.append(anyio.Event())
        async with anyio.create_task_group() as tg:
            tg.start_soon(_heartbeat, args.meta, args.group, args.id, events[0], listening)
            await serve_broker(config, args.host, args.port, ready, name=name)
            tg.cancel_scope.cancel()

    options: dict[str, Any] = {"use_uvloop": _has_uvloop()} if args.backend == "asyncio" else {}
    try:
        anyio.run(main, backend=args.backend, backend_options=options)
    except Exception as error:
        # Locked, corrupt, port taken, disk refused: one line, no traceback. The task groups
        # around the store wrap what they raise, so look inside.
        cause = _leaf(error)
        if not isinstance(cause, StoreError | OSError):
            raise
        print(f"mqgw broker: cannot start: {cause}", file=sys.stderr)
        return 2
    return 0


async def _heartbeat(url: str, group: str, broker_id: str, up: Any, listening: list[str]) -> None:
    """Register in the metadata store once listening, and keep the lease alive: gateways
    find brokers there, and a broker whose lease lapses is taken for dead."""
    import anyio

    from meta.errors import MetadataUnavailable
    from meta.redis_store import RedisMetadataStore

    meta = RedisMetadataStore(url, default_user=False)
    await up.wait()
    address = listening[0]
    announced = False
    try:
        while True:
            try:
                await meta.register_broker(group, broker_id, address, BROKER_LEASE_MS)
                if not announced:
                    log.info("broker %s/%s registered in %s as %s", group, broker_id, url, address)
                    announced = True
            except MetadataUnavailable as error:
                log.warning("broker registration failed (retrying): %s", error)
            await anyio.sleep(BROKER_LEASE_MS / 3 / 1000)
    finally:
        with anyio.CancelScope(shield=True):
            await meta.close()


async def _replicated(
    args: argparse.Namespace, config: Any, ready: Any, events: list[Any], listening: list[str]
) -> None:
    import anyio

    from meta.groups.timing import ControllerConfig
    from storage.broker.replicated import serve_replicated_broker
    from storage.replication.settings import ReplicationMode, ReplicationSettings

    settings = ReplicationSettings(
        group=args.group,
        broker_id=args.id,
        mode=ReplicationMode(args.replication),
        timing=ControllerConfig(min_in_sync=args.min_in_sync),
        priority=args.priority,
        replica_standing=args.replica_standing,
    )
    events.append(anyio.Event())
    async with anyio.create_task_group() as tg:
        # Registered in the broker registry too: `mqgw cluster status` and operators list it.
        tg.start_soon(_heartbeat, args.meta, args.group, args.id, events[0], listening)
        await serve_replicated_broker(
            config, settings, args.meta, args.host, args.port, ready, advertise=args.advertise
        )
        tg.cancel_scope.cancel()


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def add_broker_command(commands: Any) -> None:
    broker = commands.add_parser(
        "broker",
        help="run a storage node: the log store served over TCP to gateways",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    broker.add_argument("--port", type=int, required=True, help="TCP port (0: any free one)")
    broker.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    broker.add_argument(
        "--advertise",
        default=None,
        metavar="HOST:PORT",
        help="address registered for gateways (default: the listen address)",
    )
    broker.add_argument("--group", default="g0", help="broker group name (default g0)")
    broker.add_argument("--id", default="0", help="id within the group (default 0)")
    broker.add_argument(
        "--meta",
        default=None,
        metavar="URL",
        help="redis://H:P/N or redis+sentinel://H:P,.../SERVICE: register here",
    )
    broker.add_argument(
        "--replication",
        choices=("off", "sync", "async"),
        default="off",
        help="member of a replicated group (needs --meta and a controller): sync confirms once "
        "every in-sync replica has an append, async after the master's own flush",
    )
    broker.add_argument(
        "--min-in-sync",
        type=int,
        default=1,
        help="replicas (the master included) that must hold an append before it is confirmed; "
        "below it appends are refused (default 1)",
    )
    broker.add_argument(
        "--replica-standing",
        action="store_true",
        help="with --replication sync: a master whose Redis does not answer goes on confirming "
        "while every in-sync replica promises to follow no other master (safe only when "
        "--min-in-sync is a majority of the group; docs/controller.md, rule 14)",
    )
    broker.add_argument(
        "--priority", type=int, default=0, help="election preference among equals, lower first"
    )
    broker.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    add_settings_flags(broker, STORE_KEYS)
    # add_settings_flags titles a group of chosen keys "logging" (its other use): rename it.
    broker._action_groups[-1].title = "store settings (flags > MQGW_* environment > --config)"
    broker.set_defaults(func=_broker, configures_logging=True)
