"""Spark over replicad's data directory: the `replicad` PySpark data source and the pipeline jobs.

    from replicad.spark import register
    register(spark)
    df = spark.read.format("replicad").load("/var/lib/replicad/data")

Installed with the `spark` extra (`pip install '.[spark]'` in a checkout, or the wheel from
`make dist` with `[spark]`). In local mode, `register` points Spark's Python workers at the
interpreter that runs the driver, unless PYSPARK_PYTHON or spark.pyspark.python chose one:
PySpark would otherwise start `python3` from PATH, which (a venv's python run without
activating the venv) cannot import replicad. The modules:
- options: the source's options, parsed and checked;
- plan / catalog: splits (per segment or per byte range of one), pruned by topic,
  partition, offset and timestamp from names and indexes (catalog does the I/O);
- walk / reader / txn: reading a split on an executor, read_committed included;
- decode: record batches to Arrow columns, many batches at once (the reader's hot path);
- files: every file open, observable (`traceFileOpens`);
- schema / columns: the tables, and Arrow batches for Spark;
- source: the DataSource classes; stream: `spark.readStream` over the replica (admission:
  how far each micro-batch reads; stable: the last stable offset for read_committed);
- pipeline: `replicad pipeline export|verify|offsets-from-checkpoint` (follow: the export
  as a streaming query; handover: offsets out of a Spark checkpoint, for a failover);
  submit: spark-submit's program file for those jobs;
- worker_python / connect_first / forkserver: how a local run's Python workers start (the
  driver's interpreter and PySpark; connected to Spark before importing; forked warm).

Importing this package does not import pyspark; `register` does.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Sessions the format was registered in: Spark warns about each registration after the first.
_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Make `spark.read.format("replicad")` available in this session (once is enough)."""
    if spark in _registered:
        return
    from replicad.spark.source import ReplicadDataSource

    _local_workers_use_this_python(spark)
    spark.dataSource.register(ReplicadDataSource)
    _registered.add(spark)


def _local_workers_use_this_python(spark: SparkSession) -> None:
    """In local mode, Python workers run on this machine: the driver's own interpreter
    has replicad and its dependencies, `python3` from PATH may not. On a cluster the
    executors' Python is the operator's to choose (README, "Querying the replica")."""
    context = spark.sparkContext
    chosen = os.environ.get("PYSPARK_PYTHON") or context.getConf().get("spark.pyspark.python")
    if chosen is None and context.master.startswith("local"):
        context.pythonExec = sys.executable
