"""A batch's wider numbers in a delta-spark table's narrower columns: the delta-spark half of the
promotion rule the delta-rs sink applies in its file writer
(:func:`kafka_delta.sinks.delta_rs.file_writer.misfits`).

A producer's int became long, or float became double (changes a Schema Registry accepts), so the
batch's column is wider than the table's. Delta widens the column itself during schema evolution
when the table has type widening on (``delta.enableTypeWidening``: int to long, float to double
in Delta 4), and the batch is then written as it is. Otherwise each value goes into the table's
column when it fits exactly (a long 7 into an int column), and a value that does not fit (2**40,
or 1.5 into an int column) makes its row a dead letter naming the column, the value and both
types; the rest of the batch lands. Top-level columns only: a wider number nested in a struct
is left to Delta, which refuses it with its own sentence.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from kafka_delta.contract import DEAD_LETTER_COLUMN

# Narrowest first: a column's rank against the table's says which is wider.
_NUMBERS: tuple[type[T.DataType], ...] = (
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.FloatType,
    T.DoubleType,
)
# What Delta 4's type widening changes by itself during schema evolution.
_AUTOMATIC = {
    (T.IntegerType, T.LongType),
    (T.ByteType, T.ShortType),
    (T.ByteType, T.IntegerType),
    (T.ShortType, T.IntegerType),
    (T.ByteType, T.LongType),
    (T.ShortType, T.LongType),
    (T.FloatType, T.DoubleType),
}


def _rank(t: T.DataType) -> int | None:
    return next((i for i, kind in enumerate(_NUMBERS) if isinstance(t, kind)), None)


def narrower_columns(
    batch: T.StructType, table: T.StructType, widening: bool
) -> dict[str, T.DataType]:
    """The batch's top-level number columns whose table column is narrower, by name, with the
    table's type; without those Delta widens itself (``widening``: the table has type widening
    on, and the change is one Delta makes during schema evolution)."""
    theirs = {f.name: f.dataType for f in table.fields}
    found = {}
    for f in batch.fields:
        target = theirs.get(f.name)
        mine, their = _rank(f.dataType), None if target is None else _rank(target)
        if mine is None or their is None or mine <= their:
            continue
        if widening and (type(target), type(f.dataType)) in _AUTOMATIC:
            continue
        found[f.name] = target
    return found


def fit_to_table(
    out: DataFrame,
    table: T.StructType,
    widening: bool,
    why: str = "the table's type widening is off",
) -> DataFrame:
    """``out`` with each wider number column cast to the table's narrower column, its rows with
    a value that does not fit exactly marked as dead letters (:data:`DEAD_LETTER_COLUMN`), their
    reason ending in ``why`` (the delta-rs sink's Spark writer says its own)."""
    narrower = narrower_columns(out.schema, table, widening)
    if not narrower:
        return out
    error: Column = (
        F.col(DEAD_LETTER_COLUMN) if DEAD_LETTER_COLUMN in out.columns else F.lit(None)
    ).cast("string")
    for name, target in narrower.items():
        column = F.col(f"`{name}`")
        # try_cast: under ANSI mode (Spark 4's default) a cast out of range raises. A value fits
        # when it survives the round trip (1.5 comes back 1.0, 2**40 as null).
        cast = column.try_cast(target)
        fits = column.isNull() | (
            cast.isNotNull() & (cast.cast(out.schema[name].dataType) == column)
        )
        reason = F.concat(
            F.lit(f"column {name!r}: the value "),
            column.cast("string"),
            F.lit(
                f" ({out.schema[name].dataType.simpleString()}) does not fit the table's "
                f"{target.simpleString()} column exactly ({why})"
            ),
        )
        error = F.when(error.isNull() & ~fits, reason).otherwise(error)
    fitted = out.withColumn(DEAD_LETTER_COLUMN, error)
    for name, target in narrower.items():
        # The rows that do not fit are dead letters: what the cast makes of them is never written.
        fitted = fitted.withColumn(name, F.col(f"`{name}`").try_cast(target))
    return fitted
