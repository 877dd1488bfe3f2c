"""How the follower fetches: its settings, and the byte budget of one Fetch response.

Rules:
- Every value comes from the configuration (`FetchSettings.from_config`); a default here
  is only for tests and tools that build settings by hand.
- A whole response -- records and the fields around them -- must fit the memory pool
  (`response_budget`), or it could never be read and the fetch would stall.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    fetch.buffer_memory (a response that cannot be reserved is never read: the fetch would
    stall). At least 1: the leader still returns one whole batch (KIP-74)."""
    overhead = (
        RESPONSE_OVERHEAD_BYTES
        + partitions * PARTITION_OVERHEAD_BYTES
        + topics * TOPIC_OVERHEAD_BYTES
    )
    return max(1, min(response_max_bytes, buffer_memory - overhead))


@dataclass(frozen=True, slots=True)
class FetchSettings:
    response_max_bytes: int = 10 * 1024 * 1024
    partition_max_bytes: int = 1024 * 1024
    wait_max_ms: int = 500
    min_bytes: int = 1
    backoff_ms: int = 1000
    sessions: bool = True
    replica_id: int = -1
    isolation_level: int = 0
    rack_id: str = ""
    start_from: str = "earliest"  # or "latest"
    on_gap: str = "reset"  # or "halt"
    request_timeout_ms: int = 30_000
    reconnect_backoff_ms: int = 100
    reconnect_backoff_max_ms: int = 10_000
    buffer_memory: int = 100 * 1024 * 1024  # KIP-81 pool, shared by all fetchers
