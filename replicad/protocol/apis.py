"""The Kafka APIs replicad speaks, and ApiVersions negotiation.

Rule: for every API replicad implements, use the highest version both sides
support. A broker that shares no version of an API we need cannot be used, and
that is said plainly (with both ranges) rather than discovered later as a
decode error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

from replicad.errors import ProtocolError


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    DESCRIBE_TOPIC_PARTITIONS = 75


@dataclass(frozen=True, slots=True)
class VersionRange:
    min: int
    max: int

    def __str__(self) -> str:
        return f"v{self.min}..v{self.max}"


# What this client sends. Fetch starts at v4 (record batch v2, isolation level);
# v13+ carries topic ids; v17 is the newest replicad is tested against.
# Metadata v4+ lets us say "don't auto-create"; v10+ returns topic ids.
CLIENT_VERSIONS: Mapping[ApiKey, VersionRange] = {
    ApiKey.FETCH: VersionRange(4, 17),
    ApiKey.LIST_OFFSETS: VersionRange(1, 9),
    ApiKey.METADATA: VersionRange(4, 12),
    ApiKey.API_VERSIONS: VersionRange(0, 3),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: VersionRange(2, 4),
    # SASL (replicad.protocol.security): handshake v1 frames the exchange in
    # SaslAuthenticate; v0 would send raw SASL tokens, which replicad does not do.
    ApiKey.SASL_HANDSHAKE: VersionRange(1, 1),
    ApiKey.SASL_AUTHENTICATE: VersionRange(0, 2),
    # Reading the source's consumer groups and topic configs (replicad.groups.cluster_reader):
    # none is required, a broker without them only leaves group offsets unsynced. OffsetFetch
    # stops at v9: v10 names topics by id only.
    ApiKey.FIND_COORDINATOR: VersionRange(0, 6),
    ApiKey.OFFSET_FETCH: VersionRange(1, 9),
    ApiKey.LIST_GROUPS: VersionRange(0, 5),
    ApiKey.DESCRIBE_GROUPS: VersionRange(0, 6),
    ApiKey.DESCRIBE_CONFIGS: VersionRange(1, 4),
    # Mirroring into a destination cluster (replicad.mirror): an idempotent producer, and the
    # destination's topics created like the source's. Produce stops at v12: v13 names topics
    # by id only.
    ApiKey.PRODUCE: VersionRange(3, 12),
    ApiKey.INIT_PRODUCER_ID: VersionRange(0, 5),
    ApiKey.CREATE_TOPICS: VersionRange(2, 7),
    ApiKey.CREATE_PARTITIONS: VersionRange(0, 3),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: VersionRange(0, 1),
    # Consumer-group offsets committed at the destination (replicad.mirror.group_writer):
    # Kafka 4 takes v2 and up; v10 names topics by id only.
    ApiKey.OFFSET_COMMIT: VersionRange(2, 9),
}

# APIs without which a source broker is useless to us.
REQUIRED_APIS = (ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA)


class UnsupportedBrokerError(ProtocolError):
    """The broker shares no version with us of an API we need."""


@dataclass(frozen=True, slots=True)
class NegotiatedVersions:
    versions: Mapping[int, int]

    def get(self, api: ApiKey) -> int | None:
        return self.versions.get(int(api))

    def require(self, api: ApiKey) -> int:
        version = self.versions.get(int(api))
        if version is None:
            raise UnsupportedBrokerError(f"broker does not support {api.name}")
        return version


def negotiate(
    broker: Mapping[int, VersionRange],
    client: Mapping[ApiKey, VersionRange] = CLIENT_VERSIONS,
    required: tuple[ApiKey, ...] = REQUIRED_APIS,
) -> NegotiatedVersions:
    """Pick, for every API we implement, the highest version both sides support."""
    chosen: dict[int, int] = {}
    for api, ours in client.items():
        theirs = broker.get(int(api))
        if theirs is None:
            if api in required:
                raise UnsupportedBrokerError(f"broker does not offer {api.name} (we need {ours})")
            continue
        high = min(ours.max, theirs.max)
        low = max(ours.min, theirs.min)
        if high < low:
            if api in required:
                raise UnsupportedBrokerError(
                    f"no common version of {api.name}: broker {theirs}, replicad {ours}"
                )
            continue
        chosen[int(api)] = high
    return NegotiatedVersions(chosen)
