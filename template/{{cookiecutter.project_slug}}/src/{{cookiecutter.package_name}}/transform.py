"""Your logic: a pure ``DataFrame -> DataFrame`` applied to every micro-batch, named in
``conf/*.yaml`` as ``transform: {{ cookiecutter.package_name }}.transform:transform``.

It receives the decoded records (``decoding:`` in the config): the value's columns, ``key``,
``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``, ``headers`` and
``_error`` (set on a record that could not be decoded); with ``decoding.value.format: raw``,
Spark's Kafka columns as they are. It returns the rows for the Delta table.

Keep it free of side effects: after a crash a batch runs again, and exactly-once relies on the
same input giving the same output. A row whose ``_error`` (``DEAD_LETTER_COLUMN``) is set goes
to the dead-letter table instead of the table, with its original record: keep ``topic``,
``partition`` and ``offset`` on such rows. Test it with ``tests/test_transform.py``.
"""

from __future__ import annotations

from kafka_delta import DEAD_LETTER_COLUMN, decoded_events, parse_json_values
from pyspark.sql import DataFrame
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# The order events of schemas/order_event.ddl, for a raw topic parsed here instead.
EVENT_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("event_type", StringType()),
        StructField("amount", DoubleType()),
        StructField("event_time", TimestampType()),
    ]
)


def transform(df: DataFrame) -> DataFrame:
    """Sample: order events as typed columns. The decoder already parsed them; with
    ``decoding.value.format: raw`` the JSON is parsed here, with ``id`` required."""
    if DEAD_LETTER_COLUMN in df.columns:
        return decoded_events(df)
    return df.transform(parse_json_values(EVENT_SCHEMA, required=("id",)))
