"""A Structured Streaming query over Spark's own Kafka source, run to the end of what the
broker holds (Trigger.AvailableNow) into a parquet sink: the peer of the `replicad` stream in
the failover test (a query on the source cluster, stopped, continued on the replica) and in
tools/bench/spark.py.

    .venv/bin/python -m tools.bench.spark_kafka --bootstrap HOST:PORT --topic T \
        --out DIR --checkpoint DIR [--max-offsets-per-trigger N]

Spark's Kafka connector comes from Maven Central through spark.jars.packages, as the bench
gets it (tools/bench/spark.py: kafka_package, ivy_settings).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The columns both sinks of the failover test hold.
COLUMNS = ("topic", "partition", "offset", "key", "value")


def kafka_session(package: str, work: Path, master: str = "local[1]") -> SparkSession:
    from replicad.spark.pipeline import spark_session
    from tools.bench.spark import ivy_settings

    spark = spark_session(
        master,
        {
            "spark.jars.packages": package,
            "spark.jars.ivySettings": str(ivy_settings(work)),
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
    parser.add_argument("--kafka-package", help="default: tools.bench.spark.kafka_package()")
    args = parser.parse_args(argv)
    from tools.bench.spark import kafka_package

    package = args.kafka_package or kafka_package()
    options = {}
    if args.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = args.max_offsets_per_trigger
    with tempfile.TemporaryDirectory(prefix="spark-kafka-") as work:
        spark = kafka_session(package, Path(work))
        try:
            rows = available_now(
                kafka_stream(spark, args.bootstrap, args.topic, **options),
                args.out,
                args.checkpoint,
            )
        finally:
            spark.stop()
    print(f"read {rows} records from {args.topic} with {package}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    raise SystemExit(main())
