"""A batch's wider numbers widen a delta-spark table's narrower columns, through Spark SQL: the
delta-spark sink's commit of the promotion rule (:mod:`kafka_delta.delta.schema`, which both
sinks share; the delta-rs sink makes its own with delta-rs, ``DeltaRsSink._widen_columns``).

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
widens on the newer snapshot). Without schema evolution
(:func:`kafka_delta.delta.schema.fit_to_table`) each value goes into the table's column when
it fits exactly (a long 7 into an int column), and a value that does not fit makes its row a
dead letter naming the column, the value and both types.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from kafka_delta.delta.schema import IN_PLACE, spark_rank, wider_spark_type

if TYPE_CHECKING:
    from kafka_delta.delta.spark_table import SparkTable

log = logging.getLogger(__name__)


def _in_place(table: T.DataType, batch: T.DataType, path: str) -> list[tuple[str, T.DataType]]:
    """The ``ALTER COLUMN`` changes (field path, new type) that widen ``table`` to ``batch``
    in place, or raise ValueError when Delta cannot make one of them in place."""
    mine, theirs = spark_rank(table), spark_rank(batch)
    if mine is not None and theirs is not None:
        if theirs <= mine:
            return []
        if (type(table), type(batch)) not in IN_PLACE:
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
    if wider_spark_type(table, batch) is not None:
        raise ValueError(path)  # inside an array or a map: left to the rewrite
    return []


def _tick(name: str) -> str:
    return name.replace("`", "``")


def widen_columns(
    spark: SparkSession, target: SparkTable, schema: T.StructType, batch: T.StructType
) -> bool:
    """Widen the columns of ``target`` (by name or path; ``schema`` its columns) that
    ``batch`` holds wider, as the module says; True when it committed a change. Spark SQL and
    the DataFrame API only (I14)."""
    theirs = {f.name: f.dataType for f in batch.fields}
    wider = {
        f.name: w
        for f in schema.fields
        if f.name in theirs and (w := wider_spark_type(f.dataType, theirs[f.name])) is not None
    }
    if not wider:
        return False
    ref = target.sql_name()
    widening = target.properties().get("delta.enableTypeWidening", "false") == "true"
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
