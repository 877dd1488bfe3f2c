"""Fixtures for the leader's tests: a data directory filled with real producer batches
through the log store, and the server running on a thread of its own for blocking clients.

- `logs`: an open LogManager on a fresh data directory, closed after the test.
- `fill(logs, tp, batches, hw=None, topic_id=None)`: append batches (bytes each) to a
  partition and checkpoint its high watermark (default: the log end); returns the log.
- `transactional_batch`, `control_batch`: a transaction's data and its COMMIT/ABORT marker.
- `serve_in_thread(logs, settings, ...)`: a LeaderServer on an event loop thread of its own
  (ServedInThread), for clients that block (kafka-python, confluent-kafka, kcat); closed
  after the test.
- `served_numbered(work, topic, partitions, per_partition, flags)`: a `replicad serve`
  process over a replica whose records are numbered "<partition>-<offset>" (Served), for
  group tests with real clients.
"""

from __future__ import annotations

import asyncio
import random
import struct
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from replicad.clock import wall_ms
from replicad.groups.coordinator import CoordinatorConfig
from replicad.leader.remote_fetch import RemoteFetch
from replicad.leader.security import ServerSecurity
from replicad.leader.server import LeaderServer
from replicad.leader.settings import ServeSettings
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.log.partition import PartitionLog
from replicad.records.batch import CONTROL_FLAG_MASK, scan_batches
from replicad.records.records import ControlType
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch
from tools.peers.process import free_port
from tools.replica import ReplicadProcess, replicad_serve


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[LogManager]:
    manager = LogManager.open(tmp_path / "data", LogConfig(), now_ms=wall_ms())
    try:
        yield manager
    finally:
        manager.close()


def fill_partition(
    logs: LogManager,
    tp: TopicPartition,
    batches: Sequence[bytes],
    *,
    hw: int | None = None,
    topic_id: uuid.UUID | None = None,
) -> PartitionLog:
    plog = logs.get_or_create(tp, topic_id=topic_id)
    if batches:
        data = b"".join(batches)
        scan = scan_batches(data)
        assert scan.valid_bytes == len(data)
        plog.append(data, scan.batches, now_ms=wall_ms())
    logs.checkpoint({tp: plog.log_end_offset if hw is None else hw})
    return plog


@pytest.fixture
def fill() -> Callable[..., PartitionLog]:
    return fill_partition


@dataclass
class Served:
    serve: ReplicadProcess
    bootstrap: str
    work: Path
    partitions: frozenset[int]
    per_partition: int

    @property
    def records(self) -> set[tuple[int, int]]:
        """Every (partition, offset) served: a test that read these read everything."""
        return {(p, o) for p in self.partitions for o in range(self.per_partition)}

    @property
    def ends(self) -> dict[int, int]:
        """Each partition's log end offset: what a group that read everything commits."""
        return dict.fromkeys(self.partitions, self.per_partition)


@contextmanager
def served_numbered(
    work: Path, topic: str, partitions: int, per_partition: int, flags: Sequence[str] = ()
) -> Iterator[Served]:
    """`replicad serve` (with `flags`) over `topic`, each partition's record at offset i
    being "<partition>-<i>", one batch a record: what a test reads can be checked whole."""
    data_dir = work / "data"
    logs = LogManager.open(data_dir, LogConfig(), now_ms=wall_ms())
    try:
        for p in range(partitions):
            batches = [producer_batch(i, [f"{p}-{i}".encode()]) for i in range(per_partition)]
            fill_partition(logs, TopicPartition(topic, p), batches)
    finally:
        logs.close()
    port = free_port()
    with replicad_serve(data_dir, port, log_path=work / "serve.log", flags=tuple(flags)) as serve:
        yield Served(serve, f"127.0.0.1:{port}", work, frozenset(range(partitions)), per_partition)


# Groups start their first rebalance at the first join, as on the harness's Kafka brokers
# (group.initial.rebalance.delay.ms 0, as in Kafka's own tests).
NO_GROUP_DELAY = CoordinatorConfig(initial_rebalance_delay_ms=0)


class ServedInThread:
    """A LeaderServer on an event loop of its own thread."""

    def __init__(
        self,
        logs: LogManager,
        settings: ServeSettings | None = None,
        *,
        allowed_followers: frozenset[int] = frozenset(),
        security: ServerSecurity | None = None,
        seed: int = 1,
        read_only_groups: Callable[[str], bool] | None = None,
        group_config: CoordinatorConfig = NO_GROUP_DELAY,
        remote: RemoteFetch | None = None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = LeaderServer(
            logs,
            settings or ServeSettings(),
            allowed_followers=allowed_followers,
            security=security,
            rng=random.Random(seed),
            read_only_groups=read_only_groups,
            group_config=group_config,
            remote=remote,
        )
        self.run(self.server.start())

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def run(self, coro: Any, timeout_s: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        done: Future[Any] = Future()

        def invoke() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as exc:
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(invoke)
        return done.result(30)

    def metrics(self) -> dict[str, Any]:
        return self.call(self.server.metrics)

    def close(self) -> None:
        self.run(self.server.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


# -- transactional batches, as a transactional producer and a coordinator write them ----------

_ATTRIBUTES_LOW_BYTE = 22
_CRC_POSITION = 17
_CRC_START = 21


def _transactional_builder(producer_id: int, *, base_sequence: int) -> DefaultRecordBatchBuilder:
    # Epoch 0 of `producer_id`, uncompressed; markers carry no sequence (-1).
    return DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )


def transactional_batch(
    base_offset: int, values: Sequence[bytes], *, producer_id: int, leader_epoch: int = 0
) -> bytes:
    """A transactional data batch of `producer_id` (kafka-python's builder, broker offsets)."""
    builder = _transactional_builder(producer_id, base_sequence=0)
    for i, value in enumerate(values):
        builder.append(i, 1_700_000_000_000 + i, None, value, [])
    return _placed(bytearray(builder.build()), base_offset, leader_epoch)


def control_batch(
    offset: int, *, producer_id: int, control_type: ControlType, leader_epoch: int = 0
) -> bytes:
    """The COMMIT/ABORT marker a transaction coordinator writes for `producer_id`."""
    builder = _transactional_builder(producer_id, base_sequence=-1)
    builder.append(
        0, 1_700_000_000_000, struct.pack(">hh", 0, control_type), struct.pack(">hi", 0, 0), []
    )
    data = bytearray(builder.build())
    data[_ATTRIBUTES_LOW_BYTE] |= CONTROL_FLAG_MASK
    return _placed(data, offset, leader_epoch)


def _placed(data: bytearray, base_offset: int, leader_epoch: int) -> bytes:
    struct.pack_into(">q", data, 0, base_offset)
    struct.pack_into(">i", data, 12, leader_epoch)
    struct.pack_into(">I", data, _CRC_POSITION, crc32c(bytes(data[_CRC_START:])))
    return bytes(data)


class TxnBatches:
    data = staticmethod(transactional_batch)
    marker = staticmethod(control_batch)


@pytest.fixture
def txn() -> type[TxnBatches]:
    """`txn.data(base, values, producer_id=...)`, `txn.marker(offset, producer_id=..., ...)`."""
    return TxnBatches


@pytest.fixture
def serve_in_thread() -> Iterator[Callable[..., ServedInThread]]:
    """`serve_in_thread(logs, settings=None, allowed_followers=..., security=...)`, closed
    after the test."""
    started: list[ServedInThread] = []

    def start(
        logs: LogManager, settings: ServeSettings | None = None, **kwargs: Any
    ) -> ServedInThread:
        served = ServedInThread(logs, settings, **kwargs)
        started.append(served)
        return served

    try:
        yield start
    finally:
        for served in started:
            served.close()
