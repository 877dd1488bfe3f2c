"""Topic administration on any Kafka-protocol peer, through confluent-kafka.

A topic is ready when every partition answers ListOffsets, not when metadata
names a leader: Kafka publishes the leader in metadata a moment before the
broker has opened the partition's log, and a produce or ListOffsets in that
moment fails with NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, IsolationLevel
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from tools.peers.process import PeerError, wait_until
from tools.wait import DEADLINE_S

# librdkafka reports every refused connection; send that to logging, not stderr.
librdkafka_log = logging.getLogger("tools.peers.librdkafka")

# What librdkafka retries by itself and what a healthy new broker always says: the first
# idempotent or transactional producer meets the transaction coordinator still loading
# (GETPID "Coordinator load in progress: retrying"). Shown, it reads like an error on a
# healthy `make demo`; anything else librdkafka says still reaches the log.
TRANSIENT_LIBRDKAFKA = ("Coordinator load in progress",)


class _TransientFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(transient in text for transient in TRANSIENT_LIBRDKAFKA)


librdkafka_log.addFilter(_TransientFilter())
PROBE_TIMEOUT_S = 5.0
# One ListOffsets round for thousands of partitions on a loaded cluster: a hang's deadline.
LIST_OFFSETS_TIMEOUT_S = 60.0


def admin_client(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "logger": librdkafka_log})


def latest_offsets(
    admin: AdminClient,
    topic: str,
    partitions: Iterable[int],
    *,
    isolation: IsolationLevel = IsolationLevel.READ_COMMITTED,
    timeout_s: float = LIST_OFFSETS_TIMEOUT_S,
) -> dict[int, int]:
    """{partition: ListOffsets "latest"} for `partitions` of `topic` in one round (librdkafka
    sends one request per leader, not one per partition). read_committed by default, as a
    consumer's watermark query asks (the last stable offset). Raises KafkaException when a
    partition fails (no leader for the moment, a timeout)."""
    futures = admin.list_offsets(
        {KafkaTopicPartition(topic, p): OffsetSpec.latest() for p in partitions},
        isolation_level=isolation,
        request_timeout=timeout_s,
    )
    return {where.partition: future.result().offset for where, future in futures.items()}


def probe_consumer(bootstrap: str) -> Consumer:
    """A consumer for ListOffsets and metadata only: it joins no group and commits nothing."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"peer-probe-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "logger": librdkafka_log,
        }
    )


def create_topic_and_wait(
    bootstrap: str,
    name: str,
    partitions: int,
    config: Mapping[str, str] | None = None,
    *,
    timeout_s: float = DEADLINE_S,
) -> None:
    """CreateTopics (replication factor 1), then wait until every partition is served."""
    admin = admin_client(bootstrap)
    new_topic = NewTopic(
        name, num_partitions=partitions, replication_factor=1, config=dict(config or {})
    )
    create_one_topic(admin, bootstrap, new_topic, timeout_s)

    def leaders_known() -> bool | None:
        topic = admin.list_topics(topic=name, timeout=PROBE_TIMEOUT_S).topics.get(name)
        if topic is None or topic.error is not None or len(topic.partitions) != partitions:
            return None
        return all(p.leader >= 0 and p.error is None for p in topic.partitions.values()) or None

    wait_until(leaders_known, timeout_s=timeout_s, what=f"leaders for topic {name!r}")
    consumer = probe_consumer(bootstrap)
    try:
        for partition in range(partitions):
            where = KafkaTopicPartition(name, partition)
            wait_until(
                lambda where=where: consumer.get_watermark_offsets(where, PROBE_TIMEOUT_S),
                timeout_s=timeout_s,
                what=f"ListOffsets for {name}-{partition}",
            )
    finally:
        consumer.close()


def create_one_topic(
    admin: AdminClient, bootstrap: str, new_topic: NewTopic, timeout_s: float
) -> None:
    """CreateTopics of `new_topic` alone, waited for; a refusal is a PeerError naming the
    topic and the cluster (one topic a request: a controller's cap applies to a request)."""
    name = new_topic.topic
    future = admin.create_topics([new_topic], operation_timeout=timeout_s)[name]
    try:
        future.result(timeout=timeout_s)
    except Exception as exc:
        raise PeerError(f"creating topic {name!r} on {bootstrap}: {exc}") from exc
