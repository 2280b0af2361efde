"""Gateway settings: command-line flags > MQGW_* environment > --config file > defaults.

The config file is TOML, e.g.:

    amqp_port = 5673
    data_dir = "/var/lib/mqgw"
    vhosts = ["/", "orders"]
    [[users]]
    name = "app"
    password = "s3cret"
    tags = ["management"]
    [[policies]]
    name = "ttl"
    pattern = "^orders\\."
    definition = { message-ttl = 60000, dead-letter-exchange = "dlx" }
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from storage import FlushPolicy, StoreConfig


class UserSetting(BaseModel):
    name: str
    password: str
    tags: list[str] = Field(default_factory=list)


class PolicySetting(BaseModel):
    """A policy applied at start (RabbitMQ's keys, e.g. {"message-ttl": 60000})."""

    name: str
    pattern: str
    definition: dict[str, Any]
    vhost: str = "/"
    priority: int = 0
    apply_to: str = "all"


def _default_node_name() -> str:
    return f"mqgw@{socket.gethostname()}"


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MQGW_", env_nested_delimiter="__")

    config_file: Path | None = None
    amqp_host: str = "0.0.0.0"  # RabbitMQ listens on every interface; guest stays loopback-only
    amqp_port: int = 5672
    admin_host: str = "127.0.0.1"  # the admin API stays on loopback unless configured
    node_name: str = Field(default_factory=_default_node_name)  # the node scope of controls
    admin_port: int = 15672  # 0 disables the admin HTTP listener
    data_dir: Path = Path("data")

    vhosts: list[str] = Field(default_factory=lambda: ["/"])
    # Applied at every start (the file wins for the users it names). A fresh data directory
    # with no users configured gets guest/guest (administrator), as RabbitMQ's first boot.
    users: list[UserSetting] = Field(default_factory=list)
    loopback_users: list[str] = Field(default_factory=lambda: ["guest"])
    policies: list[PolicySetting] = Field(default_factory=list)

    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat_s: int = 60
    max_message_size_bytes: int = 16 << 20
    max_connections: int = 0  # 0: unlimited
    queue_partitions: int = 1
    push_tasks: int = 2  # push scheduler tasks, whatever the number of queues
    push_quota: int = 64  # deliveries per queue per turn
    consumer_timeout_ms: int = 30 * 60 * 1000
    redelivery_ladder_ms: list[int] | None = None  # backoff steps (None: 1s 5s 10s ... 2h)
    timer_levels_ms: list[int] | None = None  # the log timer's delay levels (None: default)

    # TLS (RabbitMQ: listeners.ssl.default, ssl_options.*, management.ssl.*). tls_port 0: off.
    tls_port: int = 0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    tls_verify: Literal["none", "peer"] = "none"
    tls_fail_if_no_peer_cert: bool = False
    tls_versions: list[str] = Field(default_factory=lambda: ["tlsv1.2", "tlsv1.3"])
    tls_ciphers: str | None = None  # an OpenSSL cipher string; None: the library's defaults
    admin_tls_cert: Path | None = None  # set both to serve the admin API over HTTPS
    admin_tls_key: Path | None = None

    # Handshake and resources (RabbitMQ: handshake_timeout, vm_memory_high_watermark).
    handshake_timeout_ms: int = 10_000
    max_connections_per_address: int = 0  # 0: unlimited
    memory_high_watermark: float = 0.4  # <= 1: fraction of RAM (or cgroup limit); > 1: bytes

    flush: FlushPolicy = FlushPolicy.SYNC
    segment_size_bytes: int = 1 << 30
    retention_ms: int = 72 * 3600 * 1000
    disk_budget_bytes: int | None = None
    min_free_disk_bytes: int = 50 << 20  # below this, publishers get connection.blocked
    store_backlog_limit_bytes: int = 512 << 20  # written but not durable: above, blocked too

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> GatewaySettings:
        """Build settings; values from ``config_file`` sit below env and overrides."""
        overrides = {k: v for k, v in overrides.items() if v is not None}
        env_only = cls(**overrides)
        path = config_file or env_only.config_file
        if path is None:
            return env_only
        file_values = TomlConfigSettingsSource(cls, toml_file=path)()
        merged = {**file_values, **env_only.model_dump(exclude_unset=True), **overrides}
        merged["config_file"] = path
        return cls.model_validate(merged)

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            self.data_dir / "store",
            segment_size_bytes=self.segment_size_bytes,
            max_record_bytes=min(
                self.max_message_size_bytes + (64 << 10), self.segment_size_bytes - 64
            ),
            flush=self.flush,
            retention_ms=self.retention_ms,
            disk_budget_bytes=self.disk_budget_bytes,
        )
