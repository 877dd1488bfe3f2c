"""Kafka's wire constants that more than one part of replicad (and tools/sim) names.

Rules:
- A value the Kafka protocol gives a meaning to, and that two or more modules use, is
  declared here once, under Kafka's own name where it has one; a constant only one module
  uses stays in that module, beside its reason.
- Plain ints, no imports: every layer may use this module, the configuration included.
- Error codes are kio's `ErrorCode` (`kio.schema.errors`), never re-declared.
"""

from __future__ import annotations

# ListOffsets: the special timestamps asking for the log's end (high watermark, or the last
# stable offset under read_committed) and its start.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
# A consumer's replica id in Fetch/ListOffsets; the debugging id reads to the log end offset
# rather than the high watermark (Kafka's DEBUGGING_REPLICA_ID).
CONSUMER_REPLICA_ID = -1
DEBUGGING_REPLICA_ID = -2
# Fetch/ListOffsets isolation_level.
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
# An offset (high watermark, log start, ListOffsets answer) not known or not found; in an
# OffsetFetch answer, no committed offset.
UNKNOWN_OFFSET = -1
# A leader epoch not known (OffsetForLeaderEpoch, ListOffsets answers; a committed offset's
# leader epoch in OffsetFetch).
NO_EPOCH = -1
# Fetch answers: no preferred read replica (KIP-392).
NO_PREFERRED_READ_REPLICA = -1
# DescribeConfigs / IncrementalAlterConfigs resource_type of a topic.
TOPIC_RESOURCE = 2
# Fetch v9 added current_leader_epoch to each partition (KIP-320): the leader fences a
# request of an epoch not its own.
FETCH_CURRENT_LEADER_EPOCH_VERSION = 9
# Fetch v12 added last_fetched_epoch to the request, answered with a DivergingEpoch
# (KIP-320, KIP-595); v13 replaced topic names with topic ids (KIP-516).
FETCH_LAST_FETCHED_EPOCH_VERSION = 12
FETCH_TOPIC_ID_VERSION = 13
# Fetch sessions (KIP-227): the session id of a request without one, and the epoch that
# asks for none (with INVALID_SESSION_ID: a full, sessionless fetch) or closes one.
INVALID_SESSION_ID = 0
FINAL_EPOCH = -1
# Consumer groups, client (groups/cluster_reader.py) and server (leader/group_wire.py):
# FindCoordinator's key_type of a group (Kafka's CoordinatorType.GROUP); FindCoordinator
# v4 batched the keys, OffsetFetch v8 the groups.
GROUP_KEY_TYPE = 0
FIND_COORDINATOR_BATCHED_VERSION = 4
OFFSET_FETCH_BATCHED_VERSION = 8
