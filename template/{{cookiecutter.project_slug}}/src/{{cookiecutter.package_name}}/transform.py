"""The project's own logic: a pure ``DataFrame -> DataFrame`` applied to every micro-batch.

Replace :func:`transform` with yours. It receives the Kafka columns (key, value, topic,
partition, offset, timestamp, timestampType, headers) and returns the rows to append to the
Delta table. Keep it free of side effects: a batch may be re-run after a crash, and exactly-once
relies on the same input giving the same output.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

EVENT_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("event_type", StringType()),
        StructField("amount", DoubleType()),
        StructField("event_time", TimestampType()),
    ]
)


def parse_json_values(schema: StructType) -> Callable[[DataFrame], DataFrame]:
    """Factory: parse the Kafka ``value`` as JSON of ``schema`` into top-level typed columns,
    keeping where each record came from (topic, partition, offset, Kafka timestamp).

    >>> df.transform(parse_json_values(EVENT_SCHEMA))  # doctest: +SKIP
    """

    def _parse(df: DataFrame) -> DataFrame:
        parsed = F.from_json(F.col("value").cast("string"), schema)
        return df.select(
            parsed.alias("event"),
            F.col("topic"),
            F.col("partition"),
            F.col("offset"),
            F.col("timestamp").alias("kafka_timestamp"),
        ).select("event.*", "topic", "partition", "offset", "kafka_timestamp")

    return _parse


def transform(df: DataFrame) -> DataFrame:
    """Sample transform: JSON order events into typed columns."""
    return df.transform(parse_json_values(EVENT_SCHEMA))
