"""A compacted topic with Kafka's log cleaner running while replicad follows it (issue 21).

The cleaner rewrites the leader's segments and drops every record but the last of each key,
so the replica (which copied some batches before they were cleaned, and some after) cannot
equal the leader byte for byte. What it must hold: every record the leader still holds, at
the same offset, with the same key, value and timestamp; offsets only ever rising; nothing
at an offset the leader never had. Real peer: Apache Kafka's own cleaner.
"""

from __future__ import annotations

import time
from pathlib import Path

from replicad.records.batch import scan_batches
from replicad.records.records import Record, decode_batch
from tools.peers.produce import CheckedProducer
from tools.replica import replicad_run, topic_ends
from tools.wait import wait_until

KEYS = 20
SEGMENT_BYTES = 16 * 1024
COMPACTED = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "segment.ms": "500",
}
# Kafka's cleaner looks for dirty logs every log.cleaner.backoff.ms (15 s by default); a
# cleaner that has not run by then on a loaded machine is not running.
CLEANED_WITHIN_S = 240


def produce_keyed(bootstrap: str, topic: str, start: int, count: int) -> None:
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for i in range(start, start + count):
        key = b"key-%d" % (i % KEYS)
        producer.produce(topic, key=key, value=b"%s=%d" % (key, i), partition=0)
        if i % 500 == 0:
            producer.flush(30)
            # timing-ok: pacing the producer, so segment.ms (500) rolls segments between
            # chunks too and the cleaner has closed ones to clean
            time.sleep(0.05)
    assert producer.flush(30) == 0


def records_in(partition_dir: Path) -> dict[int, Record]:
    """Every data record of the partition's segments, by offset (offsets must rise)."""
    found: dict[int, Record] = {}
    last = -1
    for segment in sorted(partition_dir.glob("*.log"), key=lambda p: int(p.stem)):
        data = segment.read_bytes()
        for header in scan_batches(data).batches:
            for record in decode_batch(data, header).records:
                assert record.offset > last, f"{segment}: offset {record.offset} after {last}"
                last = record.offset
                found[record.offset] = record
    return found


def test_the_replica_holds_every_record_the_cleaner_keeps(kafka_broker, unique_topic, tmp_path):
    topic = unique_topic()
    kafka_broker.create_topic(topic, 1, COMPACTED, segment_bytes=SEGMENT_BYTES)
    produce_keyed(kafka_broker.bootstrap, topic, 0, 3_000)
    leader_dir = kafka_broker.partition_dir(topic, 0)

    def cleaned() -> bool:
        return len(records_in(leader_dir)) < 3_000

    wait_until(cleaned, timeout_s=CLEANED_WITHIN_S, interval_s=1, what="Kafka's cleaner to run")
    kept = len(records_in(leader_dir))
    data_dir = tmp_path / "data"
    with replicad_run(kafka_broker.bootstrap, topic, data_dir) as proc:
        # replicad starts on a log the cleaner has thinned, and follows it while the
        # cleaner goes on with what is produced next.
        produce_keyed(kafka_broker.bootstrap, topic, 3_000, 3_000)
        wait_until(
            lambda: len(records_in(leader_dir)) < kept + 3_000,
            timeout_s=CLEANED_WITHIN_S,
            interval_s=1,
            what="Kafka's cleaner to run again",
        )
        proc.wait_for(
            lambda: topic_ends(data_dir, topic).get(0, 0) >= 6_000,
            what="the replica to reach the leader's end",
        )
    leader = records_in(leader_dir)
    replica = records_in(data_dir / f"{topic}-0")
    missing = sorted(set(leader) - set(replica))
    assert not missing, f"{len(missing)} records the leader keeps are not in the replica"
    for offset, record in leader.items():
        ours = replica[offset]
        assert (ours.key, ours.value, ours.timestamp) == (
            record.key,
            record.value,
            record.timestamp,
        ), offset
    # Nothing the leader never had: every value is the one produced at that offset's key.
    for record in replica.values():
        assert record.value is not None and record.key is not None
        assert record.value.startswith(record.key + b"=")
    # The cleaner did its work before replicad started and while it followed.
    assert len(leader) < kept + 3_000
