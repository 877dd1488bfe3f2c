"""The export's layout, batch and streaming alike: the records with their `date`, written
partitioned by topic / partition / date.

`date` is the UTC day of the record's timestamp, counted from the epoch, so that the layout
does not depend on the Spark session's time zone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

PARTITION_COLUMNS = ("topic", "partition", "date")
MICROS_PER_DAY = 86_400_000_000


def dated(records: DataFrame) -> DataFrame:
    """The records with their `date` column."""
    from pyspark.sql import functions as F

    day = F.floor(F.unix_micros(F.col("timestamp")) / MICROS_PER_DAY).cast("int")
    return records.withColumn("date", F.date_from_unix_date(day))
