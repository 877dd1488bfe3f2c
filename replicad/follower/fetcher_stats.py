"""What one leader's fetcher has done, for `replicad status` and metrics: counters the
partition table and its shell add to, read by status.py and metrics.py."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class FetcherStats:
    """What a fetcher has done, for `replicad status` and metrics."""

    requests: int = 0
    responses: int = 0
    bytes_fetched: int = 0
    bytes_appended: int = 0
    batches_appended: int = 0
    crc_failures: int = 0
    partial_batches_dropped: int = 0
    connection_errors: int = 0
    rejected_responses: int = 0
    truncations: int = 0
    loop_errors: int = 0
    # Fetch frames as written to and read from the socket (size prefix included).
    last_request_bytes: int = 0
    last_response_bytes: int = 0
    request_bytes_total: int = 0
    response_bytes_total: int = 0
    # Partitions the last request named, and the requests that were a sessionless leader's
    # share of its partitions (partition_table.py's R11).
    last_request_partitions: int = 0
    sessionless_shares: int = 0
    # The last request was such a share, and the passes over every partition begun.
    in_shares: bool = False
    share_passes: int = 0
    last_latency_ms: float = 0.0
    # The round trip of the last answer that carried records: an idle leader's answers
    # wait out the long poll (fetch.max_wait_ms), which is not latency.
    last_data_latency_ms: float | None = None
    last_error: str | None = None
    # Since when (monotonic ms) the connection to this leader keeps failing; None while
    # responses come back (control/health.py reads it).
    failing_since_ms: int | None = None
    partition_errors: Counter[str] = field(default_factory=Counter)
    session_recoveries: Counter[str] = field(default_factory=Counter)
