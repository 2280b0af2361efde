"""`mqgw broker`: a storage node serving its log store over the broker protocol.

    mqgw broker --data-dir D --port P [--host 127.0.0.1] [--group G] [--id I] [--meta URL]

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

from gateway.config_sources import ConfigError
from mqgw_cli.config_commands import add_settings_flags, resolve_args

log = logging.getLogger("mqgw.storage.broker")

STORE_KEYS = (
    "config_file", "data_dir", "flush", "segment_size_bytes", "cq_entries_per_segment",
    "max_message_size_bytes", "retention_ms", "min_retention_ms", "disk_budget_bytes",
    "async_flush_interval_ms", "checkpoint_interval_ms", "offset_persist_interval_ms",
    "retention_check_interval_ms", "verify_crc_on_read",
)  # fmt: skip


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401 - only probing whether it is installed
    except ImportError:
        return False
    return True


def _broker(args: argparse.Namespace) -> int:
    import anyio

    from gateway.logging_setup import configure_from_settings
    from storage import serve_broker
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
    if args.meta:
        log.warning("--meta %s: registration in Redis: not yet wired", args.meta)

    def ready(host: str, port: int) -> None:
        log.info(
            "broker %s ready on %s:%d data %s (flush %s)",
            name,
            host,
            port,
            settings.data_dir,
            config.flush.value,
        )

    options: dict[str, Any] = {"use_uvloop": _has_uvloop()} if args.backend == "asyncio" else {}
    try:
        anyio.run(
            lambda: serve_broker(config, args.host, args.port, ready, name=name),
            backend=args.backend,
            backend_options=options,
        )
    except Exception as error:
        # Locked, corrupt, port taken, disk refused: one line, no traceback. The task groups
        # around the store wrap what they raise, so look inside.
        cause = _leaf(error)
        if not isinstance(cause, StoreError | OSError):
            raise
        print(f"mqgw broker: cannot start: {cause}", file=sys.stderr)
        return 2
    return 0


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
    broker.add_argument("--group", default="g0", help="broker group name (default g0)")
    broker.add_argument("--id", default="0", help="id within the group (default 0)")
    broker.add_argument("--meta", default=None, metavar="URL", help="redis://H:P/N (not yet used)")
    broker.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    add_settings_flags(broker, STORE_KEYS)
    # add_settings_flags titles a group of chosen keys "logging" (its other use): rename it.
    broker._action_groups[-1].title = "store settings (flags > MQGW_* environment > --config)"
    broker.set_defaults(func=_broker, configures_logging=True)
