"""`replicad run` with `archive:` and `serve:` on a real Kafka broker and a real S3 server
(versitygw) behind the fault proxy: the bucket down for a while does not stop replication,
status shows the failing uploads, they catch up once it is back, local retention then
deletes what the bucket has, and a consumer through run's own `serve` reads from offset 0."""

from __future__ import annotations

import os
from typing import Any

from kafka import KafkaConsumer
from kafka import TopicPartition as KTP

from tools.peers import s3
from tools.peers.process import free_port
from tools.peers.produce import produce_numbered
from tools.peers.s3 import ACCESS_KEY, REGION, SECRET_KEY
from tools.peers.s3_proxy import S3FaultProxy
from tools.replica import replicad_run
from tools.wait import wait_until

FIRST, SECOND = 1_500, 1_500


def test_the_bucket_down_for_a_while_replication_goes_on_and_uploads_catch_up(
    kafka_broker: Any, s3_server: Any, s3_bucket: str, unique_topic: str, tmp_path: Any
) -> None:
    topic = unique_topic
    kafka_broker.create_topic(topic, 1)
    port = free_port()
    config = {
        "checkpoint_interval_ms": 200,
        "log": {"segment_bytes": 16 * 1024, "retention_ms": 1, "segment_ms": 500},
        "serve": {"listen": f"127.0.0.1:{port}"},
        "archive": {
            "bucket": s3_bucket,
            "prefix": "down",
            "region": REGION,
            "access_key_id": ACCESS_KEY,
            "secret_access_key_env": "ARCHIVE_TEST_SECRET",
            "interval_ms": 100,
            "retry_backoff_ms": 100,
            "retry_backoff_max_ms": 500,
            "request_timeout_ms": 5_000,
        },
    }
    env = {**os.environ, "ARCHIVE_TEST_SECRET": SECRET_KEY}
    store = s3_server.client()

    def archived_end() -> int:
        return s3.archived_end(store, s3_bucket, "down", topic, 0)

    with S3FaultProxy(s3_server.endpoint) as proxy:
        config["archive"]["endpoint"] = proxy.endpoint
        proxy.set_down(True)
        produce_numbered(kafka_broker.bootstrap, topic, 1, FIRST, tag=b"a")
        with replicad_run(
            kafka_broker.bootstrap,
            topic,
            tmp_path / "data",
            config=config,
            control_socket=tmp_path / "control.sock",
            env=env,
        ) as proc:

            def snap() -> dict[str, Any]:
                return proc.status() or {}

            def log_end() -> int:
                parts = snap().get("partitions") or [{}]
                return int(parts[0].get("log_end_offset") or 0)

            # Status shows the failing uploads, in its JSON and in its health.
            seen: list[dict[str, Any]] = []
            proc.wait_for(
                lambda: bool(
                    (s := snap()).get("archive", {}).get("retrying_partitions")
                    and seen.append(s) is None
                ),
                what="the archive's failures in status",
            )
            down = seen[-1]
            assert down["archive"]["failures"] > 0 and "SlowDown" in down["archive"]["last_error"]
            assert "archive_retrying" in {r["code"] for r in down["health"]["reasons"]}
            # Replication goes on while the bucket is down, and nothing is deleted locally.
            produce_numbered(kafka_broker.bootstrap, topic, 1, SECOND, tag=b"b")
            proc.wait_for(lambda: log_end() == FIRST + SECOND, what="every record replicated")
            still = snap()
            assert still["archive"]["retrying_partitions"] and archived_end() == 0
            assert still["partitions"][0]["log_start_offset"] == 0
            failed_while_down = proxy.stats.failed
            assert failed_while_down > 0

            proxy.set_down(False)
            proc.wait_for(lambda: archived_end() == FIRST + SECOND, what="the uploads caught up")
            proc.wait_for(
                lambda: (
                    not snap()["archive"]["retrying_partitions"]
                    and snap()["partitions"][0]["log_start_offset"] > 0
                ),
                what="status clear and local retention after the upload",
            )
            assert snap()["archive"]["pending_segments"] == 0
            # run's own serve answers what is now only in the bucket.
            consumer = KafkaConsumer(
                bootstrap_servers=f"127.0.0.1:{port}",
                group_id=None,
                enable_auto_commit=False,
                fetch_max_wait_ms=100,
            )
            got: list[tuple[int, bytes]] = []
            try:
                tp = KTP(topic, 0)
                consumer.assign([tp])
                consumer.seek_to_beginning(tp)
                wait_until(
                    lambda: (
                        got.extend(
                            (r.offset, r.value) for rs in consumer.poll(200).values() for r in rs
                        )
                        or len(got) >= FIRST + SECOND
                    ),
                    what="every record through serve",
                )
            finally:
                consumer.close()
    want = [(i, b"a%d" % i) for i in range(FIRST)]
    want += [(FIRST + i, b"b%d" % i) for i in range(SECOND)]
    assert got == want
