"""Rows to Arrow batches: types from the schema, nulls kept, the buffer emptied; small
batches gathered on their way to Spark, big ones passed as they are, order kept."""

from __future__ import annotations

import pyarrow as pa

from replicad.spark.columns import ROWS_ALONE, ROWS_PER_BATCH, ArrowBatches, Columns
from replicad.spark.schema import HEADERS, TIMESTAMP


def test_rows_become_one_arrow_batch_of_the_schema():
    schema = pa.schema([("n", pa.int64()), ("ts", TIMESTAMP), ("b", pa.binary()), ("h", HEADERS)])
    columns = Columns(schema)
    columns.rows.append((1, 1_700_000_000_000_000, b"x", [("k", b"v"), ("n", None)]))
    columns.rows.append((2, None, None, []))
    assert len(columns) == 2
    batch = columns.take()
    assert batch.schema == schema
    assert batch.to_pylist()[1] == {"n": 2, "ts": None, "b": None, "h": []}
    assert batch.column("h")[0].as_py() == [
        {"key": "k", "value": b"v"},
        {"key": "n", "value": None},
    ]
    assert batch.column("ts").type == TIMESTAMP
    assert len(columns) == 0
    empty = columns.take()
    assert empty.num_rows == 0 and empty.schema == schema


def _numbers(start: int, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"n": list(range(start, start + n))})


def test_small_batches_are_gathered_big_ones_pass_in_order():
    schema = pa.schema([("n", pa.int64())])
    batches = ArrowBatches(schema)
    handed: list[pa.RecordBatch] = []
    small = ROWS_ALONE // 3
    at = 0
    count = -(-ROWS_PER_BATCH // small)  # just enough small ones to make one full batch
    for i in range(count):
        handed += batches.add(_numbers(at, small))
        at += small
        assert len(handed) == (i == count - 1)
    assert [b.num_rows for b in handed] == [small * count]
    handed += batches.add(_numbers(at, 5))
    handed += batches.add(pa.RecordBatch.from_pydict({"n": []}, schema=schema))
    big = _numbers(at + 5, ROWS_ALONE)
    last = batches.add(big)
    assert [b.num_rows for b in last] == [5, ROWS_ALONE] and last[1] is big  # not copied
    handed += last
    assert batches.take() is None
    numbers = [n for b in handed for n in b.column("n").to_pylist()]
    assert numbers == list(range(at + 5 + ROWS_ALONE))
    assert all(b.schema == schema for b in handed)
