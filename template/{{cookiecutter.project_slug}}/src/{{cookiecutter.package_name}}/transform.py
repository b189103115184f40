"""The project's own logic: a pure ``DataFrame -> DataFrame`` applied to every micro-batch.

Replace :func:`transform` with yours. It receives the decoded value's columns (``decoding:`` in
the config), the Kafka columns (key, topic, partition, offset, timestamp, timestampType,
headers) and ``_error``; with ``decoding.value.format: raw``, Spark's Kafka columns (key, value,
topic, ...) as they are. It returns the rows to append to the Delta table. Keep it free of
side effects: a batch may be re-run after a crash, and exactly-once relies on the same input
giving the same output.

Dead letters: a row whose ``_error`` column (:data:`DEAD_LETTER_COLUMN`) is not null is not
appended to the table. The pipeline writes the original Kafka record (topic, partition,
offset, timestamp, key, value) with that error to the dead-letter table instead, so such rows
must keep ``topic``, ``partition`` and ``offset``.
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

DEAD_LETTER_COLUMN = "_error"

# A value larger than this is a dead letter, not an attempt to parse megabytes of JSON.
MAX_VALUE_BYTES = 1024 * 1024

EVENT_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("event_type", StringType()),
        StructField("amount", DoubleType()),
        StructField("event_time", TimestampType()),
    ]
)

_CORRUPT = "_corrupt_record"


def parse_json_values(
    schema: StructType, required: tuple[str, ...] = (), max_value_bytes: int = MAX_VALUE_BYTES
) -> Callable[[DataFrame], DataFrame]:
    """Factory: parse the Kafka ``value`` as JSON of ``schema`` into top-level typed columns,
    keeping where each record came from (topic, partition, offset, Kafka timestamp), and set
    ``_error`` for records that cannot be parsed: null or oversized values, malformed or
    truncated JSON, a field of the wrong type, a missing required field.

    >>> df.transform(parse_json_values(EVENT_SCHEMA, required=("id",)))  # doctest: +SKIP
    """
    with_corrupt = StructType([*schema.fields, StructField(_CORRUPT, StringType())])

    def _parse(df: DataFrame) -> DataFrame:
        size = F.octet_length(F.col("value"))
        parsed = F.from_json(
            F.col("value").cast("string"),
            with_corrupt,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT},
        )
        event = F.col("event")
        error = F.when(F.col("value").isNull(), F.lit("value is null"))
        error = error.when(
            size > max_value_bytes,
            F.concat(
                F.lit("value of "), size.cast("string"), F.lit(f" bytes exceeds {max_value_bytes}")
            ),
        )
        error = error.when(
            event[_CORRUPT].isNotNull(), F.lit("malformed JSON, or a field of the wrong type")
        )
        for name in required:
            error = error.when(event[name].isNull(), F.lit(f"required field {name!r} is missing"))
        return df.select(
            F.when(size <= max_value_bytes, parsed).alias("event"),
            "topic",
            "partition",
            "offset",
            F.col("timestamp").alias("kafka_timestamp"),
            "value",
        ).select(
            *(F.col(f"event.{f.name}").alias(f.name) for f in schema.fields),
            "topic",
            "partition",
            "offset",
            "kafka_timestamp",
            error.alias(DEAD_LETTER_COLUMN),
        )

    return _parse


# Columns of a decoded batch that are Kafka's plumbing rather than the table's.
_DECODER_ONLY_COLUMNS = ("key", "timestampType", "headers", "_raw_key", "_raw_value")


def decoded_events(df: DataFrame) -> DataFrame:
    """A decoded batch (``decoding.value.format`` json, avro or protobuf): its value columns,
    whatever the producers' schema holds today (a field the producers add flows through to
    the table), where each record came from, and ``_error`` as the decoder set it."""
    return df.drop(*_DECODER_ONLY_COLUMNS).withColumnRenamed("timestamp", "kafka_timestamp")


def transform(df: DataFrame) -> DataFrame:
    """Sample transform: order events as typed columns. The decoder (``decoding:`` in the
    config) already parsed them; with ``decoding.value.format: raw`` the JSON is parsed here,
    with ``id`` required."""
    if DEAD_LETTER_COLUMN in df.columns:
        return decoded_events(df)
    return df.transform(parse_json_values(EVENT_SCHEMA, required=("id",)))
