"""The sample transform, proven with chispa DataFrame equality on small inline inputs."""

from __future__ import annotations

from datetime import datetime, timezone

from chispa import assert_df_equality
from pyspark.sql import types as T

from {{ cookiecutter.package_name }}.embedded.source import SCHEMA
from {{ cookiecutter.package_name }}.transform import EVENT_SCHEMA, parse_json_values, transform

KAFKA_TS = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def _kafka_rows(spark, values):
    rows = [
        (None, v.encode() if v is not None else None, "orders", 0, i, KAFKA_TS, 0, None)
        for i, v in enumerate(values)
    ]
    return spark.createDataFrame(rows, SCHEMA)


def _expected(spark, rows):
    schema = T.StructType(
        [
            *EVENT_SCHEMA.fields,
            T.StructField("topic", T.StringType()),
            T.StructField("partition", T.IntegerType()),
            T.StructField("offset", T.LongType()),
            T.StructField("kafka_timestamp", T.TimestampType()),
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
            ),
        ],
    )
    assert_df_equality(transform(df), expected, ignore_row_order=True, ignore_nullable=True)


def test_transform_keeps_unparseable_fields_as_nulls_with_their_kafka_position(spark) -> None:
    df = _kafka_rows(spark, ['{"id": "not-a-number", "event_type": "paid"}', "not json", None])
    expected = _expected(
        spark,
        [
            (None, "paid", None, None, "orders", 0, 0, KAFKA_TS),
            (None, None, None, None, "orders", 0, 1, KAFKA_TS),
            (None, None, None, None, "orders", 0, 2, KAFKA_TS),
        ],
    )
    assert_df_equality(transform(df), expected, ignore_row_order=True, ignore_nullable=True)


def test_parse_json_values_is_a_reusable_transform_factory(spark) -> None:
    schema = T.StructType([T.StructField("sku", T.StringType())])
    df = _kafka_rows(spark, ['{"sku": "A-1", "ignored": true}'])
    expected = spark.createDataFrame(
        [("A-1", "orders", 0, 0, KAFKA_TS)],
        "sku string, topic string, partition int, offset long, kafka_timestamp timestamp",
    )
    assert_df_equality(df.transform(parse_json_values(schema)), expected, ignore_nullable=True)
