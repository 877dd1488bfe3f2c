"""What `replicad serve` is told: where to listen, what to advertise, and Kafka's broker-side
knobs that shape a Fetch answer, under Kafka's names and with Kafka's defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from replicad.config.model import ServeConfig, ServeSecurityConfig, defaults_of
from replicad.session.cache import DEFAULT_EVICTION_MS, DEFAULT_MAX_SLOTS

MIB = 1024 * 1024
# Kafka's broker `fetch.max.bytes`: the most one Fetch response carries, whatever it asks.
DEFAULT_FETCH_MAX_BYTES = 55 * MIB
# The defaults of the serve: keys ServeSettings shares with the config file (one place).
_CONFIG_DEFAULTS: Mapping[str, Any] = defaults_of(ServeConfig)
# KIP-283: how much on-disk data is down-converted at a time (Kafka's MAX_READ_SIZE).
DEFAULT_DOWNCONVERSION_CHUNK_BYTES = 128 * 1024
# Followers and consumers are told this node's id (Kafka's `node.id`).
DEFAULT_NODE_ID = 0


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """The server's settings; `replicad.config.ServeConfig` gives host/port, the rest defaults."""

    host: str = "127.0.0.1"
    # 0 = any free port (LeaderServer.port says which one was bound).
    port: int = 0
    # What Metadata tells clients to connect to; None = the bound address.
    advertised_host: str | None = None
    advertised_port: int | None = None
    # KIP-227 session cache (Kafka's `max.incremental.fetch.session.cache.slots`).
    max_session_slots: int = DEFAULT_MAX_SLOTS
    session_eviction_ms: int = DEFAULT_EVICTION_MS
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    max_request_bytes: int = _CONFIG_DEFAULTS["max_request_bytes"]
    # KIP-283: Kafka's broker `log.message.downconversion.enable` ...
    downconversion_enable: bool = True
    # ... and its per-topic `message.downconversion.enable`, which wins over the broker's.
    topic_downconversion_enable: Mapping[str, bool] = field(
        default_factory=lambda: MappingProxyType({})
    )
    downconversion_chunk_bytes: int = DEFAULT_DOWNCONVERSION_CHUNK_BYTES
    # What one client may ask: ServeConfig's keys of the same names, with its defaults
    # (its comments say what each is).
    queued_max_request_bytes: int = _CONFIG_DEFAULTS["queued_max_request_bytes"]
    request_frame_timeout_ms: int = _CONFIG_DEFAULTS["request_frame_timeout_ms"]
    connections_max_idle_ms: int = _CONFIG_DEFAULTS["connections_max_idle_ms"]
    max_connections: int = _CONFIG_DEFAULTS["max_connections"]
    max_connections_per_ip: int = _CONFIG_DEFAULTS["max_connections_per_ip"]
    # Address -> its own limit (Kafka's max.connections.per.ip.overrides).
    max_connections_per_ip_overrides: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({})
    )
    failed_authentication_delay_ms: int = _CONFIG_DEFAULTS["failed_authentication_delay_ms"]
    authentication_timeout_ms: int = _CONFIG_DEFAULTS["authentication_timeout_ms"]
    request_quota_percentage: int | None = _CONFIG_DEFAULTS["request_quota_percentage"]

    def __post_init__(self) -> None:
        for name in (
            "fetch_max_bytes",
            "max_request_bytes",
            "downconversion_chunk_bytes",
            "queued_max_request_bytes",
            "request_frame_timeout_ms",
            "connections_max_idle_ms",
            "max_connections",
            "max_connections_per_ip",
            "authentication_timeout_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")
        if self.max_session_slots < 0 or self.session_eviction_ms < 0:
            raise ValueError("max_session_slots and session_eviction_ms must be >= 0")
        if self.failed_authentication_delay_ms < 0:
            raise ValueError("failed_authentication_delay_ms must be >= 0")

    @classmethod
    def from_config(cls, config: ServeConfig, **overrides: Any) -> ServeSettings:
        """The settings for the config file's `serve:` section (Kafka's defaults otherwise)."""
        advertised = config.advertised
        return cls(
            host=config.listen.host,
            port=config.listen.port,
            advertised_host=advertised.host if advertised else None,
            advertised_port=advertised.port if advertised else None,
            max_request_bytes=config.max_request_bytes,
            queued_max_request_bytes=config.queued_max_request_bytes,
            request_frame_timeout_ms=config.request_frame_timeout_ms,
            connections_max_idle_ms=config.connections_max_idle_ms,
            max_connections=config.max_connections,
            max_connections_per_ip=config.max_connections_per_ip,
            max_connections_per_ip_overrides=MappingProxyType(
                dict(_address_count(item) for item in config.max_connections_per_ip_overrides)
            ),
            failed_authentication_delay_ms=config.failed_authentication_delay_ms,
            authentication_timeout_ms=config.authentication_timeout_ms,
            request_quota_percentage=config.request_quota_percentage,
            downconversion_enable=config.message_downconversion_enable,
            **overrides,
        )

    def downconversion_enabled(self, topic: str) -> bool:
        return self.topic_downconversion_enable.get(topic, self.downconversion_enable)


def _address_count(item: str) -> tuple[str, int]:
    """("10.0.0.5", 200) of "10.0.0.5:200" (the config's rule has checked the form)."""
    address, _, count = item.rpartition(":")
    return address.strip("[]"), int(count)


# Stand-ins for the keys a whole config requires but `replicad serve` has no use for; they
# are valid, so no problem is ever reported about them.
_SERVE_ONLY_PLACEHOLDERS: Mapping[str, object] = MappingProxyType(
    {
        "source.bootstrap_servers": "placeholder.invalid:9092",
        "topics.include": ["placeholder"],
        "serve.listen": "127.0.0.1:0",
    }
)


def serve_security_from_options(options: Mapping[str, object]) -> ServeSecurityConfig:
    """`serve.security` from dotted options (`replicad serve`'s flags: serve.security.* and
    serve.allowed_followers), checked by the config file's own rules and cross checks.

    Raises `replicad.errors.ConfigErrors` naming each bad key.
    """
    from replicad.config import load_config

    config = load_config(None, {**_SERVE_ONLY_PLACEHOLDERS, **options})
    assert config.serve is not None
    return config.serve.security
