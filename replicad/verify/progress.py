"""What the daemon's continuous check has proved so far, and what it walks next (sans-I/O).

`replicad run` with `verify.enabled` walks the replica against its source again and again at
a low rate (the shell: replicad/verify/continuous.py). This core keeps, per partition, how
far the replica is proved and what was found; the shell reports each walk's
`PartitionResult` (compare.py) here and asks what to do next. It opens no socket, reads no
file and no clock (`now_ms` is passed in).

Rules:
- Each replicated partition (of `topics`, when named) has a verified offset: every offset
  below it was settled by a walk (identical, a mismatch, no longer at the source, rewritten
  by its log cleaner). It starts at the replica's log start, only moves forward, and is
  never below the log start (local retention passed it: nothing is left there to prove).
- A pass (`plan`) walks, in topic-partition order, each partition whose log end is past its
  verified offset, from there to the log end the pass saw; partitions with nothing new cost
  nothing. A walk that stops early (the source unreachable, the replica moved under it)
  keeps what it settled, says why (`unverified`, shown until a later walk of the partition
  ends clean) and is walked again on the next pass.
- Offsets past the source's high watermark (the follower fetched them first) are not yet
  verified, and not an error: the next pass goes on from there.
- Mismatches are kept: a partition found to differ from its source stays in error, as the
  replica does not heal by itself (after a restart, the walk finds it again). The first
  `MAX_KEPT` of a partition are kept whole, all are counted; the same offset found again (a
  re-check) is not counted twice. Ranges gone at the source and batches its cleaner
  rewrote are counted, never errors.
- Re-checks (`sample` > 0): after its walk, a pass compares `sample` more batches of each
  partition, at offsets drawn at random below its verified offset with the pass's seed
  (`sample_offsets`; the seed goes into any mismatch's detail), so damage done after the
  first comparison is found too. A draw is over offsets, so a batch of many records is
  drawn more often than one of a single record.
- Partitions the replica no longer has are forgotten.
- Saved across restarts (`checkpoint`, `resume`): each partition's verified offset, held
  at its first mismatch, so a restart neither walks the whole replica again nor forgets a
  damaged batch (the walk after it finds the batch again). A saved offset past the log end
  (the replica lost its tail since) counts up to the log end.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from replicad.types import TopicPartition
from replicad.verify.compare import Mismatch, OffsetRange, PartitionResult

# Mismatches kept whole per partition (all are counted).
MAX_KEPT = 10


@dataclass(slots=True)
class PartitionProof:
    verified_offset: int
    log_start_offset: int
    log_end_offset: int
    mismatches: list[Mismatch] = field(default_factory=list)
    mismatch_count: int = 0
    batches_compared: int = 0
    bytes_compared: int = 0
    gone_at_source: int = 0  # offsets no longer at the source when walked
    rewritten_at_source: int = 0  # offsets in batches the source's cleaner rewrote
    unverified: str | None = None
    walks: int = 0

    def as_dict(self, tp: TopicPartition) -> dict[str, Any]:
        return {
            "topic": tp.topic,
            "partition": tp.partition,
            "verified_offset": self.verified_offset,
            "log_start_offset": self.log_start_offset,
            "log_end_offset": self.log_end_offset,
            "unverified_offsets": max(0, self.log_end_offset - self.verified_offset),
            "mismatch_count": self.mismatch_count,
            "mismatches": [m.as_dict() for m in self.mismatches],
            "batches_compared": self.batches_compared,
            "bytes_compared": self.bytes_compared,
            "gone_at_source": self.gone_at_source,
            "rewritten_at_source": self.rewritten_at_source,
            "unverified": self.unverified,
        }


@dataclass(frozen=True, slots=True)
class Walk:
    """One partition to walk in this pass: from `start` over the replica's `replica`."""

    tp: TopicPartition
    replica: OffsetRange
    start: int


def _span(ranges: Iterable[OffsetRange]) -> int:
    return sum(r.end - r.start for r in ranges)


class VerifyProgress:
    def __init__(self, topics: Iterable[str] = (), sample: int = 0) -> None:
        self.topics = frozenset(topics)
        self.sample = sample
        self.partitions: dict[TopicPartition, PartitionProof] = {}
        self.passes = 0
        self.last_pass_ms: int | None = None
        self.problem: str | None = None  # why the last pass could not start (the source)
        self._resumed: dict[TopicPartition, int] = {}

    def resume(self, saved: Mapping[TopicPartition, int]) -> None:
        """Verified offsets an earlier run saved (`checkpoint`), taken at the next `plan`."""
        self._resumed = dict(saved)

    def checkpoint(self) -> dict[TopicPartition, int]:
        """What to save: each partition's verified offset, held at its first mismatch."""
        saved = {}
        for tp, proof in self.partitions.items():
            first = min((m.offset for m in proof.mismatches), default=proof.verified_offset)
            saved[tp] = min(proof.verified_offset, first)
        return saved

    # -- a pass -----------------------------------------------------------------------

    def plan(self, replica: Mapping[TopicPartition, OffsetRange]) -> list[Walk]:
        """The walks of the next pass, given each replicated partition's range now."""
        chosen = {tp: r for tp, r in replica.items() if not self.topics or tp.topic in self.topics}
        for tp in [tp for tp in self.partitions if tp not in chosen]:
            del self.partitions[tp]
        walks = []
        for tp, offsets in sorted(chosen.items()):
            proof = self.partitions.get(tp)
            if proof is None:
                start = min(self._resumed.pop(tp, offsets.start), offsets.end)
                proof = PartitionProof(max(start, offsets.start), offsets.start, offsets.end)
                self.partitions[tp] = proof
            proof.log_start_offset, proof.log_end_offset = offsets.start, offsets.end
            proof.verified_offset = max(proof.verified_offset, offsets.start)
            if proof.verified_offset < offsets.end:
                walks.append(Walk(tp, offsets, proof.verified_offset))
        return walks

    def sample_offsets(self, tp: TopicPartition, seed: int) -> list[int]:
        """Offsets to re-check in `tp` this pass: `sample` drawn below its verified offset
        from its log start, distinct, in order (none before anything is verified)."""
        proof = self.partitions.get(tp)
        if proof is None or self.sample <= 0:
            return []
        span = range(proof.log_start_offset, proof.verified_offset)
        if not span:
            return []
        rng = random.Random(f"{seed}:{tp}")
        return sorted(set(rng.choices(span, k=self.sample)))

    def walked(self, result: PartitionResult, *, sampled: bool = False) -> list[Mismatch]:
        """A walk's (or a re-check's) result; returns the mismatches not seen before (to log)."""
        proof = self.partitions.get(result.tp)
        if proof is None:
            return []
        if not sampled:
            proof.walks += 1
            proof.verified_offset = max(proof.verified_offset, result.verified_to)
            proof.gone_at_source += _span(result.gone_at_source)
            proof.unverified = result.unverified
        proof.rewritten_at_source += _span(result.rewritten_at_source)
        proof.batches_compared += result.batches_compared
        proof.bytes_compared += result.bytes_compared
        known = {(m.offset, m.kind) for m in proof.mismatches}
        new = [m for m in result.mismatches if (m.offset, m.kind) not in known]
        proof.mismatch_count += len(new)
        room = MAX_KEPT - len(proof.mismatches)
        proof.mismatches.extend(new[: max(0, room)])
        return new

    def skipped(self, tp: TopicPartition, why: str) -> None:
        """A walk that could not start or was given up (its offsets stay unverified)."""
        proof = self.partitions.get(tp)
        if proof is not None:
            proof.unverified = why

    def pass_done(self, now_ms: int) -> None:
        self.passes += 1
        self.last_pass_ms = now_ms

    # -- what status shows ------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        rows = [proof.as_dict(tp) for tp, proof in sorted(self.partitions.items())]
        return {
            "passes": self.passes,
            "last_pass_ms": self.last_pass_ms,
            "problem": self.problem,
            "sample": self.sample,
            "partitions": rows,
            "mismatches_total": sum(p.mismatch_count for p in self.partitions.values()),
            "partitions_mismatched": sum(1 for p in self.partitions.values() if p.mismatch_count),
            "unverified_offsets": sum(r["unverified_offsets"] for r in rows),
            "batches_compared": sum(p.batches_compared for p in self.partitions.values()),
            "bytes_compared": sum(p.bytes_compared for p in self.partitions.values()),
        }
