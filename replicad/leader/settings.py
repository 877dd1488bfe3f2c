"""What `replicad serve` is told: where to listen, what to advertise, and Kafka's broker-side
knobs that shape a Fetch answer, under Kafka's names and with Kafka's defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from replicad.session.cache import DEFAULT_EVICTION_MS, DEFAULT_MAX_SLOTS

MIB = 1024 * 1024
# Kafka's broker `fetch.max.bytes`: the most one Fetch response carries, whatever it asks.
DEFAULT_FETCH_MAX_BYTES = 55 * MIB
# Kafka's `socket.request.max.bytes`: a larger request frame closes the connection.
DEFAULT_MAX_REQUEST_BYTES = 100 * MIB
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
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # KIP-283: Kafka's broker `log.message.downconversion.enable` ...
    downconversion_enable: bool = True
    # ... and its per-topic `message.downconversion.enable`, which wins over the broker's.
    topic_downconversion_enable: Mapping[str, bool] = field(
        default_factory=lambda: MappingProxyType({})
    )
    downconversion_chunk_bytes: int = DEFAULT_DOWNCONVERSION_CHUNK_BYTES

    def downconversion_enabled(self, topic: str) -> bool:
        return self.topic_downconversion_enable.get(topic, self.downconversion_enable)
