"""Session-cache pressure on a real Kafka broker: a privileged client that keeps evicting
other clients' fetch sessions, and plain consumers that compete for the slots.

What Kafka does (4.x, read in its FetchSession.java and BrokerServer.scala):
- `max.incremental.fetch.session.cache.slots` is split over 8 shards; a new session
  goes to the next shard round-robin, and eviction looks only inside that shard. So
  8 slots mean one session per shard, and anything below 8 means no sessions at all.
- A session created by a follower fetch (replica id >= 0) is privileged: it evicts any
  consumer session, however new; consumer sessions only evict one another after 120 s
  unused, or when the newcomer has more partitions and the old one is past 120 s.

`SessionEvictor` exploits the first two: it sends full fetches as replica `replica_id`
(session 0, epoch 0) for every partition of its topics, so each one lands in the next
shard and evicts whatever consumer session lives there; it then closes its own session
(epoch -1) so the slot is free for the victim to come back. The broker answers its
partitions with NOT_LEADER_OR_FOLLOWER (it is no replica), which does not matter: the
session is created before any partition is read.
"""

from __future__ import annotations

import datetime
import socket
import threading
from collections.abc import Mapping

from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.response_header.v1.header import ResponseHeader
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_reader
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from replicad.protocol.apis import ApiKey
from replicad.session.metadata import INITIAL_EPOCH
from replicad.wire import FINAL_EPOCH, INVALID_SESSION_ID
from tools.peers.wire import read_frame, request_frame

FETCH_VERSION = 12
NEW_SESSION = (INVALID_SESSION_ID, INITIAL_EPOCH)  # full fetch, create a session
# The shard count Kafka's broker splits its session cache into.
KAFKA_SESSION_CACHE_SHARDS = 8


class SessionEvictor:
    """A thread that, every `interval_s`, makes `burst` privileged sessions and closes each."""

    def __init__(
        self,
        bootstrap: str,
        topics: Mapping[str, int],
        *,
        replica_id: int = 1000,
        interval_s: float = 2.0,
        burst: int = KAFKA_SESSION_CACHE_SHARDS,
    ) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.address = (host, int(port))
        self.topics = dict(topics)
        self.replica_id = replica_id
        self.interval_s = interval_s
        self.burst = burst
        self.sessions_created = 0
        self.sessionless_answers = 0
        self.failures = 0
        self._correlation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> SessionEvictor:
        self._thread = threading.Thread(target=self._run, name="session-evictor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with socket.create_connection(self.address, timeout=10) as sock:
                    while not self._stop.is_set():
                        for _ in range(self.burst):
                            self.evict_once(sock)
                        self._stop.wait(self.interval_s)
            except OSError:
                self.failures += 1
                self._stop.wait(self.interval_s)

    def evict_once(self, sock: socket.socket) -> int:
        """One privileged session made and closed; returns its id (0: none was made)."""
        session_id = self._fetch(sock, *NEW_SESSION, with_partitions=True)
        if session_id == 0:
            self.sessionless_answers += 1
            return 0
        self.sessions_created += 1
        self._fetch(sock, session_id, FINAL_EPOCH, with_partitions=False)
        return session_id

    def _fetch(
        self, sock: socket.socket, session_id: int, epoch: int, *, with_partitions: bool
    ) -> int:
        topics = (
            tuple(
                FetchTopic(
                    topic=TopicName(name),
                    partitions=tuple(
                        FetchPartition(
                            partition=i32(p), fetch_offset=i64(0), partition_max_bytes=i32(1)
                        )
                        for p in range(count)
                    ),
                )
                for name, count in self.topics.items()
            )
            if with_partitions
            else ()
        )
        request = FetchRequest(
            replica_id=BrokerId(self.replica_id),
            max_wait=i32Timedelta.parse(datetime.timedelta(0)),
            min_bytes=i32(0),
            max_bytes=i32(1024),
            isolation_level=i8(0),
            session_id=i32(session_id),
            session_epoch=i32(epoch),
            topics=topics,
            forgotten_topics_data=(),
            rack_id="",
        )
        self._correlation += 1
        header = RequestHeader(
            request_api_key=i16(ApiKey.FETCH),
            request_api_version=i16(FETCH_VERSION),
            correlation_id=i32(self._correlation),
            client_id="chaos-evictor",
        )
        sock.sendall(request_frame(header, request))
        body = read_frame(sock)
        _, used = entity_reader(ResponseHeader)(body, 0)
        response, _ = entity_reader(FetchResponse)(body, used)
        return int(response.session_id)


class CompetingConsumers:
    """`count` kafka-python consumers (each with its own fetch session, KIP-227) reading
    every partition of `topics` from the start, over and over, in threads."""

    def __init__(self, bootstrap: str, topics: Mapping[str, int], count: int) -> None:
        self.bootstrap = bootstrap
        self.topics = dict(topics)
        self.count = count
        self.records = 0
        self.failures = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> CompetingConsumers:
        for i in range(self.count):
            thread = threading.Thread(target=self._run, args=(i,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self, index: int) -> None:
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KafkaTopicPartition

        while not self._stop.is_set():
            consumer = None
            try:
                consumer = KafkaConsumer(
                    bootstrap_servers=self.bootstrap,
                    client_id=f"chaos-consumer-{index}",
                    enable_auto_commit=False,
                    fetch_max_wait_ms=100,
                    max_partition_fetch_bytes=16 * 1024,
                )
                partitions = [
                    KafkaTopicPartition(name, p)
                    for name, count in self.topics.items()
                    for p in range(count)
                ]
                consumer.assign(partitions)
                consumer.seek_to_beginning()
                while not self._stop.is_set():
                    polled = consumer.poll(timeout_ms=200)
                    with self._lock:
                        self.records += sum(len(batch) for batch in polled.values())
            except Exception:  # a consumer that fails is restarted; counted, not fatal
                with self._lock:
                    self.failures += 1
                self._stop.wait(1.0)
            finally:
                if consumer is not None:
                    consumer.close()
