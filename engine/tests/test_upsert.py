"""Upsert's batch de-duplication (``latest_per_key``), proven with chispa on inline inputs."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality

from kafka_delta.upsert import latest_per_key

pytestmark = pytest.mark.spark

SCHEMA = "id long, amount double, topic string, partition int, offset long, _error string"


def test_the_later_record_of_a_key_wins_within_a_batch(spark) -> None:
    batch = spark.createDataFrame(
        [
            (1, 1.0, "o", 0, 10, None),
            (2, 5.0, "o", 1, 3, None),
            (1, 2.0, "o", 0, 11, None),
            (1, 1.5, "o", 0, 9, None),
        ],
        SCHEMA,
    )

    result = batch.transform(latest_per_key(("id",), None))

    expected = spark.createDataFrame(
        [(1, 2.0, "o", 0, 11, None), (2, 5.0, "o", 1, 3, None)], SCHEMA
    )
    assert_df_equality(result, expected, ignore_row_order=True)


def test_order_by_decides_before_the_kafka_position(spark) -> None:
    schema = f"{SCHEMA}, version long"
    batch = spark.createDataFrame(
        [(1, 9.0, "o", 0, 10, None, 3), (1, 1.0, "o", 0, 11, None, 1)], schema
    )

    result = batch.transform(latest_per_key(("id",), "version"))

    expected = spark.createDataFrame([(1, 9.0, "o", 0, 10, None, 3)], schema)
    assert_df_equality(result, expected, ignore_row_order=True)


def test_dead_letters_all_pass_through_and_never_displace_a_good_row(spark) -> None:
    batch = spark.createDataFrame(
        [
            (1, 1.0, "o", 0, 1, None),
            (1, None, "o", 0, 2, "malformed JSON"),
            (None, None, "o", 0, 3, "malformed JSON"),
            (None, 4.0, "o", 0, 4, None),
        ],
        SCHEMA,
    )

    result = batch.transform(latest_per_key(("id",), None))

    expected = spark.createDataFrame(
        [
            (1, 1.0, "o", 0, 1, None),
            (1, None, "o", 0, 2, "malformed JSON"),
            (None, None, "o", 0, 3, "malformed JSON"),
            # A row without its key cannot be merged: it becomes a dead letter.
            (None, 4.0, "o", 0, 4, "merge key 'id' is null"),
        ],
        SCHEMA,
    )
    assert_df_equality(result, expected, ignore_row_order=True)


def test_a_merge_key_missing_from_the_output_is_named(spark) -> None:
    batch = spark.createDataFrame([(1, 1.0, "o", 0, 1, None)], SCHEMA)

    with pytest.raises(ValueError, match=r"upsert columns \['order_id'\]"):
        batch.transform(latest_per_key(("order_id",), None))
