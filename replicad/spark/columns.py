"""Rows gathered and handed to Spark as Arrow record batches.

Spark's Python data source accepts Arrow batches from `read()`. Rows are kept as tuples
(one append per row) and turned into columns once per batch (`zip(*rows)` runs in C), then
one `pa.array` per column, instead of a conversion per row on Spark's side.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

ROWS_PER_BATCH = 8192


class Columns:
    """Rows of `schema`, field order; `take()` empties it into an Arrow batch."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.rows: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self.rows)

    def take(self) -> pa.RecordBatch:
        columns = list(zip(*self.rows, strict=True)) if self.rows else [()] * len(self.schema)
        self.rows = []
        arrays = [
            pa.array(values, type=field.type)
            for values, field in zip(columns, self.schema, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
