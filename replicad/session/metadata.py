"""Fetch-session metadata shared by both sides (the counterpart of Kafka's FetchMetadata).

Rules (KIP-227):
- A request's (session_id, epoch) says what it is:
    (0, -1)   full fetch, no session (pre-KIP-227 behaviour, "legacy");
    (0, 0)    full fetch, create a session if the leader can;
    (ID, 0)   close session ID, full fetch, create a new session if possible;
    (ID, -1)  close session ID, full fetch, no new session;
    (ID, N>0) incremental fetch in session ID at epoch N.
- A request is full exactly when its epoch is INITIAL_EPOCH or FINAL_EPOCH.
- Epochs advance by one per accepted request; after MAX_EPOCH (2^31-1) comes 1,
  never 0 (that would mean "new session"); FINAL_EPOCH stays FINAL_EPOCH.
- A new session's first incremental request carries epoch 1.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from replicad.types import TopicPartition
from replicad.wire import FINAL_EPOCH, INVALID_SESSION_ID

# INVALID_SESSION_ID and FINAL_EPOCH are replicad.wire's: every Fetch request names them.
INITIAL_EPOCH = 0
MAX_EPOCH = 2**31 - 1
# Session ids are positive 31-bit ints (the wire field is a signed int32).
MAX_SESSION_ID = 2**31 - 1


def next_epoch(epoch: int) -> int:
    """The epoch that follows `epoch`: FINAL stays FINAL, MAX_EPOCH wraps to 1."""
    if epoch < 0:
        return FINAL_EPOCH
    if epoch == MAX_EPOCH:
        return 1
    return epoch + 1


def is_full_epoch(epoch: int) -> bool:
    """A request with this epoch is a full fetch (it lists every partition it wants)."""
    return epoch in (INITIAL_EPOCH, FINAL_EPOCH)


@dataclass(frozen=True, slots=True)
class FetchMetadata:
    """The (session_id, epoch) pair of one fetch request."""

    session_id: int
    epoch: int

    @property
    def is_full(self) -> bool:
        return is_full_epoch(self.epoch)

    def close_existing(self) -> FetchMetadata:
        """Close this session and do not create another (shutdown)."""
        return FetchMetadata(self.session_id, FINAL_EPOCH)

    def close_existing_attempt_new(self) -> FetchMetadata:
        """Close this session (if any) with a full fetch that may create a new one."""
        return FetchMetadata(self.session_id, INITIAL_EPOCH)

    def next_incremental(self) -> FetchMetadata:
        return FetchMetadata(self.session_id, next_epoch(self.epoch))

    @staticmethod
    def new_incremental(session_id: int) -> FetchMetadata:
        """The first incremental request in a session the leader just created."""
        return FetchMetadata(session_id, next_epoch(INITIAL_EPOCH))

    def __str__(self) -> str:
        sid = "INVALID" if self.session_id == INVALID_SESSION_ID else str(self.session_id)
        names = {INITIAL_EPOCH: "INITIAL", FINAL_EPOCH: "FINAL"}
        return f"(session_id={sid}, epoch={names.get(self.epoch, self.epoch)})"


INITIAL = FetchMetadata(INVALID_SESSION_ID, INITIAL_EPOCH)
LEGACY = FetchMetadata(INVALID_SESSION_ID, FINAL_EPOCH)


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """What a fetcher asks of one partition (one entry of a Fetch request)."""

    fetch_offset: int
    log_start_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    # Fetch v13+ names topics by id. Set it only when the connection can use v13+.
    topic_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class TopicIdPartition:
    """A partition together with the topic id it had (v13+ forgets partitions by id)."""

    topic_id: uuid.UUID | None
    partition: TopicPartition
