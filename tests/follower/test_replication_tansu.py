"""`replicad run` against Tansu, a Rust Kafka-compatible broker that answers
every Fetch without a session: the sessionless path, end to end.

The replica must hold the same batch bytes a raw Fetch gets from Tansu, and the
same records, offsets, keys, values and headers as a real consumer
(confluent-kafka / librdkafka) reads.
"""

from __future__ import annotations

from pathlib import Path

from replicad.records.batch import scan_batches
from replicad.records.records import decode_batch
from replicad.types import TopicPartition
from tools.peers.produce import ConsumedRecord, consume_all, produce_mixed, produce_numbered
from tools.peers.wire import fetch_once
from tools.replica import replicad_run, segment_bytes

PARTITIONS = 3


def tansu_batches(bootstrap: str, topic: str, partition: int, end: int) -> bytes:
    """Every batch Tansu serves for a partition, by repeated raw Fetch."""
    out = bytearray()
    offset = 0
    while offset < end:
        answer = fetch_once(bootstrap, topic, partition, offset, max_bytes=4 << 20)
        assert answer.partition_error_code == 0
        scan = scan_batches(memoryview(answer.records))
        assert scan.batches, f"no whole batch at offset {offset}"
        out += answer.records[: scan.valid_bytes]
        offset = scan.batches[-1].next_offset
    return bytes(out)


def replica_records(partition_dir: Path) -> list[ConsumedRecord]:
    data = segment_bytes(partition_dir)
    records = []
    for header in scan_batches(memoryview(data)).batches:
        if header.is_control:
            continue
        for r in decode_batch(data, header).records:
            records.append(
                ConsumedRecord(
                    offset=r.offset,
                    key=r.key,
                    value=r.value,
                    headers=tuple((h.key, h.value) for h in r.headers),
                    timestamp=r.timestamp,
                )
            )
    return records


def test_replica_matches_what_tansu_serves_and_a_consumer_reads(
    tansu_broker, unique_topic, tmp_path
):
    topic = unique_topic()
    tansu_broker.create_topic(topic, PARTITIONS)
    produce_mixed(tansu_broker.bootstrap, topic, partitions=PARTITIONS, records=6_000, seed=11)
    # Trust Fetch's high watermark: Tansu's ListOffsets "latest" under-reports.
    ends = {
        p: fetch_once(tansu_broker.bootstrap, topic, p, 0).high_watermark for p in range(PARTITIONS)
    }
    assert all(end > 0 for end in ends.values())

    data_dir = tmp_path / "data"
    with replicad_run(tansu_broker.bootstrap, topic, data_dir) as proc:
        proc.wait_caught_up({TopicPartition(topic, p): end for p, end in ends.items()})
    out = proc.output()
    assert "Traceback" not in out
    # Sessionless every time, and quietly: no session-reset storm in the log.
    assert out.count("fetch session reset") == 0, out[-2000:]

    consumed = consume_all(
        tansu_broker.bootstrap, topic, partitions=PARTITIONS, isolation="read_uncommitted"
    )
    for p in range(PARTITIONS):
        pdir = data_dir / f"{topic}-{p}"
        assert segment_bytes(pdir) == tansu_batches(tansu_broker.bootstrap, topic, p, ends[p])
        assert replica_records(pdir) == consumed[p]


MANY = 300
SHARE = 40


def test_many_partitions_are_fetched_from_tansu_in_turns_of_a_share_each(
    tansu_broker, unique_topic, tmp_path
):
    """fetch.sessionless_max_partitions: Tansu keeps no session, so after its first answer
    each request names at most a share of the partitions, in passes that ask each once,
    those known to be behind first (Tansu 0.6 answered a Fetch of 1,000 partitions with no
    records at all); every partition is replicated, byte for byte, records produced while
    it runs too, and status says the leader is fetched in shares (the stall rule waits for a
    partition's turn in a pass, control/stalls.py) and names no stall."""
    from replicad.control.client import query

    topic = unique_topic()
    tansu_broker.create_topic(topic, MANY)
    produce_numbered(tansu_broker.bootstrap, topic, MANY, 2)
    data_dir, sock = tmp_path / "data", tmp_path / "replicad.sock"
    with replicad_run(
        tansu_broker.bootstrap,
        topic,
        data_dir,
        config={"fetch": {"sessionless_max_partitions": SHARE}},
        control_socket=sock,
    ) as proc:
        proc.wait_caught_up({TopicPartition(topic, p): 2 for p in range(MANY)}, timeout_s=600)
        produce_numbered(tansu_broker.bootstrap, topic, MANY, 2, b"w")  # while it runs
        proc.wait_caught_up({TopicPartition(topic, p): 4 for p in range(MANY)}, timeout_s=600)
        # A whole pass at least (the first request named every partition).
        proc.wait_for(lambda: query(sock)["leaders"][0]["share_passes"] >= 2, what="a pass")
        status = query(sock)
    (leader,) = status["leaders"]
    assert not leader["sessionful"] and leader["in_shares"], leader
    assert leader["last_request_partitions"] <= SHARE, leader
    assert leader["sessionless_shares"] >= MANY // SHARE, leader
    assert status["stalls"]["stalls_total"] == 0, status["stalls"]
    for p in (0, MANY // 2, MANY - 1):
        assert segment_bytes(data_dir / f"{topic}-{p}") == tansu_batches(
            tansu_broker.bootstrap, topic, p, 4
        )
