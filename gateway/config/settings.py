"""Gateway settings: command-line flags > MQGW_* environment > --config file > defaults.

One key name everywhere: the field ``amqp_port`` is ``--amqp-port``, ``MQGW_AMQP_PORT`` and
``amqp_port`` (or RabbitMQ's hyphenated ``amqp-port``) in the TOML file. ``host`` (flag
``--host``, ``MQGW_HOST``) sets ``amqp_host`` and ``admin_host`` unless the same source sets
those. gateway/config/sources.py reads the sources and names the source of every value;
docs/configuration.md lists every setting. The config file is TOML, e.g.:

    amqp_port = 5673
    data_dir = "/var/lib/mqgw"
    vhosts = ["/", "orders"]
    log_levels = { storage = "warning" }
    [[users]]
    name = "app"
    password = "s3cret"
    tags = ["administrator"]
    [[policies]]
    name = "ttl"
    pattern = "^orders\\."
    apply-to = "queues"
    definition = { message-ttl = 60000, dead-letter-exchange = "dlx" }
"""

from __future__ import annotations

import socket
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.amqp.channel import MAX_MSG_SIZE
from gateway.config.logging_setup import check_category, level_number, parse_rotation
from meta.partitions import check_policy_definition
from storage import FlushPolicy, StoreConfig
from storage.config import largest_record_in, max_record_bytes_for
from storage.rocketmq import parse_rocketmq_url

# Off while config_sources builds settings from the sources it has already read itself.
READ_ENVIRONMENT: ContextVar[bool] = ContextVar("mqgw_read_environment", default=True)


def underscore_keys(data: Any) -> Any:
    """RabbitMQ's hyphenated keys ("apply-to") as the field names ("apply_to")."""
    if isinstance(data, dict):
        return {k.replace("-", "_") if isinstance(k, str) else k: v for k, v in data.items()}
    return data


class UserSetting(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    password: str
    tags: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _hyphens(cls, data: Any) -> Any:
        return underscore_keys(data)

    @field_validator("tags", mode="before")
    @classmethod
    def _comma_tags(cls, value: Any) -> Any:
        if isinstance(value, str):  # RabbitMQ's definitions: "tags": "administrator,management"
            return [tag.strip() for tag in value.split(",") if tag.strip()]
        return value


class PolicySetting(BaseModel):
    """A policy applied at start (RabbitMQ's keys, e.g. {"message-ttl": 60000})."""

    model_config = ConfigDict(extra="forbid")

    name: str
    pattern: str
    definition: dict[str, Any]
    vhost: str = "/"
    priority: int = 0
    apply_to: Literal["queues", "exchanges", "all"] = "all"

    @model_validator(mode="before")
    @classmethod
    def _hyphens(cls, data: Any) -> Any:
        return underscore_keys(data)

    @field_validator("definition")
    @classmethod
    def _partition_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_policy_definition(value)  # as PUT /api/policies checks them
        return value


LogLevel = Literal["debug", "info", "warning", "error", "critical", "none"]


def _default_node_name() -> str:
    return f"mqgw@{socket.gethostname()}"


def _positive(description: str, default: int) -> Any:
    return Field(default, gt=0, description=description)


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MQGW_", extra="forbid")

    config_file: Path | None = Field(None, description="TOML settings file")
    amqp_host: str = Field(
        "", description='AMQP listen addresses, comma-separated ("": all, IPv4 and IPv6)'
    )
    amqp_port: int = Field(5672, ge=0, le=65535, description="AMQP port (0: any free port)")
    admin_host: str = Field("127.0.0.1", description="admin HTTP API listen address")
    node_name: str = Field(
        default_factory=_default_node_name, description="this node's name (the node: scope)"
    )
    admin_port: int = Field(15672, ge=0, le=65535, description="admin HTTP API port (0: off)")
    data_dir: Path = Field(Path("data"), description="store and metadata directory")
    meta: str | None = Field(
        None,
        description="cluster: metadata store URL, redis://H:P/N or "
        "redis+sentinel://H:P[,H:P...]/SERVICE[/N] (none: embedded node)",
    )
    store: str | None = Field(
        None,
        description="message store URL: rocketmq://NAMESRV[;NAMESRV...][/NAMESPACE] stores "
        "every message in Apache RocketMQ (none: mqgw's own store, or the cluster's brokers)",
    )
    reuse_port: bool = Field(
        False,
        description="SO_REUSEPORT on the AMQP and admin listeners: several gateway processes "
        "share one port (set by `mqgw serve --workers`)",
    )

    vhosts: list[str] = Field(
        default_factory=lambda: ["/"], description="virtual hosts created at start"
    )
    # Each created at start when no user of its name exists (RabbitMQ's default_user, applied
    # on first boot only): the API's changes since stay (gateway/node.py). A fresh data
    # directory with no users configured gets guest/guest (administrator) instead.
    users: list[UserSetting] = Field(
        default_factory=list,
        description="users (name, password, tags) created at start if they do not exist",
    )
    loopback_users: list[str] = Field(
        default_factory=lambda: ["guest"], description="users who may only connect from loopback"
    )
    policies: list[PolicySetting] = Field(
        default_factory=list, description="policies applied at start"
    )

    frame_max: int = Field(131072, ge=4096, description="largest frame offered (bytes)")
    channel_max: int = Field(2047, ge=0, le=65535, description="open channels per connection")
    heartbeat_s: int = Field(60, ge=0, description="heartbeat offered (seconds, 0: off)")
    max_message_size_bytes: int = Field(
        128 << 20, gt=0, description="largest message body (at most 512 MiB)"
    )
    max_connections: int = Field(0, ge=0, description="connections per node (0: unlimited)")
    queue_partitions: int = _positive("log partitions per new queue", 1)
    gray_header: str = Field(
        "x-gray", min_length=1, description="message header marking a message gray (gray release)"
    )
    push_tasks: int = _positive("push scheduler tasks, whatever the number of queues", 2)
    push_quota: int = _positive("deliveries per queue per scheduler turn", 64)
    consumer_timeout_ms: int = Field(
        30 * 60 * 1000, ge=0, description="unacked delivery timeout (ms, 0: off)"
    )
    redelivery_ladder_ms: list[int] | None = Field(
        None, description="redelivery backoff steps (ms; none: 1s 5s 10s ... 2h)"
    )
    timer_levels_ms: list[int] | None = Field(
        None, description="the log timer's delay levels (ms; none: built-in)"
    )

    # TLS (RabbitMQ: listeners.ssl.default, ssl_options.*, management.ssl.*). tls_port 0: off.
    tls_port: int = Field(0, ge=0, le=65535, description="AMQPS port (0: off)")
    tls_cert: Path | None = Field(None, description="server certificate chain (PEM)")
    tls_key: Path | None = Field(None, description="server private key (PEM)")
    tls_ca: Path | None = Field(None, description="CA bundle for client certificates (PEM)")
    tls_verify: Literal["none", "peer"] = Field("none", description="ask for client certificates")
    tls_fail_if_no_peer_cert: bool = Field(
        False, description="refuse clients without a certificate"
    )
    tls_versions: list[str] = Field(
        default_factory=lambda: ["tlsv1.2", "tlsv1.3"], description="TLS versions accepted"
    )
    tls_ciphers: str | None = Field(None, description="OpenSSL cipher string (none: defaults)")
    admin_tls_cert: Path | None = Field(None, description="admin API certificate (HTTPS)")
    admin_tls_key: Path | None = Field(None, description="admin API private key (HTTPS)")

    # Handshake and resources (RabbitMQ: handshake_timeout, vm_memory_high_watermark).
    handshake_timeout_ms: int = Field(10_000, ge=0, description="AMQP handshake limit (ms)")
    max_connections_per_address: int = Field(
        0, ge=0, description="connections per client address (0: unlimited)"
    )
    memory_high_watermark: float = Field(
        0.4, gt=0, description="memory alarm: <= 1 fraction of RAM, > 1 bytes"
    )

    flush: FlushPolicy = Field(FlushPolicy.SYNC, description="sync: confirm after fsync")
    segment_size_bytes: int = Field(
        1 << 30,
        ge=4096,
        description="commitlog segment size (fixed per store; must hold the largest message)",
    )
    cq_entries_per_segment: int = Field(
        300_000, gt=0, description="index entries per consume-queue file (fixed per store)"
    )
    retention_ms: int | None = Field(
        None, gt=0, description="opt-in: delete segments this old even if unread (ms)"
    )
    min_retention_ms: int = Field(
        0, ge=0, description="keep consumed segments at least this long (ms)"
    )
    disk_budget_bytes: int | None = Field(
        None, gt=0, description="commitlog size above which publishers are blocked"
    )
    gc_max_live_ratio: float = Field(
        0.5, ge=0, le=1, description="copy a head segment's live records forward below this share"
    )
    gc_copy_rate_bytes: int = _positive("garbage collector copy budget (bytes/s)", 32 << 20)
    min_free_disk_bytes: int = Field(
        50 << 20, ge=0, description="below this free space publishers are blocked"
    )
    store_backlog_limit_bytes: int = Field(
        512 << 20, gt=0, description="written but not durable above this: publishers blocked"
    )
    async_flush_interval_ms: int = _positive("fsync interval under flush = async (ms)", 500)
    checkpoint_interval_ms: int = _positive("index fsync + checkpoint interval (ms)", 1_000)
    offset_persist_interval_ms: int = _positive("consumer offsets write interval (ms)", 5_000)
    retention_check_interval_ms: int = _positive("retention check interval (ms)", 10_000)
    verify_crc_on_read: bool = Field(True, description="check each record's CRC when read")
    recent_records_bytes: int = Field(
        16 << 20, ge=0, description="fan-out records kept decoded for the other queues' reads"
    )

    log_level: LogLevel = Field("info", description="level of every category not in log_levels")
    log_levels: dict[str, LogLevel] = Field(
        default_factory=dict, description="level per category (connection, storage, ...)"
    )
    log_console: bool = Field(True, description="log to stderr")
    log_file: Path | None = Field(None, description="log to this file too")
    log_file_rotation: int | str | None = Field(
        None, description="rotate at a size (bytes, 10MiB) or a time (midnight, h, d, w0)"
    )
    log_file_rotation_count: int = Field(5, ge=0, description="rotated files kept")
    log_format: Literal["plain", "json"] = Field("plain", description="plain text or JSON lines")

    otel_endpoint: str | None = Field(
        None,
        description="OpenTelemetry traces to this OTLP/HTTP collector, e.g. "
        "http://127.0.0.1:4318 (none: off)",
    )
    otel_sampling_ratio: float = Field(
        1.0, ge=0, le=1, description="share of new traces sampled (clients' choices are kept)"
    )

    @field_validator("store")
    @classmethod
    def _known_store(cls, value: str | None) -> str | None:
        if value is not None:
            parse_rocketmq_url(value)  # its ValueError says what is wrong
        return value

    @field_validator("otel_endpoint")
    @classmethod
    def _otlp_http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("an OTLP/HTTP URL, http://HOST:4318 or https://...")
        from gateway.observe.otel_extra import MISSING_PACKAGES, otel_installed  # noqa: PLC0415

        if not otel_installed():
            raise ValueError(MISSING_PACKAGES)
        return value

    @field_validator("max_message_size_bytes")
    @classmethod
    def _message_size_limit(cls, value: int) -> int:
        # RabbitMQ's own ceiling (?MAX_MSG_SIZE): its clients and tools assume no more.
        if value > MAX_MSG_SIZE:
            raise ValueError(f"at most {MAX_MSG_SIZE} (512 MiB, RabbitMQ's limit)")
        return value

    @field_validator("segment_size_bytes")
    @classmethod
    def _segment_holds_largest_message(cls, value: int, info: ValidationInfo) -> int:
        # A record never spans segments: the largest message must fit in one, or publishing
        # it would fail only once someone sends it.
        max_message = info.data.get("max_message_size_bytes")
        if max_message is None:
            return value  # that field failed already, with its own error
        needed = max_record_bytes_for(max_message)
        if needed > largest_record_in(value):
            minimum = value - largest_record_in(value) + needed
            raise ValueError(
                f"a segment of {value} bytes cannot hold the largest message "
                f"(max_message_size_bytes {max_message} plus {needed - max_message} bytes "
                f"of record headers): make segment_size_bytes at least {minimum} or lower "
                "max_message_size_bytes"
            )
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_name(cls, value: Any) -> Any:
        if isinstance(value, str):
            level_number(value)  # "WARN", "Info": one spelling in the model
            value = value.strip().lower()
            return "warning" if value == "warn" else value
        return value

    @field_validator("log_levels", mode="before")
    @classmethod
    def _category_levels(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {check_category(str(k)): cls._level_name(v) for k, v in value.items()}
        return value

    @field_validator("log_file_rotation", mode="after")
    @classmethod
    def _rotation(cls, value: int | str | None) -> int | str | None:
        if value is None:
            return None
        spec = parse_rotation(value)
        if isinstance(spec, int):
            return spec
        when, interval = spec
        return when.lower() if interval == 1 else f"{interval}{when.lower()}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        if not READ_ENVIRONMENT.get():
            return (init_settings,)
        from gateway.config.sources import EnvironmentSource  # noqa: PLC0415 (import cycle)

        return init_settings, EnvironmentSource(settings_cls)

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> GatewaySettings:
        """Settings from ``config_file``, the environment and ``overrides`` (as flags);
        ConfigError (one line, naming the key and its source) when something is wrong."""
        from gateway.config.sources import resolve  # noqa: PLC0415 (import cycle)

        flags = {k: v for k, v in overrides.items() if v is not None}
        if config_file is not None:
            flags["config_file"] = config_file
        return resolve(flags).settings

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            self.data_dir / "store",
            segment_size_bytes=self.segment_size_bytes,
            cq_entries_per_segment=self.cq_entries_per_segment,
            max_record_bytes=max_record_bytes_for(self.max_message_size_bytes),
            flush=self.flush,
            async_flush_interval_ms=self.async_flush_interval_ms,
            offset_persist_interval_ms=self.offset_persist_interval_ms,
            checkpoint_interval_ms=self.checkpoint_interval_ms,
            retention_ms=self.retention_ms,
            min_retention_ms=self.min_retention_ms,
            disk_budget_bytes=self.disk_budget_bytes,
            retention_check_interval_ms=self.retention_check_interval_ms,
            gc_max_live_ratio=self.gc_max_live_ratio,
            gc_copy_rate_bytes=self.gc_copy_rate_bytes,
            verify_crc_on_read=self.verify_crc_on_read,
            recent_records_bytes=self.recent_records_bytes,
        )
