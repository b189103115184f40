"""The sample order events (:mod:`.produce` writes them) as a transform reads them: their Spark
schema, and the transform the engine's own tests and the benchmark run them through (a
generated project carries the same sample in its ``transform.py``, its own to change)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kafka_delta.contract import DEAD_LETTER_COLUMN
from kafka_delta.transforms import decoded_events, parse_json_values

EVENT_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("event_type", StringType()),
        StructField("amount", DoubleType()),
        StructField("event_time", TimestampType()),
    ]
)

TRANSFORM = "kafka_delta_dev.orders:transform"
"""How a config names :func:`transform`."""


def transform(df: DataFrame) -> DataFrame:
    """Order events as typed columns: decoded ones as the decoder made them, raw JSON parsed here
    with ``id`` required."""
    if DEAD_LETTER_COLUMN in df.columns:
        return decoded_events(df)
    return df.transform(parse_json_values(EVENT_SCHEMA, required=("id",)))
