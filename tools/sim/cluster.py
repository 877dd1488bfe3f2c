"""A simulated Kafka cluster for the follower's deterministic simulation.

Per partition it keeps one log per replica (batches with leader epochs), the leader and
its epoch, the in-sync replicas, the high watermark and the log start offset; per broker
the leader's KIP-227 session model (`replicad.session.cache.FetchSessionCache`, the same
one `replicad serve` uses). It answers Fetch, ListOffsets and OffsetForLeaderEpoch the way
a Kafka leader answers a consumer (replica_id -1): records only up to the high watermark,
DivergingEpoch from v12, FENCED/UNKNOWN_LEADER_EPOCH on a stale or future epoch,
OFFSET_OUT_OF_RANGE outside [log start, high watermark], a byte limit that may cut the
last batch (KIP-74), and at least one whole batch in a response.

Every batch ever written by a leader is recorded with the batch before it in that
leader's log (`History`), so a replica can be checked to be a prefix of a real lineage.
Nothing here reads a clock or a random source of its own: time and `random.Random` are
passed in.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from replicad.follower.fetch_response import (
    NO_DIVERGING_EPOCH,
    EpochEndOffset,
    FetchedPartition,
    FetchedTopic,
    FetchResponseView,
)
from replicad.log.epoch import UNDEFINED_EPOCH, EpochEntry, LeaderEpochCache
from replicad.protocol.fetch_request import FetchRequest
from replicad.session.cache import (
    FetchSessionCache,
    PartitionResult,
    SessionRequest,
    unresolved_topic_name,
)
from replicad.session.metadata import PartitionFetch, TopicIdPartition
from replicad.types import TopicPartition
from replicad.wire import (
    FETCH_CURRENT_LEADER_EPOCH_VERSION,
    FETCH_LAST_FETCHED_EPOCH_VERSION,
    FETCH_TOPIC_ID_VERSION,
    NO_EPOCH,
)
from tools.logdata.batches import producer_batch


@dataclass(frozen=True, slots=True)
class SimBatch:
    base: int
    count: int
    epoch: int
    data: bytes

    @property
    def next_offset(self) -> int:
        return self.base + self.count


@dataclass(slots=True)
class Replica:
    batches: list[SimBatch] = field(default_factory=list)
    log_start: int = 0
    # The last batch this replica's log held, even if retention deleted it since (b"":
    # none known): the parent of the next batch it writes as leader.
    last: bytes = b""

    @property
    def end(self) -> int:
        return self.batches[-1].next_offset if self.batches else self.log_start


@dataclass(slots=True)
class SimPartition:
    tp: TopicPartition
    topic_id: uuid.UUID
    replicas: dict[int, Replica]
    leader: int
    leader_epoch: int
    isr: set[int]
    high_watermark: int = 0
    # Where the current leader's epoch began in its log (the leader's epoch cache entry).
    epoch_start: int = 0

    @property
    def log(self) -> Replica:
        return self.replicas[self.leader]

    @property
    def log_start(self) -> int:
        return self.log.log_start


class History:
    """Every batch any leader wrote, by topic id and partition, with its predecessor."""

    def __init__(self) -> None:
        # (topic id, partition) -> batch bytes -> bytes of the batch before it (b"" first)
        self.parents: dict[tuple[uuid.UUID, int], dict[bytes, bytes]] = {}
        # (topic id, partition) -> the highest log start retention ever moved a leader to
        self.retained: dict[tuple[uuid.UUID, int], int] = {}

    def record(self, topic_id: uuid.UUID, partition: int, batch: SimBatch, parent: bytes) -> None:
        self.parents.setdefault((topic_id, partition), {})[batch.data] = parent

    def parent_of(self, topic_id: uuid.UUID, partition: int, data: bytes) -> bytes | None:
        return self.parents.get((topic_id, partition), {}).get(data)

    def retain(self, topic_id: uuid.UUID, partition: int, log_start: int) -> None:
        key = (topic_id, partition)
        self.retained[key] = max(self.retained.get(key, 0), log_start)

    def retained_to(self, topic_id: uuid.UUID, partition: int) -> int:
        return self.retained.get((topic_id, partition), -1)


class SimCluster:
    def __init__(
        self,
        rng: random.Random,
        *,
        brokers: int = 3,
        max_fetch_version: int = 13,
        large_records: bool = True,
    ):
        self.rng = rng
        self.large_records = large_records
        self.brokers = list(range(1, brokers + 1))
        self.online: set[int] = set(self.brokers)
        self.max_fetch_version = max_fetch_version
        self.topics: dict[str, uuid.UUID] = {}
        self.partitions: dict[TopicPartition, SimPartition] = {}
        self.history = History()
        self.sessions = {b: self._new_cache() for b in self.brokers}
        # Set: the next partition a Fetch reads is answered with this error code (any code
        # Fetch may carry, or one no Kafka defines); the leader's session model sees it
        # as sent, as it would from a real leader.
        self.answer_error: int | None = None
        self._serial = 0

    def _new_cache(self) -> FetchSessionCache:
        return FetchSessionCache(rng=random.Random(self.rng.random()), max_slots=8)

    # -- topology ------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int, replication: int) -> None:
        topic_id = uuid.UUID(int=self.rng.getrandbits(128))
        self.topics[name] = topic_id
        for p in range(partitions):
            self._add_partition(TopicPartition(name, p), topic_id, replication)

    def add_partition(self, name: str, replication: int) -> TopicPartition:
        count = sum(1 for tp in self.partitions if tp.topic == name)
        tp = TopicPartition(name, count)
        self._add_partition(tp, self.topics[name], replication)
        return tp

    def _add_partition(self, tp: TopicPartition, topic_id: uuid.UUID, replication: int) -> None:
        nodes = self.rng.sample(self.brokers, replication)
        self.partitions[tp] = SimPartition(
            tp, topic_id, {n: Replica() for n in nodes}, nodes[0], 0, set(nodes)
        )
        self._changed(tp)

    def delete_topic(self, name: str) -> None:
        del self.topics[name]
        for tp in [tp for tp in self.partitions if tp.topic == name]:
            del self.partitions[tp]
            self._changed(tp)

    def metadata(self) -> dict[TopicPartition, tuple[int, int, uuid.UUID]]:
        """Leader, leader epoch and topic id of each partition whose leader is online."""
        return {
            tp: (p.leader, p.leader_epoch, p.topic_id)
            for tp, p in self.partitions.items()
            if p.leader in self.online
        }

    # -- the leader's log ----------------------------------------------------------------

    def produce(self, tp: TopicPartition, records: int) -> None:
        p = self.partitions[tp]
        if p.leader not in self.online:
            return
        log = p.log
        self._serial += 1
        values = [b"%d-%d-%d" % (self._serial, i, self.rng.getrandbits(32)) for i in range(records)]
        if self.large_records and self.rng.random() < 0.15:
            # A large record now and then: responses of several sizes, so leaders sharing the
            # memory pool wait for buffers of different sizes (tools/sim/memory.py).
            values[0] += b"." * self.rng.randint(500, 3_000)
        data = producer_batch(log.end, values, leader_epoch=p.leader_epoch)
        batch = SimBatch(log.end, records, p.leader_epoch, data)
        self.history.record(p.topic_id, tp.partition, batch, log.last)
        log.batches.append(batch)
        log.last = data
        self._advance_high_watermark(p)
        self._changed(tp)

    def replicate(self, tp: TopicPartition, node: int, *, upto: int | None = None) -> None:
        """In-cluster follower `node` catches up with the leader (up to `upto`)."""
        p = self.partitions[tp]
        if node == p.leader or node not in self.online or p.leader not in self.online:
            return
        leader, mine = p.log, p.replicas[node]
        # Truncate to the common prefix (Kafka's follower does it by epochs; same result).
        common = 0
        while (
            common < len(mine.batches)
            and common < len(leader.batches)
            and mine.batches[common].data == leader.batches[common].data
        ):
            common += 1
        if mine.batches and leader.batches and mine.batches[0].base != leader.batches[0].base:
            # Retention moved the leader's start: start over from it.
            mine.batches, common = [], 0
        del mine.batches[common:]
        mine.log_start = leader.log_start if not mine.batches else mine.log_start
        limit = leader.end if upto is None else min(upto, leader.end)
        for batch in leader.batches[common:]:
            if batch.next_offset > limit:
                break
            mine.batches.append(batch)
        mine.last = mine.batches[-1].data if mine.batches else b""
        if mine.end >= p.high_watermark and node in self.online:
            p.isr.add(node)
        self._advance_high_watermark(p)
        self._changed(tp)

    def lag(self, tp: TopicPartition, node: int) -> None:
        """`node` falls out of the ISR (it stops replicating for a while)."""
        p = self.partitions[tp]
        if node != p.leader:
            p.isr.discard(node)

    def _advance_high_watermark(self, p: SimPartition) -> None:
        ends = [p.replicas[n].end for n in p.isr if n in self.online or n == p.leader]
        hw = min(ends) if ends else p.high_watermark
        p.high_watermark = max(p.high_watermark, min(hw, p.log.end))

    def elect(self, tp: TopicPartition, *, unclean: bool) -> bool:
        """A new leader: clean = from the ISR, unclean = any online replica (its tail may be
        shorter than the high watermark: what the old leader committed above it is lost)."""
        p = self.partitions[tp]
        pool = [
            n for n in p.replicas if n in self.online and n != p.leader and (unclean or n in p.isr)
        ]
        if unclean:
            # Unclean elections happen because the in-sync replicas are gone: prefer one
            # that is behind (its log may end below what the follower already has).
            pool = [n for n in pool if n not in p.isr] or pool
        if not pool:
            return False
        new = self.rng.choice(sorted(pool))
        if unclean and self.rng.random() < 0.5:
            # Behind by more: its log ends earlier (it lost its tail, or never had it).
            log = p.replicas[new]
            del log.batches[self.rng.randint(0, len(log.batches)) :]
            log.last = log.batches[-1].data if log.batches else b""
        p.leader = new
        p.leader_epoch += 1
        p.epoch_start = p.log.end
        p.isr = {new} | {n for n in p.isr if n != new and p.replicas[n].end <= p.log.end}
        if unclean:
            p.isr = {new}
            p.high_watermark = min(p.high_watermark, p.log.end)
        else:
            p.high_watermark = min(p.high_watermark, p.log.end)
        self._changed(tp)
        return True

    def retain(self, tp: TopicPartition, batches: int) -> None:
        """Retention deletes the first `batches` batches of every replica."""
        p = self.partitions[tp]
        log = p.log
        if len(log.batches) <= batches:
            return
        new_start = log.batches[batches].base
        self.history.retain(p.topic_id, tp.partition, new_start)
        for replica in p.replicas.values():
            old_end = replica.end
            # Whole batches below the new start go. A replica of another lineage may have a
            # batch across it: it stays, and that replica's log starts inside it, as Kafka's
            # follower takes the leader's log start. Elected, it is a leader whose log starts
            # inside a batch of another lineage than the follower's (R8 of the follower's
            # partition table: the follower halts the partition, as Kafka fails it).
            replica.batches = [b for b in replica.batches if b.next_offset > new_start]
            replica.log_start = max(replica.log_start, new_start)
            if not replica.batches:
                # It starts over where the leader's log starts (Kafka's follower truncates
                # fully to the leader's log start); below it, nothing is known.
                replica.log_start = new_start
                if old_end != new_start:
                    replica.last = b""
        p.high_watermark = max(p.high_watermark, new_start)
        self._changed(tp)

    def delete_records(self, tp: TopicPartition, offset: int) -> bool:
        """AdminClient.deleteRecords: the leader's log start moves to `offset` (at most the
        high watermark; maybe inside a batch, which stays whole and is still served). Every
        replica takes the new log start (Kafka's followers take it from the leader's
        answers), inside a batch of its own lineage too."""
        p = self.partitions[tp]
        if p.leader not in self.online or not p.log_start < offset <= p.high_watermark:
            return False
        self.history.retain(p.topic_id, tp.partition, offset)
        for replica in p.replicas.values():
            if offset <= replica.log_start:
                continue
            old_end = replica.end
            replica.batches = [b for b in replica.batches if b.next_offset > offset]
            replica.log_start = offset
            if not replica.batches and old_end != offset:
                replica.last = b""  # it starts over at the new log start (see retain)
        self._changed(tp)
        return True

    def foreign_start_above(self, tp: TopicPartition, end: int, rng: random.Random) -> bool:
        """R8's case, made on purpose (the random events reach it too rarely since the pool
        and the durability queue changed the streams): an unclean election onto an online
        replica whose log ends below `end` (the follower's log end; it lost its tail, or
        never had it), whose first batch as leader runs across `end`, and whose log start
        DeleteRecords then moves inside that batch, at or below `end`. A leader whose log
        starts inside a batch of another lineage than the follower's, a batch that holds
        the follower's log end and runs above it (R8 of the partition table)."""
        p = self.partitions[tp]
        pool = [
            n
            for n in sorted(p.replicas)
            if n in self.online and n != p.leader and p.replicas[n].log_start < end
        ]
        if not pool or p.leader not in self.online:
            return False
        new = rng.choice(pool)
        replica = p.replicas[new]
        if replica.end >= end:
            # It lost its tail (or never had it): its log ends below `end`.
            keep = [b for b in replica.batches if b.next_offset < end]
            del replica.batches[len(keep) :]
            replica.last = replica.batches[-1].data if replica.batches else b""
        p.leader = new
        p.leader_epoch += 1
        p.epoch_start = p.log.end
        p.isr = {new}
        p.high_watermark = min(p.high_watermark, p.log.end)
        first = p.log.end
        self.produce(tp, end - first + rng.randint(2, 4))
        return self.delete_records(tp, rng.randint(first + 1, end))

    def stop_broker(self, node: int) -> None:
        self.online.discard(node)
        self.sessions[node] = self._new_cache()
        for tp, p in self.partitions.items():
            p.isr.discard(node)
            if p.leader == node:
                self.elect(tp, unclean=False)
            self._changed(tp)

    def start_broker(self, node: int) -> None:
        self.online.add(node)

    def evict_sessions(self, node: int) -> None:
        self.sessions[node] = self._new_cache()

    def _changed(self, tp: TopicPartition) -> None:
        for cache in self.sessions.values():
            cache.partition_changed(tp)

    # -- answers -------------------------------------------------------------------------

    def _epoch_cache(self, p: SimPartition) -> LeaderEpochCache:
        cache = LeaderEpochCache()
        for batch in p.log.batches:
            cache.maybe_assign_from_batch(batch.epoch, batch.base)
        latest = cache.latest_epoch()
        if latest is None or latest < p.leader_epoch:
            cache.assign(p.leader_epoch, max(p.epoch_start, p.log.log_start))
        entries = cache.entries
        if entries and entries[0].start_offset < p.log.log_start:
            cache = LeaderEpochCache([EpochEntry(entries[0].epoch, p.log.log_start), *entries[1:]])
        return cache

    def end_offset_for(self, tp: TopicPartition, epoch: int) -> EpochEndOffset:
        p = self.partitions[tp]
        found = self._epoch_cache(p).end_offset_for(epoch, p.log.end)
        return EpochEndOffset(found.epoch, found.end_offset)

    def _leader_error(self, node: int, tp: TopicPartition, current_epoch: int) -> int:
        p = self.partitions.get(tp)
        if p is None:
            return ErrorCode.unknown_topic_or_partition
        if p.leader != node or node not in self.online:
            return ErrorCode.not_leader_or_follower
        if current_epoch >= 0 and current_epoch < p.leader_epoch:
            return ErrorCode.fenced_leader_epoch
        if current_epoch > p.leader_epoch:
            return ErrorCode.unknown_leader_epoch
        return ErrorCode.none

    def list_offsets(
        self, node: int, queries: Mapping[TopicPartition, int], *, latest: bool
    ) -> dict[TopicPartition, tuple[int, int]]:
        """(error code, offset) per partition; latest = the high watermark (a consumer's)."""
        answers = {}
        for tp, current_epoch in queries.items():
            error = self._leader_error(node, tp, current_epoch)
            if error:
                answers[tp] = (error, -1)
                continue
            p = self.partitions[tp]
            answers[tp] = (ErrorCode.none, p.high_watermark if latest else p.log_start)
        return answers

    def offset_for_leader_epoch(
        self, node: int, queries: Mapping[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, tuple[int, EpochEndOffset]]:
        answers = {}
        for tp, (current_epoch, epoch) in queries.items():
            error = self._leader_error(node, tp, current_epoch)
            if error:
                answers[tp] = (error, EpochEndOffset(UNDEFINED_EPOCH, -1))
                continue
            answers[tp] = (ErrorCode.none, self.end_offset_for(tp, epoch))
        return answers

    def fetch(
        self, node: int, version: int, request: FetchRequest, now_ms: int
    ) -> FetchResponseView:
        """A leader's answer to a Fetch request, through its KIP-227 session cache."""
        by_id = version >= FETCH_TOPIC_ID_VERSION
        names = {v: k for k, v in self.topics.items()}

        def resolve(topic: str | None, topic_id: uuid.UUID | None, p: int) -> TopicPartition:
            # As the request names it: by id from v13 (the name is what the wire lacks).
            if not by_id or topic_id is None:
                return TopicPartition(topic or "?", p)
            return TopicPartition(names.get(topic_id) or unresolved_topic_name(topic_id), p)

        partitions = {
            resolve(ps.topic, ps.topic_id, ps.partition): PartitionFetch(
                fetch_offset=ps.fetch_offset,
                log_start_offset=ps.log_start_offset,
                max_bytes=ps.partition_max_bytes,
                current_leader_epoch=ps.current_leader_epoch,
                last_fetched_epoch=ps.last_fetched_epoch,
                topic_id=ps.topic_id if by_id else None,
            )
            for ps in request.partitions
        }
        forgotten = [
            TopicIdPartition(
                f.topic_id if by_id else None, resolve(f.topic, f.topic_id, f.partition)
            )
            for f in request.forgotten
        ]
        cache = self.sessions[node]
        context = cache.new_context(
            SessionRequest(
                request.session_id,
                request.session_epoch,
                partitions,
                forgotten,
                uses_topic_ids=by_id,
                privileged=request.replica_id >= 0,
            ),
            now_ms=now_ms,
        )
        if context.error_code:
            return FetchResponseView(version, 0, 0, context.error_code, 0, ())
        reads = context.to_read()
        budget = request.max_bytes
        first = True
        answered: dict[TopicPartition, FetchedPartition] = {}
        results: dict[TopicPartition, PartitionResult] = {}
        for read in reads:
            fp, result = self._read(node, version, read.partition, read.fetch, budget, first)
            records = len(fp.records or b"")
            budget -= records
            first = first and records == 0
            answered[read.partition] = fp
            results[read.partition] = result
        session = context.build_response(results, now_ms=now_ms)
        topics: list[FetchedTopic] = []
        for tp in session.partitions:
            name = tp.topic
            topic_id = self.topics.get(name)
            if by_id and topic_id is None:
                topic_id = uuid.UUID(name[1:]) if name.startswith("?") else None
            key_name, key_id = (None, topic_id) if by_id else (name, None)
            if topics and (topics[-1].topic, topics[-1].topic_id) == (key_name, key_id):
                last = topics.pop()
                topics.append(FetchedTopic(key_name, key_id, (*last.partitions, answered[tp])))
            else:
                topics.append(FetchedTopic(key_name, key_id, (answered[tp],)))
        return FetchResponseView(
            version, 0, 0, session.error_code, session.session_id, tuple(topics)
        )

    def _read(
        self,
        node: int,
        version: int,
        tp: TopicPartition,
        fetch: PartitionFetch,
        budget: int,
        first: bool,
    ) -> tuple[FetchedPartition, PartitionResult]:
        def answer(
            error: int,
            records: bytes = b"",
            diverging: EpochEndOffset = NO_DIVERGING_EPOCH,
            more: bool = False,
        ) -> tuple[FetchedPartition, PartitionResult]:
            p = self.partitions.get(tp)
            hw = p.high_watermark if p is not None and not error else -1
            start = p.log_start if p is not None and not error else -1
            fp = FetchedPartition(
                tp.partition, error, hw, hw, start, diverging, -1, -1, memoryview(records)
            )
            result = PartitionResult(
                hw,
                start,
                records_size=len(records),
                error_code=error,
                diverging_epoch=diverging is not NO_DIVERGING_EPOCH,
                more_data=more,
            )
            return fp, result

        if self.answer_error is not None:
            # The leader answers this partition with an error it chose (see answer_error).
            error, self.answer_error = self.answer_error, None
            return answer(error)
        p = self.partitions.get(tp)
        if p is None:
            return answer(
                ErrorCode.unknown_topic_id
                if version >= FETCH_TOPIC_ID_VERSION
                else ErrorCode.unknown_topic_or_partition
            )
        if (
            version >= FETCH_TOPIC_ID_VERSION
            and fetch.topic_id is not None
            and fetch.topic_id != self.topics.get(tp.topic)
        ):
            # A session's partition cached under its name before the topic was re-created:
            # Kafka reads the partition the cached id names and answers INCONSISTENT_TOPIC_ID
            # when the log's id differs -- never the new topic's data for the old id (seed
            # 78948: the new topic's records came back, past the follower's budget).
            return answer(ErrorCode.inconsistent_topic_id)
        # Below v9 the request carries no current leader epoch: nothing to fence with.
        current_epoch = NO_EPOCH
        if version >= FETCH_CURRENT_LEADER_EPOCH_VERSION:
            current_epoch = fetch.current_leader_epoch
        error = self._leader_error(node, tp, current_epoch)
        if error:
            return answer(error)
        if version >= FETCH_LAST_FETCHED_EPOCH_VERSION and fetch.last_fetched_epoch >= 0:
            end = self.end_offset_for(tp, fetch.last_fetched_epoch)
            if end.epoch == UNDEFINED_EPOCH or end.end_offset < 0:
                return answer(ErrorCode.offset_out_of_range)
            if end.epoch < fetch.last_fetched_epoch or end.end_offset < fetch.fetch_offset:
                return answer(ErrorCode.none, diverging=end)
        if not p.log_start <= fetch.fetch_offset <= p.log.end:
            return answer(ErrorCode.offset_out_of_range)
        limit = min(fetch.max_bytes, budget)
        out = bytearray()
        more = False
        for batch in p.log.batches:
            if batch.next_offset <= fetch.fetch_offset:
                continue
            if batch.next_offset > p.high_watermark:
                break  # a consumer reads up to the high watermark
            if len(out) + len(batch.data) > limit and not (first and not out):
                # KIP-74: cut at the byte limit (a partial batch, dropped by the follower).
                out += batch.data[: max(0, limit - len(out))]
                more = True
                break
            out += batch.data
        return answer(ErrorCode.none, bytes(out), more=more)
