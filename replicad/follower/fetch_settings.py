"""How the follower fetches: its settings, and the byte budget of one Fetch response.

Rules:
- Every value comes from the configuration (`FetchSettings.from_config`); a default here
  is only for tests and tools that build settings by hand.
- A whole response -- records and the fields around them -- must fit the memory pool
  (`response_budget`), or it could never be read and the fetch would stall.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicad.config.model import Config, FetchConfig, SourceConfig, TopicsConfig, defaults_of

# KIP-74's max_bytes counts record bytes only; a response also carries, per topic and per
# partition, fields it does not count. Upper bounds of those fields over the versions we
# speak (v4..v17; the flexible ones add tagged DivergingEpoch, CurrentLeader and
# SnapshotId), so a whole response -- not just its records -- fits the memory pool.
RESPONSE_OVERHEAD_BYTES = 64
PARTITION_OVERHEAD_BYTES = 96
TOPIC_OVERHEAD_BYTES = 16 + 2 + 249 + 8  # id or name (at most 249 characters), counts, tags


def response_budget(
    response_max_bytes: int, buffer_memory: int, *, partitions: int, topics: int
) -> int:
    """The max_bytes to ask for: fetch.response_max_bytes, lowered when the fields around
    the records of this many partitions and topics would push a whole response past
    fetch.buffer_memory (a response larger than the pool waits for it to empty and is read
    alone, holding up every other leader: replicad/pool/rules.py). At least 1: the leader
    still returns one whole batch (KIP-74)."""
    overhead = (
        RESPONSE_OVERHEAD_BYTES
        + partitions * PARTITION_OVERHEAD_BYTES
        + topics * TOPIC_OVERHEAD_BYTES
    )
    return max(1, min(response_max_bytes, buffer_memory - overhead))


_FETCH = defaults_of(FetchConfig)
_SOURCE = defaults_of(SourceConfig)
_TOPICS = defaults_of(TopicsConfig)


@dataclass(frozen=True, slots=True)
class FetchSettings:
    """The fetch: keys, and what source: and topics: say about fetching, as the fetchers
    use them (the config model's defaults)."""

    response_max_bytes: int = _FETCH["response_max_bytes"]
    partition_max_bytes: int = _FETCH["partition_max_bytes"]
    wait_max_ms: int = _FETCH["wait_max_ms"]
    min_bytes: int = _FETCH["min_bytes"]
    backoff_ms: int = _FETCH["backoff_ms"]
    sessions: bool = _FETCH["sessions"]
    replica_id: int = _FETCH["replica_id"]
    isolation_level: int = _FETCH["isolation_level"].wire_value
    rack_id: str = _SOURCE["rack_id"]
    start_from: str = str(_TOPICS["start_from"])  # "earliest" or "latest"
    on_gap: str = str(_TOPICS["on_gap"])  # "reset" or "halt"
    request_timeout_ms: int = _SOURCE["request_timeout_ms"]
    reconnect_backoff_ms: int = _SOURCE["reconnect_backoff_ms"]
    reconnect_backoff_max_ms: int = _SOURCE["reconnect_backoff_max_ms"]
    buffer_memory: int = _FETCH["buffer_memory"]  # KIP-81 pool, shared by all fetchers
    # Partitions in one request to a sessionless leader (partition_table.py's R11).
    sessionless_max_partitions: int = _FETCH["sessionless_max_partitions"]
    # The least max wait of such a request (R11).
    sessionless_wait_ms: int = _FETCH["sessionless_wait_ms"]

    @classmethod
    def from_config(cls, config: Config) -> FetchSettings:
        fetch, source, topics = config.fetch, config.source, config.topics
        return cls(
            response_max_bytes=fetch.response_max_bytes,
            partition_max_bytes=fetch.partition_max_bytes,
            wait_max_ms=fetch.wait_max_ms,
            min_bytes=fetch.min_bytes,
            backoff_ms=fetch.backoff_ms,
            sessions=fetch.sessions,
            replica_id=fetch.replica_id,
            isolation_level=fetch.isolation_level.wire_value,
            rack_id=source.rack_id,
            start_from=str(topics.start_from),
            on_gap=str(topics.on_gap),
            request_timeout_ms=source.request_timeout_ms,
            reconnect_backoff_ms=source.reconnect_backoff_ms,
            reconnect_backoff_max_ms=source.reconnect_backoff_max_ms,
            buffer_memory=fetch.buffer_memory,
            sessionless_max_partitions=fetch.sessionless_max_partitions,
            sessionless_wait_ms=fetch.sessionless_wait_ms,
        )
