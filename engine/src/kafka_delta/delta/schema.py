"""The table's type rules, one place for both sinks and the decoders' schema versions: the
numbers by rank (one table, with an Arrow view and a Spark view), a type's identity with
nullability left out (:func:`loose_type`), a type with every nested field nullable
(:func:`all_nullable`), and the promotion rule: a batch's wider numbers against a Delta
table's narrower columns.

A producer's int became long, or float became double (changes a Schema Registry accepts), so a
batch's column is wider than the table's. Where the table follows (schema evolution), the
column is widened (:func:`wider_arrow_type`, :func:`wider_spark_type` say to what); each sink
makes that commit its own way (the delta-spark sink through Spark SQL,
:mod:`kafka_delta.sinks.delta_spark.widening`; the delta-rs sink with delta-rs,
``DeltaRsSink._widen_columns``). Where it does not, each value goes
into the table's column when it fits exactly (a long 7 into an int column), and a value that
does not fit makes its row a dead letter naming the column, the value and both types
(:func:`fit_to_table`): the delta-spark sink and the delta-rs sink's Spark writer
(:mod:`kafka_delta.sinks.delta_rs.jvm_writer`) apply this one rule, as Spark expressions.

A batch's Arrow schema against the table's, as the delta-rs sink checks it before any file is
written and again before its commit: one :class:`SchemaMismatchError` naming every difference
(:func:`check_batch_schema`: missing, extra and other-typed columns, nulls inside a nested
value where the table forbids them), files written before a concurrent widening
(:func:`check_not_widened_since`), and the table's struct columns with the batch's new nested
fields (:func:`with_nested_fields`).

What Delta 4's type widening changes by itself (``delta.enableTypeWidening``) is here too
(:data:`IN_PLACE`, and what :func:`narrower_columns` leaves to Delta): a Delta fact, not a
sink's.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from kafka_delta.contract import DEAD_LETTER_COLUMN

# The numbers, narrowest first: a column's rank against the table's says which is wider. One
# table, two views: Arrow's types (the decoders, the delta-rs sink) and Spark's (the delta-spark
# sink, the delta-rs sink's Spark writer).
NUMBERS = ("byte", "short", "integer", "long", "float", "double")
_ARROW = (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64())
_SPARK: tuple[type[T.DataType], ...] = (
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
IN_PLACE = _AUTOMATIC | {
    (T.ByteType, T.DoubleType),
    (T.ShortType, T.DoubleType),
    (T.IntegerType, T.DoubleType),
}


def arrow_rank(t: pa.DataType) -> int | None:
    """Where an Arrow number type stands among :data:`NUMBERS`; None for any other type."""
    return _ARROW.index(t) if t in _ARROW else None


def spark_rank(t: T.DataType) -> int | None:
    """Where a Spark number type stands among :data:`NUMBERS`; None for any other type."""
    return next((i for i, kind in enumerate(_SPARK) if isinstance(t, kind)), None)


def promotes(writer: pa.DataType, reader: pa.DataType) -> bool:
    """A number read as a wider one (int -> long, float -> double, an integer -> a float, as
    Avro and Protobuf readers promote)."""
    mine, theirs = arrow_rank(writer), arrow_rank(reader)
    return mine is not None and theirs is not None and mine < theirs


def narrowable(batch: pa.DataType, table: pa.DataType) -> bool:
    """Two different number types: a value of ``batch`` goes into ``table`` when it fits
    exactly (a long 7 into an int column), checked value by value."""
    return arrow_rank(batch) is not None and arrow_rank(table) is not None and batch != table


def loose_type(t: pa.DataType) -> str:
    """A type's identity with nullability left out (names and types only): how two schema
    versions' columns, and a batch's against its table's, are compared (the delta-rs writer
    checks a non-null table column row by row instead: its ``write_files``)."""
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{loose_type(f.type)}" for f in t) + ">"
    if pa.types.is_list(t):
        return f"list<{loose_type(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{loose_type(t.key_type)},{loose_type(t.item_type)}>"
    return str(t)


def all_nullable(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable (a cast target that takes any nesting of nulls)."""
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(all_nullable(f.type)).with_nullable(True) for f in t])
    if pa.types.is_list(t):
        v = t.value_field
        return pa.list_(v.with_type(all_nullable(v.type)).with_nullable(True))
    if pa.types.is_map(t):
        i = t.item_field
        return pa.map_(t.key_field, i.with_type(all_nullable(i.type)).with_nullable(True))
    return t


def wider_arrow_type(table: pa.DataType, batch: pa.DataType) -> pa.DataType | None:
    """The type the table's column ``table`` widens to for the batch's ``batch``, when the
    batch's is wider by a promotion (a wider number, also inside structs, lists and maps), in
    Arrow's types; None when there is none to make."""
    if arrow_rank(table) is not None and arrow_rank(batch) is not None:
        return batch if promotes(table, batch) else None
    if pa.types.is_struct(table) and pa.types.is_struct(batch):
        theirs = {f.name: f.type for f in batch}
        fields = [
            f.with_type(w) if (w := wider_arrow_type(f.type, theirs.get(f.name, f.type))) else f
            for f in table
        ]
        return pa.struct(fields) if fields != list(table) else None
    if pa.types.is_list(table) and pa.types.is_list(batch):
        value = wider_arrow_type(table.value_type, batch.value_type)
        return None if value is None else pa.list_(table.value_field.with_type(value))
    if pa.types.is_map(table) and pa.types.is_map(batch):
        item = wider_arrow_type(table.item_type, batch.item_type)
        return None if item is None else pa.map_(table.key_field, table.item_field.with_type(item))
    return None


def wider_spark_type(table: T.DataType, batch: T.DataType) -> T.DataType | None:
    """:func:`wider_arrow_type` in Spark's types (the delta-spark sink's widening)."""
    mine, theirs = spark_rank(table), spark_rank(batch)
    if mine is not None and theirs is not None:
        return batch if theirs > mine else None
    if isinstance(table, T.StructType) and isinstance(batch, T.StructType):
        other = {f.name: f.dataType for f in batch.fields}
        fields, changed = [], False
        for f in table.fields:
            wide = wider_spark_type(f.dataType, other.get(f.name, f.dataType))
            changed |= wide is not None
            fields.append(T.StructField(f.name, wide or f.dataType, f.nullable, f.metadata))
        return T.StructType(fields) if changed else None
    if isinstance(table, T.ArrayType) and isinstance(batch, T.ArrayType):
        wide = wider_spark_type(table.elementType, batch.elementType)
        return None if wide is None else T.ArrayType(wide, table.containsNull)
    if isinstance(table, T.MapType) and isinstance(batch, T.MapType):
        wide = wider_spark_type(table.valueType, batch.valueType)
        return None if wide is None else T.MapType(table.keyType, wide, table.valueContainsNull)
    return None


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
        mine, their = spark_rank(f.dataType), None if target is None else spark_rank(target)
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


# -- a batch's Arrow schema against the table's (the delta-rs sink) ----------------------------


class SchemaMismatchError(ValueError):
    """The batch's columns do not match the table's: nothing was written."""


def nested_stricter(batch: pa.DataType, table: pa.DataType) -> bool:
    """True when the table forbids nulls inside a nested value where the batch allows them."""
    if pa.types.is_struct(table):
        return any(
            (not t.nullable and b.nullable) or nested_stricter(b.type, t.type)
            for b, t in zip(batch, table, strict=True)
        )
    if pa.types.is_list(table):
        b, t = batch.value_field, table.value_field
        return (not t.nullable and b.nullable) or nested_stricter(b.type, t.type)
    if pa.types.is_map(table):
        b, t = batch.item_field, table.item_field
        return (not t.nullable and b.nullable) or nested_stricter(b.type, t.type)
    return False


def check_batch_schema(batch: pa.Schema, table: pa.Schema, table_uri: str) -> None:
    """Raise ONE :class:`SchemaMismatchError` naming every difference between the batch's
    columns (already in Delta's types) and the table's; column order does not matter."""
    theirs = {f.name: f for f in table}
    ours = {f.name: f for f in batch}
    missing = [n for n in theirs if n not in ours]
    problems = [f"missing column {n!r} ({loose_type(theirs[n].type)})" for n in missing]
    extra = [n for n in ours if n not in theirs]
    problems += [f"extra column {n!r} ({loose_type(ours[n].type)})" for n in extra]
    for name in (n for n in theirs if n in ours):
        mine, table_field = ours[name], theirs[name]
        if loose_type(mine.type) != loose_type(table_field.type) and not narrowable(
            mine.type, table_field.type
        ):
            problems.append(
                f"column {name!r} is {loose_type(mine.type)} in the batch, "
                f"{loose_type(table_field.type)} in the table"
            )
        elif nested_stricter(mine.type, table_field.type):
            problems.append(
                f"column {name!r} may hold nulls inside its values, which the table forbids"
            )
    if problems:
        raise SchemaMismatchError(
            f"the batch does not match the schema of table {table_uri}: {'; '.join(problems)}. "
            "Nothing was written. Change the transform to produce the table's columns, or "
            "evolve the table's schema first."
        )


def check_not_widened_since(files: pa.Schema, table: pa.Schema, table_uri: str) -> None:
    """Files written in a column type the table has widened since (another writer rewrote it,
    the delta-rs sink's ``_widen_columns``) are not committed: their Parquet type is no longer the
    column's. The batch stops before its commit; run again, it writes its files anew."""
    for f in files:
        if f.name in table.names and wider_arrow_type(f.type, table.field(f.name).type) is not None:
            raise SchemaMismatchError(
                f"column {f.name!r} of table {table_uri} was widened to "
                f"{table.field(f.name).type} while the batch's files were written as {f.type}; "
                "nothing was written: run again to write them in the table's new type"
            )


def with_nested_fields(table: pa.DataType, batch: pa.DataType) -> pa.DataType:
    """The table's column type ``table`` with the fields the batch's ``batch`` has and it lacks
    inside its structs (also in list and map values) appended, nullable; else unchanged."""
    if pa.types.is_struct(table) and pa.types.is_struct(batch):
        theirs = {f.name: f for f in batch}
        fields = [
            f.with_type(with_nested_fields(f.type, theirs[f.name].type)) if f.name in theirs else f
            for f in table
        ]
        have = {f.name for f in table}
        fields += [f.with_nullable(True) for f in batch if f.name not in have]
        return pa.struct(fields)
    if pa.types.is_list(table) and pa.types.is_list(batch):
        value = table.value_field
        return pa.list_(value.with_type(with_nested_fields(value.type, batch.value_type)))
    if pa.types.is_map(table) and pa.types.is_map(batch):
        item = table.item_field
        return pa.map_(
            table.key_field, item.with_type(with_nested_fields(item.type, batch.item_type))
        )
    return table
