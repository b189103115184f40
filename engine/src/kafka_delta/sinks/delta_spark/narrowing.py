"""A batch's wider numbers against a delta-spark table's narrower columns: the delta-spark half of
the promotion rule the delta-rs sink applies (:meth:`kafka_delta.sinks.delta_rs.sink.DeltaRsSink.
_widen_columns`).

A producer's int became long, or float became double (changes a Schema Registry accepts), so the
batch's column is wider than the table's. With schema evolution (``delta.schema_evolution:
add_columns``, the default) the column follows, by a commit of its own before the batch's, all
through Spark SQL (:func:`widen_columns`):

- in place, when the table has Delta's type widening on (``delta.enableTypeWidening``) and Delta
  makes the change (int -> long, float -> double, an integer -> double; top level or inside
  structs): ``ALTER TABLE ... ALTER COLUMN ... TYPE``, no data file rewritten;
- otherwise the table is rewritten once, in one overwrite commit, with the wider columns
  (``overwriteSchema``): the sink never turns type widening on itself, since it upgrades the
  table's protocol past what delta-rs (deltalake 1.6.6) reads.

Either commit is idempotent: once the column is wide, a replayed or restarted batch finds nothing
to widen; a concurrent writer's commit makes Delta refuse it (the run stops, and its restart
widens on the newer snapshot). Without schema evolution (:func:`fit_to_table`) each value goes
into the table's column when it fits exactly (a long 7 into an int column), and a value that does
not fit makes its row a dead letter naming the column, the value and both types.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from kafka_delta.contract import DEAD_LETTER_COLUMN

if TYPE_CHECKING:
    from kafka_delta.sinks.delta_spark.table import SparkTable

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


# What Delta 4's type widening changes in place (ALTER COLUMN ... TYPE): besides _AUTOMATIC, an
# integer to double. A long to double, or anything to float, it does not.
_IN_PLACE = _AUTOMATIC | {
    (T.ByteType, T.DoubleType),
    (T.ShortType, T.DoubleType),
    (T.IntegerType, T.DoubleType),
}

log = logging.getLogger(__name__)


def _rank(t: T.DataType) -> int | None:
    return next((i for i, kind in enumerate(_NUMBERS) if isinstance(t, kind)), None)


def wider_type(table: T.DataType, batch: T.DataType) -> T.DataType | None:
    """The type the table's column ``table`` widens to for the batch's ``batch`` (a wider number,
    also inside structs, arrays and maps); None when there is none to make."""
    mine, theirs = _rank(table), _rank(batch)
    if mine is not None and theirs is not None:
        return batch if theirs > mine else None
    if isinstance(table, T.StructType) and isinstance(batch, T.StructType):
        other = {f.name: f.dataType for f in batch.fields}
        fields, changed = [], False
        for f in table.fields:
            wide = wider_type(f.dataType, other.get(f.name, f.dataType))
            changed |= wide is not None
            fields.append(T.StructField(f.name, wide or f.dataType, f.nullable, f.metadata))
        return T.StructType(fields) if changed else None
    if isinstance(table, T.ArrayType) and isinstance(batch, T.ArrayType):
        wide = wider_type(table.elementType, batch.elementType)
        return None if wide is None else T.ArrayType(wide, table.containsNull)
    if isinstance(table, T.MapType) and isinstance(batch, T.MapType):
        wide = wider_type(table.valueType, batch.valueType)
        return None if wide is None else T.MapType(table.keyType, wide, table.valueContainsNull)
    return None


def _in_place(table: T.DataType, batch: T.DataType, path: str) -> list[tuple[str, T.DataType]]:
    """The ``ALTER COLUMN`` changes (field path, new type) that widen ``table`` to ``batch``
    in place, or raise ValueError when Delta cannot make one of them in place."""
    mine, theirs = _rank(table), _rank(batch)
    if mine is not None and theirs is not None:
        if theirs <= mine:
            return []
        if (type(table), type(batch)) not in _IN_PLACE:
            raise ValueError(path)
        return [(path, batch)]
    if isinstance(table, T.StructType) and isinstance(batch, T.StructType):
        other = {f.name: f.dataType for f in batch.fields}
        return [
            change
            for f in table.fields
            if f.name in other
            for change in _in_place(f.dataType, other[f.name], f"{path}.`{_tick(f.name)}`")
        ]
    if wider_type(table, batch) is not None:
        raise ValueError(path)  # inside an array or a map: left to the rewrite
    return []


def _tick(name: str) -> str:
    return name.replace("`", "``")


def widen_columns(
    spark: SparkSession, target: SparkTable, table: Any, schema: T.StructType, batch: T.StructType
) -> bool:
    """Widen the columns of ``target`` (by name or path; ``table``: its delta-spark
    ``DeltaTable``, ``schema`` its columns) that ``batch`` holds wider, as the module says;
    True when it committed a change. Spark SQL and the DataFrame API only (I14)."""
    theirs = {f.name: f.dataType for f in batch.fields}
    wider = {
        f.name: w
        for f in schema.fields
        if f.name in theirs and (w := wider_type(f.dataType, theirs[f.name])) is not None
    }
    if not wider:
        return False
    ref = target.sql_name()
    properties = table.detail().select("properties").first()
    widening = (properties[0] or {}).get("delta.enableTypeWidening", "false") == "true"
    changes: list[tuple[str, T.DataType]] | None = [] if widening else None
    if changes is not None:
        try:
            for f in schema.fields:
                if f.name in wider:
                    changes += _in_place(f.dataType, theirs[f.name], f"`{_tick(f.name)}`")
        except ValueError:
            changes = None
    if changes is not None:
        for path, kind in changes:
            spark.sql(f"ALTER TABLE {ref} ALTER COLUMN {path} TYPE {kind.simpleString()}")
        how = "in place (Delta's type widening)"
    else:
        from pyspark.sql import functions as F

        current = target.frame()
        widened = current.select(
            [
                F.col(f"`{n}`").cast(wider[n]).alias(n) if n in wider else F.col(f"`{n}`")
                for n in current.columns
            ]
        )
        target.save(
            widened.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
        )
        how = "by rewriting the table in one commit"
    log.info(
        "table %s: column(s) %s widened as the producers' schema did, %s",
        target.location,
        ", ".join(f"{n} -> {t.simpleString()}" for n, t in wider.items()),
        how,
    )
    return True


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
