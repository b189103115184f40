"""The sample transform, proven with chispa DataFrame equality on small inline inputs."""

from __future__ import annotations

from datetime import datetime, timezone

from chispa import assert_df_equality
from kafka_delta import DEAD_LETTER_COLUMN, KAFKA_SCHEMA, parse_json_values
from pyspark.sql import types as T

from {{ cookiecutter.package_name }}.transform import EVENT_SCHEMA, transform

KAFKA_TS = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def _kafka_rows(spark, values):
    rows = [
        (None, v.encode() if v is not None else None, "orders", 0, i, KAFKA_TS, 0, None)
        for i, v in enumerate(values)
    ]
    return spark.createDataFrame(rows, KAFKA_SCHEMA)


def _expected(spark, rows):
    schema = T.StructType(
        [
            *EVENT_SCHEMA.fields,
            T.StructField("topic", T.StringType()),
            T.StructField("partition", T.IntegerType()),
            T.StructField("offset", T.LongType()),
            T.StructField("kafka_timestamp", T.TimestampType()),
            T.StructField(DEAD_LETTER_COLUMN, T.StringType()),
        ]
    )
    return spark.createDataFrame(rows, schema)


def test_transform_parses_json_events_into_typed_columns(spark) -> None:
    df = _kafka_rows(
        spark,
        [
            '{"id": 1, "event_type": "created", "amount": 12.5, '
            '"event_time": "2026-01-01T00:00:01Z"}',
            '{"id": 2, "event_type": "paid", "amount": 3, "event_time": "2026-01-01T00:00:02Z"}',
        ],
    )
    expected = _expected(
        spark,
        [
            (
                1,
                "created",
                12.5,
                datetime(2026, 1, 1, 0, 0, 1, tzinfo=timezone.utc),
                "orders",
                0,
                0,
                KAFKA_TS,
                None,
            ),
            (
                2,
                "paid",
                3.0,
                datetime(2026, 1, 1, 0, 0, 2, tzinfo=timezone.utc),
                "orders",
                0,
                1,
                KAFKA_TS,
                None,
            ),
        ],
    )
    assert_df_equality(transform(df), expected, ignore_row_order=True, ignore_nullable=True)


def test_transform_marks_every_kind_of_bad_record_as_a_dead_letter(spark) -> None:
    malformed = "malformed JSON, or a field of the wrong type"
    oversized = '{"id": 9, "pad": "' + "x" * (1024 * 1024) + '"}'
    df = _kafka_rows(
        spark,
        [
            '{"id": "not-a-number", "event_type": "paid"}',  # wrong type
            "not json",  # malformed
            '{"id": 7, "event_ty',  # truncated
            None,  # null value (a tombstone)
            '{"event_type": "paid"}',  # required id missing
            oversized,  # larger than the cap
        ],
    )
    expected = _expected(
        spark,
        [
            (None, "paid", None, None, "orders", 0, 0, KAFKA_TS, malformed),
            (None, None, None, None, "orders", 0, 1, KAFKA_TS, malformed),
            (None, None, None, None, "orders", 0, 2, KAFKA_TS, malformed),
            (None, None, None, None, "orders", 0, 3, KAFKA_TS, "value is null"),
            (None, "paid", None, None, "orders", 0, 4, KAFKA_TS, "required field 'id' is missing"),
            (
                None,
                None,
                None,
                None,
                "orders",
                0,
                5,
                KAFKA_TS,
                f"value of {len(oversized)} bytes exceeds 1048576",
            ),
        ],
    )
    assert_df_equality(transform(df), expected, ignore_row_order=True, ignore_nullable=True)


def test_parse_json_values_is_a_reusable_transform_factory(spark) -> None:
    schema = T.StructType([T.StructField("sku", T.StringType())])
    df = _kafka_rows(spark, ['{"sku": "A-1", "ignored": true}'])
    expected = spark.createDataFrame(
        [("A-1", "orders", 0, 0, KAFKA_TS, None)],
        "sku string, topic string, partition int, offset long, kafka_timestamp timestamp, "
        "_error string",
    )
    assert_df_equality(df.transform(parse_json_values(schema)), expected, ignore_nullable=True)


def test_on_decoded_records_the_transform_keeps_every_value_column_and_drops_kafka_plumbing(
    spark,
) -> None:
    """With ``decoding.value.format`` json/avro/protobuf the read task already parsed the value:
    the transform passes its columns on, a field the producers added included."""
    decoded = spark.createDataFrame(
        [
            (1, "created", "web", b"k", "orders", 0, 7, KAFKA_TS, 0, None, None, None, None),
            (None, None, None, b"k", "orders", 0, 8, KAFKA_TS, 0, None, "bad", None, b"\x01"),
        ],
        "id long, event_type string, channel string, key binary, topic string, partition int, "
        "offset long, timestamp timestamp, timestampType int, "
        "headers array<struct<key: string, value: binary>>, _error string, _raw_key binary, "
        "_raw_value binary",
    )
    expected = spark.createDataFrame(
        [
            (1, "created", "web", "orders", 0, 7, KAFKA_TS, None),
            (None, None, None, "orders", 0, 8, KAFKA_TS, "bad"),
        ],
        "id long, event_type string, channel string, topic string, partition int, offset long, "
        "kafka_timestamp timestamp, _error string",
    )
    assert_df_equality(transform(decoded), expected, ignore_nullable=True)
