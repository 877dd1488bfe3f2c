"""The PySpark data source `replicad` (Spark 4's `pyspark.sql.datasource`): the thin shell.

    spark.dataSource.register(ReplicadDataSource)     # or replicad.spark.register(spark)
    spark.read.format("replicad").option("topics", "orders").load("/var/lib/replicad/data")

Options are parsed once (options.py) where Spark creates the reader; planning (catalog.py)
runs where Spark asks for the partitions, reading (reader.py) on the executors. Nothing
here decides anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from replicad.spark.catalog import Planner, opener_for
from replicad.spark.files import FileOpener
from replicad.spark.options import (
    ReadOptions,
    View,
    parse_options,
    parse_stream_options,
    table_options,
)
from replicad.spark.plan import Split
from replicad.spark.schema import BATCHES_DDL, records_ddl

FORMAT_NAME = "replicad"


class SplitPartition(InputPartition):
    """A Split as Spark's input partition (pickled to the executor that reads it)."""

    def __init__(self, split: Split) -> None:
        super().__init__(split)
        self.split = split


class ReplicadDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        # Called for batch reads and streams alike: each reader checks its own options.
        view, include_headers = table_options(self.options)
        return BATCHES_DDL if view is View.BATCHES else records_ddl(include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return ReplicadReader(parse_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from replicad.spark.stream import ReplicadStreamReader

        return ReplicadStreamReader(parse_stream_options(self.options))


class ReplicadReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.read_options = options

    def _opener(self) -> FileOpener:
        return opener_for(self.read_options)

    def partitions(self) -> Sequence[InputPartition]:
        splits = Planner(self.read_options).plan()
        return [SplitPartition(split) for split in splits]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SplitPartition):
            # Spark reads one default partition when `partitions()` found nothing to read.
            return
        # The decoders (numpy, kio) are imported where splits are read, not where Spark
        # only plans: a stream's source process on the driver starts once per query.
        from replicad.spark.reader import read_batches, read_records

        if self.read_options.view is View.BATCHES:
            yield from read_batches(partition.split, self.read_options, self._opener())
        else:
            for batch in read_records(partition.split, self.read_options, self._opener()):
                if not self.read_options.include_headers:
                    batch = batch.drop_columns(["headers"])
                yield batch
