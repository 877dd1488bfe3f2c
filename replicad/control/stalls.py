"""Stalled partitions: replicating, behind their leader, and not moving.

A daemon that silently stops is worse than one that crashes (systemd restarts a crash).
A partition is stalled when its leader is known and connected, it is fetching (not halted,
not reconciling a divergence), it lags (the leader's high watermark is above its log end),
and its log end has not moved for `stall_after_ms`, and it is not waiting for disk space
(`waits_for_disk`). Each stall is reported once, when it
begins, with what is needed to debug it; it ends when the partition moves again (or stops
lagging), and a later stall of the same partition is a new one. At most
`STALL_LINES_AT_ONCE` stalls that began (or ended) in one check get a line each; one more
line counts and names the rest (a leader lost at 10,000 partitions stalls them all in one
check: 10,000 warnings at once, then as many when they move again, buried every other line).

A full disk is not a stall: health names it (the disk refused the partition's last append,
and when). A partition paused on a full disk retries every few seconds (the follower's
DISK_FULL_RETRY_MS), and between its retry and the append the disk refuses again it is
fetching, lagging and idle: it waits for disk space while the disk's last refusal came after
its log last moved and it left that pause less than `stall_after_ms` ago. Once the disk takes
appends again, a partition that still does not move is refused no more, and
`stall_after_ms` after that retry it is stalled (its idle time counts from the retry, not from
its last move).

A leader that keeps no fetch session is asked its partitions a share at a time, in passes
that ask each partition once (the follower's partition table, R11): on a slow leader (Tansu
under load took 4 s a share of 100 partitions) a pass over thousands of partitions takes
longer than `stall_after_ms`. Tansu answers the partitions it did not read within the
request's max wait without records: a partition so cut short (behind, after the last one
the answer gave records) keeps its place, goes first in the next share, and the answer is
not counted (the follower's R11): it waits in a queue that moves at the leader's pace (after
a full minute, hundreds of partitions behind and Tansu reading 20 of each share of 100,
session 14). While its leader is fetched in shares (`in_shares`), a partition waits for its
turn (`waits_for_turn`), not stalled, until `SHARE_ANSWERS_TO_JUDGE` other requests that
named it have ended since its log last moved (the one that moved it not counted; answered,
or failed by the leader -- no answer in time, or a malformed one -- on a connection that had
answered: a partition the leader never answers is judged too, and so is one the leader read
past or answered while giving no partition records; a request lost with its connection, as
while the leader restarts, is no turn: the follower's R14) or the disk last refused an
answer's records (that answer would have moved it: the partition waits for its next turn
after its retry, not for the leader); then the rule applies from its last move as to any
other.

Idle time (`idle_ms`) counts from the log's last move, or from the last answer that found the
partition caught up (R12: as a Kafka leader counts a follower's lag from when it last caught
up; a partition with no new records for minutes was judged on the first answer that cut it
short). It does not start again when a full disk's pause ends: the disk rule already holds
the partition until `stall_after_ms` after its retry, the same moment a clock started at the
retry would reach the stall time, and the pause is said as its own error (`last_error`
"disk full", `disk_full_ago_ms`, health's `partitions_disk_full`); `idle_ms` keeps saying how
long the log has not moved.

Sans-I/O: `check` reads the status snapshot's partitions and leaders (plain mappings) and
returns what began and ended; the daemon logs and counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from replicad.config.model import ControlConfig, defaults_of

DEFAULT_STALL_AFTER_MS = defaults_of(ControlConfig)["stall_after_ms"]
# Stalls logged a line each in one check (see the rules).
STALL_LINES_AT_ONCE = 10
# Names listed in the line that counts the rest.
STALL_NAMES_IN_SUMMARY = 20
# Answers since its last move after which a partition of a leader fetched in shares is
# judged: an empty one may be the leader's wait running out; the next comes first in a share.
SHARE_ANSWERS_TO_JUDGE = 2
# The snapshot's state of a partition paused because the disk is full (the follower's
# PartitionPhase.PAUSED_DISK_FULL; control does not import the follower).
PAUSED_DISK_FULL = "paused-disk-full"


def partition_name(p: Mapping[str, Any]) -> str:
    return f"{p.get('topic')}-{p.get('partition')}"


def one_line_each(items: Sequence[Any]) -> tuple[Sequence[Any], Sequence[Any]]:
    """(those logged a line each, the rest, counted and named in one line)."""
    return items[:STALL_LINES_AT_ONCE], items[STALL_LINES_AT_ONCE:]


def summary_names(names: Sequence[str]) -> str:
    """The first STALL_NAMES_IN_SUMMARY names, and how many more."""
    shown = ", ".join(names[:STALL_NAMES_IN_SUMMARY])
    more = len(names) - STALL_NAMES_IN_SUMMARY
    return shown + (f" and {more} more" if more > 0 else "")


def connected_leaders(leaders: Sequence[Mapping[str, Any]]) -> dict[int, bool]:
    """{node id: connected} from the snapshot's leaders (connected unless it says not)."""
    return {int(leader["node_id"]): bool(leader.get("connected", True)) for leader in leaders}


def waits_for_disk(p: Mapping[str, Any], stall_after_ms: int) -> bool:
    """Paused on a full disk, or retrying since the disk refused its last append (see the
    rules), for one partition of the snapshot."""
    if p.get("state") == PAUSED_DISK_FULL:
        return True
    refused, retried = p.get("disk_full_ago_ms"), p.get("disk_retry_ago_ms")
    return (
        refused is not None
        and int(refused) <= int(p.get("idle_ms") or 0)  # refused since its log last moved
        and retried is not None
        and int(retried) <= int(refused)  # and has tried again since
        and int(retried) < stall_after_ms
    )


def sharing_leaders(leaders: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """The leaders the snapshot says are fetched in shares (their last request was one)."""
    return frozenset(int(leader["node_id"]) for leader in leaders if leader.get("in_shares"))


def waits_for_turn(p: Mapping[str, Any], sharing: frozenset[int]) -> bool:
    """Its leader is fetched in shares and fewer than SHARE_ANSWERS_TO_JUDGE requests that
    named it have ended since its log last moved (see the rules), for one partition of the
    snapshot."""
    if int(p.get("leader", -1)) not in sharing:
        return False
    return int(p.get("answers_since_move") or 0) < SHARE_ANSWERS_TO_JUDGE


def is_stalled(
    p: Mapping[str, Any],
    connected: Mapping[int, bool],
    stall_after_ms: int,
    sharing: frozenset[int] = frozenset(),
) -> bool:
    """The rule, for one partition of the snapshot."""
    leader = int(p.get("leader", -1))
    return (
        leader >= 0
        and connected.get(leader, False)
        and p.get("state") == "fetching"
        and int(p.get("lag") or 0) > 0
        and int(p.get("idle_ms") or 0) >= stall_after_ms
        and not waits_for_disk(p, stall_after_ms)
        and not waits_for_turn(p, sharing)
    )


@dataclass(frozen=True, slots=True)
class StallChange:
    """Partitions whose stall began (their snapshot rows) and ended (names), this check."""

    began: tuple[Mapping[str, Any], ...] = ()
    ended: tuple[str, ...] = ()


@dataclass(slots=True)
class StallWatch:
    stall_after_ms: int = DEFAULT_STALL_AFTER_MS
    # Stalled now: partition name -> its idle_ms when the stall was first seen.
    stalled: dict[str, int] = field(default_factory=dict)
    # Stalls that began since start.
    total: int = 0

    def check(
        self, partitions: Sequence[Mapping[str, Any]], leaders: Sequence[Mapping[str, Any]]
    ) -> StallChange:
        connected = connected_leaders(leaders)
        sharing = sharing_leaders(leaders)
        now = {
            partition_name(p): p
            for p in partitions
            if is_stalled(p, connected, self.stall_after_ms, sharing)
        }
        began = tuple(p for name, p in now.items() if name not in self.stalled)
        ended = tuple(name for name in self.stalled if name not in now)
        for name in ended:
            del self.stalled[name]
        for p in began:
            self.stalled[partition_name(p)] = int(p.get("idle_ms") or 0)
        self.total += len(began)
        return StallChange(began, ended)

    def status(self) -> dict[str, Any]:
        return {
            "stall_after_ms": self.stall_after_ms,
            "stalled": len(self.stalled),
            "stalls_total": self.total,
            "partitions": sorted(self.stalled),
        }
