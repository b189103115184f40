"""Building blocks for a project's transform (:mod:`.contract` says what a transform receives
and returns). Each is a pure ``DataFrame -> DataFrame`` or a factory of one, to compose with
``df.transform(...)``.

>>> def transform(df):  # doctest: +SKIP
...     return df.transform(parse_json_values(EVENT_SCHEMA, required=("id",)))
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from kafka_delta.contract import DEAD_LETTER_COLUMN, RAW_KEY, RAW_VALUE

# A value larger than this is a dead letter, not an attempt to parse megabytes of JSON.
MAX_VALUE_BYTES = 1024 * 1024

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
_DECODER_ONLY_COLUMNS = ("key", "timestampType", "headers", RAW_KEY, RAW_VALUE)


def decoded_events(df: DataFrame) -> DataFrame:
    """A decoded batch (``decoding.value.format`` json, avro or protobuf): its value columns,
    whatever the producers' schema holds today (a field the producers add flows through to
    the table), where each record came from, and ``_error`` as the decoder set it."""
    return df.drop(*_DECODER_ONLY_COLUMNS).withColumnRenamed("timestamp", "kafka_timestamp")
