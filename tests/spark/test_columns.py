"""Rows to Arrow batches: types from the schema, nulls kept, the buffer emptied."""

from __future__ import annotations

import pyarrow as pa

from replicad.spark.columns import Columns
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
