"""Rows gathered and handed to Spark as Arrow record batches.

Spark's Python data source accepts Arrow batches from `read()`. Two ways to fill them:
- Columns (the batches view, one row per log entry): rows kept as tuples (one append per
  row) and turned into columns once per batch (`zip(*rows)` runs in C), then one
  `pa.array` per column;
- ArrowBatches (the records view): batches already columnar, from decode.py, gathered
  until they are worth a hand-over.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

ROWS_PER_BATCH = 8192
ROWS_ALONE = ROWS_PER_BATCH // 4


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


class ArrowBatches:
    """Arrow batches on their way to Spark: a batch of ROWS_ALONE rows or more goes as it
    is; smaller ones (a few tiny Kafka batches, a legacy entry) are gathered and combined
    until they make ROWS_PER_BATCH, so Spark gets neither a batch per record nor copies of
    batches that were big enough."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._batches: list[pa.RecordBatch] = []
        self._rows = 0

    def add(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """Keep `batch`; the batches due for Spark now, in order."""
        if batch.num_rows >= ROWS_ALONE:
            gathered = self.take()
            return [gathered, batch] if gathered is not None else [batch]
        if batch.num_rows:
            self._batches.append(batch)
            self._rows += batch.num_rows
        if self._rows >= ROWS_PER_BATCH:
            gathered = self.take()
            return [gathered] if gathered is not None else []
        return []

    def take(self) -> pa.RecordBatch | None:
        """Everything gathered, as one batch; None when nothing was."""
        if not self._batches:
            return None
        batches, self._batches, self._rows = self._batches, [], 0
        if len(batches) == 1:
            return batches[0]
        table = pa.Table.from_batches(batches, schema=self.schema).combine_chunks()
        return table.to_batches()[0]
