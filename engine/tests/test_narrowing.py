"""The promotion rule in Spark's types (kafka_delta.delta.schema: the delta-spark sink and the
delta-rs sink's Spark writer apply it), on the real Spark session: a batch whose producer's int
became long, or float became double, goes into a table's narrower column where each value fits,
and the rows whose value does not fit become dead letters naming the column, the value and both
types. The delta-rs sink's half is in test_avro_types.py; the sink itself needs delta-spark's
jars (test_formats.py)."""

from __future__ import annotations

from pyspark.sql import types as T

from kafka_delta.contract import DEAD_LETTER_COLUMN
from kafka_delta.delta.schema import fit_to_table, narrower_columns

TABLE = T.StructType(
    [
        T.StructField("id", T.IntegerType()),
        T.StructField("amount", T.FloatType()),
        T.StructField("name", T.StringType()),
    ]
)


def test_wider_numbers_fit_the_tables_columns_or_become_dead_letters(spark) -> None:
    batch = spark.createDataFrame(
        [(1, 1.5, "a", None), (2**40, 2.0, "b", None), (3, 1e300, "c", None), (4, 2.5, "d", "x")],
        "id long, amount double, name string, _error string",
    )
    out = fit_to_table(batch, TABLE, widening=False)

    assert out.schema["id"].dataType == T.IntegerType()
    assert out.schema["amount"].dataType == T.FloatType()
    rows = {r["name"]: r for r in out.collect()}
    assert (rows["a"]["id"], rows["a"]["amount"], rows["a"][DEAD_LETTER_COLUMN]) == (1, 1.5, None)
    assert rows["b"][DEAD_LETTER_COLUMN] == (
        "column 'id': the value 1099511627776 (bigint) does not fit the table's int column "
        "exactly (the table's type widening is off)"
    )
    assert "column 'amount': the value 1.0E300 (double)" in rows["c"][DEAD_LETTER_COLUMN]
    # A row that was already a dead letter keeps its own reason.
    assert rows["d"][DEAD_LETTER_COLUMN] == "x"


def test_a_double_with_a_fraction_does_not_fit_an_int_column(spark) -> None:
    batch = spark.createDataFrame([(7.0,), (7.5,), (None,)], "id double")
    rows = fit_to_table(batch, TABLE, widening=False).collect()
    assert [(r["id"], r[DEAD_LETTER_COLUMN]) for r in rows][0::2] == [(7, None), (None, None)]
    reason = rows[1][DEAD_LETTER_COLUMN]
    assert "the value 7.5 (double) does not fit the table's int column" in reason


def test_with_type_widening_on_delta_widens_what_it_widens_itself() -> None:
    batch = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("amount", T.DoubleType())]
    )
    # int -> long and float -> double Delta widens in the write; nothing is narrowed.
    assert narrower_columns(batch, TABLE, widening=True) == {}
    assert narrower_columns(batch, TABLE, widening=False) == {
        "id": T.IntegerType(),
        "amount": T.FloatType(),
    }
    # Delta 4 does not widen an int to a double by itself: the rule applies.
    doubled = T.StructType([T.StructField("id", T.DoubleType())])
    assert narrower_columns(doubled, TABLE, widening=True) == {"id": T.IntegerType()}
    # A column of the table's type, or narrower, is left to the write.
    same = T.StructType([T.StructField("id", T.ShortType()), T.StructField("name", T.LongType())])
    assert narrower_columns(same, TABLE, widening=False) == {}
