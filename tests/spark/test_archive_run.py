"""`replicad run` with `archive:` on a real Kafka broker and a real S3 server (versitygw):
what it uploads while it replicates is read whole by Spark from the bucket URL alone."""

from __future__ import annotations

import os
import shutil

from replicad.cli import main
from replicad.spark.files import Purpose, read_trace
from tools.peers import s3
from tools.peers.produce import produce_numbered
from tools.peers.s3 import ACCESS_KEY, REGION, SECRET_KEY
from tools.replica import replicad_run


def test_a_replica_uploaded_while_replicad_runs_is_read_whole_from_the_bucket(
    spark, kafka_broker, s3_server, s3_bucket, unique_topic, tmp_path, monkeypatch, capsys
):
    """`replicad run` with `archive:` and a local retention of 1 ms: the bucket gets every
    record (the quiet tail too, rolled after segment_ms), the disk keeps none of the closed
    segments, and Spark, given only the bucket URL, reads every record the source has at its
    offsets, with the replica's directory gone, opening nothing but the bucket's objects;
    `replicad verify` of the bucket is clean. The secret comes from an environment
    variable and is never logged."""
    topic, per_partition = unique_topic, 3_000
    kafka_broker.create_topic(topic, 2)
    produce_numbered(kafka_broker.bootstrap, topic, 2, per_partition, tag=b"r")
    data_dir, control = tmp_path / "data", tmp_path / "control.sock"
    config = {
        "checkpoint_interval_ms": 200,
        # Local retention of 1 ms: every closed segment goes as soon as the bucket has it.
        "log": {"segment_bytes": 16 * 1024, "retention_ms": 1, "segment_ms": 500},
        "archive": {
            "bucket": s3_bucket,
            "prefix": "run",
            "endpoint": s3_server.endpoint,
            "region": REGION,
            "access_key_id": ACCESS_KEY,
            "secret_access_key_env": "ARCHIVE_TEST_SECRET",
            "interval_ms": 100,
        },
    }
    env = {**os.environ, "ARCHIVE_TEST_SECRET": SECRET_KEY}
    store = s3_server.client()

    def archived_end(partition: int) -> int:
        return s3.archived_end(store, s3_bucket, "run", topic, partition)

    with replicad_run(
        kafka_broker.bootstrap, topic, data_dir, config=config, control_socket=control, env=env
    ) as proc:
        proc.wait_for(
            lambda: all(archived_end(p) == per_partition for p in (0, 1)),
            what="every record in the bucket",
        )
        proc.wait_for(
            lambda: all(s > 0 for s in log_starts(data_dir, topic).values()),
            what="local retention to delete archived segments",
        )
        snap = proc.status()
        assert snap is not None and snap["archive"]["uploaded_segments"] > 0
        assert snap["archive"]["failures"] == 0
    assert SECRET_KEY not in proc.output()
    # What executors on other hosts see of this one's disk: nothing.
    shutil.rmtree(data_dir)
    url, trace = f"s3://{s3_bucket}/run", tmp_path / "trace"
    df = (
        spark.read.format("replicad")
        .option("s3Endpoint", s3_server.endpoint)
        .option("traceFileOpens", str(trace))
        .load(url)
    )
    rows = df.select("partition", "offset", "value").collect()
    assert sorted((r.partition, r.offset) for r in rows) == [
        (p, o) for p in (0, 1) for o in range(per_partition)
    ]
    assert all(bytes(r.value) == b"r%d" % r.offset for r in rows)
    opened = read_trace(str(trace))
    assert any(o.purpose is Purpose.READ for o in opened)
    assert all(o.path.startswith(f"{url}/{topic}-") for o in opened), opened
    # `replicad verify` of the bucket, as a user runs it (credentials from the environment).
    for name, value in s3.client_environ().items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert main(["verify", url, "--s3-endpoint", s3_server.endpoint]) == 0
    lines = capsys.readouterr().out.splitlines()
    for p in (0, 1):
        (line,) = [line for line in lines if line.startswith(f"{topic}-{p}: ")]
        assert line.startswith(f"{topic}-{p}: ok (") and line.endswith(
            f"offsets 0..{per_partition - 1}, 0 gaps)"
        ), line
    out = "\n".join(lines)
    assert out.rstrip().endswith("2 partitions, all ok")


def log_starts(data_dir, topic) -> dict[int, int]:
    """The first offset on disk of each of `topic`'s partitions."""
    found = {}
    for partition in (0, 1):
        logs = sorted((data_dir / f"{topic}-{partition}").glob("*.log"))
        found[partition] = int(logs[0].stem) if logs else 0
    return found
