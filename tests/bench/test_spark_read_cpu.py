"""tools.bench.spark_read_cpu: its replica reads back whole, every record once, through the
reader Spark's workers run, and a pass counts what it handed over."""

from __future__ import annotations

import pyarrow as pa

from replicad.spark.schema import RECORDS_ARROW
from tools.bench.spark_read_cpu import (
    BATCH_BYTES,
    HEADER_EVERY,
    VALUE_BYTES,
    batches,
    one_pass,
    write_replica,
)

PER_BATCH = BATCH_BYTES // VALUE_BYTES


def test_the_replica_reads_back_every_record_once(tmp_path):
    records = write_replica(tmp_path, partitions=2, mb=5, codec="lz4")
    assert records == 2 * 2500
    read = pa.Table.from_batches(list(batches(tmp_path))).to_pylist()
    assert len(read) == records
    assert {(r["partition"], r["offset"], r["key"]) for r in read} == {
        (p, o, b"key-%d" % o) for p in range(2) for o in range(2500)
    }
    assert {len(r["value"]) for r in read} == {VALUE_BYTES}
    # A header on the records of every HEADER_EVERY-th producer batch.
    assert {r["offset"] for r in read if r["headers"]} == {
        o for o in range(2500) if (o // PER_BATCH) % HEADER_EVERY == 0
    }


def test_a_pass_counts_the_rows_it_handed_over_as_spark_gets_them(tmp_path):
    records = write_replica(tmp_path, partitions=1, mb=1, codec="none")
    assert all(batch.schema.equals(RECORDS_ARROW) for batch in batches(tmp_path))
    *_, rows = one_pass(tmp_path)
    assert rows == records == PER_BATCH
