"""A Structured Streaming query over Spark's own Kafka source, run to the end of what the
broker holds (Trigger.AvailableNow) into a parquet sink: the peer of the `replicad` stream in
the failover test (a query on the source cluster, stopped, continued on the replica) and in
tools/bench/spark.py.

    .venv/bin/python -m tools.bench.spark_kafka --bootstrap HOST:PORT --topic T \
        --out DIR --checkpoint DIR [--max-offsets-per-trigger N]

Spark's Kafka connector comes from Maven Central through the project's files: `make
spark-kafka-jars` (tools/kafka/jars.sh with tools/kafka/spark-kafka-pom.xml) puts it in
.cache/spark-kafka/lib, and a session gets those jars as `spark.jars` (`connector_jars`), so
no session start resolves anything.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROOT = Path(__file__).resolve().parents[2]
JARS_SH = ROOT / "tools" / "kafka" / "jars.sh"
CONNECTOR_POM = ROOT / "tools" / "kafka" / "spark-kafka-pom.xml"
CONNECTOR_CACHE = ROOT / ".cache" / "spark-kafka"


def connector_jars() -> str:
    """The jars of Spark's Kafka source as `spark.jars` takes them (comma-separated);
    PeerNotInstalledError, naming the make target, when they were not fetched."""
    from tools.peers.process import PeerNotInstalledError

    result = subprocess.run(
        [str(JARS_SH), "classpath", str(CONNECTOR_POM), str(CONNECTOR_CACHE)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 or not result.stdout.strip():
        raise PeerNotInstalledError(
            "Spark's Kafka source is not in .cache/spark-kafka/lib: run `make spark-kafka-jars`"
            f" (jars.sh said: {result.stderr.strip()})"
        )
    return result.stdout.strip().replace(":", ",")


def connector_name(jars: str) -> str:
    """Which connector a run used, for its report: the spark-sql-kafka jar's file name."""
    names = [Path(j).name for j in jars.split(",")]
    return next((n.removesuffix(".jar") for n in names if n.startswith("spark-sql-kafka")), jars)


# The columns both sinks of the failover test hold.
COLUMNS = ("topic", "partition", "offset", "key", "value")


def kafka_session(jars: str, master: str = "local[1]") -> SparkSession:
    from replicad.spark.pipeline import spark_session

    spark = spark_session(
        master,
        {
            "spark.jars": jars,
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        },
        app_name="spark kafka source",
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def kafka_stream(spark: SparkSession, bootstrap: str, topic: str, **options: str) -> DataFrame:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def available_now(df: DataFrame, out: str, checkpoint: str) -> int:
    """Run the query into parquet at `out` until the source's data at start is read;
    the rows it read."""
    query = (
        df.select(*COLUMNS)
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return sum(p["numInputRows"] for p in query.recentProgress)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-offsets-per-trigger")
    args = parser.parse_args(argv)
    jars = connector_jars()
    options = {}
    if args.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = args.max_offsets_per_trigger
    spark = kafka_session(jars)
    try:
        rows = available_now(
            kafka_stream(spark, args.bootstrap, args.topic, **options), args.out, args.checkpoint
        )
    finally:
        spark.stop()
    print(f"read {rows} records from {args.topic} with {connector_name(jars)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    raise SystemExit(main())
