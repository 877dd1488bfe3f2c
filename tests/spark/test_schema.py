"""The two tables: Spark DDL and Arrow schemas name the same columns; Kafka's "none" values."""

from __future__ import annotations

import re

from replicad.spark.schema import (
    BATCHES_ARROW,
    BATCHES_DDL,
    RECORDS_ARROW,
    RECORDS_DDL,
    micros,
    none_if_negative,
)


def ddl_names(ddl: str) -> list[str]:
    """Top-level column names of a DDL string (commas inside <...> do not split)."""
    depth, names, current = 0, [], ""
    for ch in ddl + ",":
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        if ch == "," and depth == 0:
            names.append(current.strip().split(" ")[0])
            current = ""
        else:
            current += ch
    return names


def test_ddl_and_arrow_agree_on_the_columns():
    assert ddl_names(RECORDS_DDL) == RECORDS_ARROW.names
    assert ddl_names(BATCHES_DDL) == BATCHES_ARROW.names
    assert RECORDS_ARROW.names[:8] == [
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestamp_type",
        "key",
        "value",
        "headers",
    ]
    assert re.search(r"headers array<struct<key:string,value:binary>>", RECORDS_DDL)


def test_kafka_none_values_become_nulls():
    assert micros(-1) is None
    assert micros(0) == 0
    assert micros(1_700_000_000_123) == 1_700_000_000_123_000
    assert none_if_negative(-1) is None
    assert none_if_negative(0) == 0
