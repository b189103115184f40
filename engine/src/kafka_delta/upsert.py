"""The upsert rule: a MERGE sees each key at most once per batch, its latest change, and
applies it: a row whose ``_op`` (:data:`~kafka_delta.contract.OP_COLUMN`) is ``d`` deletes the
row of its key, any other upserts it (:func:`merge_clauses`, the one rule both sinks use).

One order decides which change of a key is the latest: ``delta.order_by`` when set, then the
Kafka position. For change data capture that is the source's order: Debezium keys each record
by the row's primary key, so a row's changes share a partition in the order the database
committed them, and the later offset is the later change. A delete followed by an insert of
the same key in one batch ends as the insert; an insert followed by a delete, as nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from kafka_delta.contract import DEAD_LETTER_COLUMN, OP_COLUMN

if TYPE_CHECKING:
    from kafka_delta.engine import WriteMode

DELETE_OP = "d"


@dataclass(frozen=True)
class MergeClauses:
    """A batch's MERGE on the sink's ``t`` (target) and ``s`` (source) aliases: WHEN MATCHED
    AND ``delete`` THEN DELETE (None: the batch deletes nothing); WHEN MATCHED AND ``update``
    THEN UPDATE every column but ``except_cols``; WHEN NOT MATCHED AND ``insert`` THEN INSERT
    them. A None predicate is no condition."""

    delete: str | None
    update: str | None
    insert: str | None
    except_cols: tuple[str, ...]


def merge_clauses(mode: WriteMode, columns: Iterable[str]) -> MergeClauses:
    """The MERGE of a batch with ``columns``: with ``_op``, a ``d`` deletes the matched row and
    inserts nothing, and ``_op`` is never written to the table. With ``order_by``, a stored row
    is only replaced or deleted by a change at least as new (a delete without an ``order_by``
    value, a tombstone, deletes whatever is stored)."""
    newer = mode.update_predicate()
    if OP_COLUMN not in set(columns):
        return MergeClauses(None, newer, None, ())
    op = f"s.`{OP_COLUMN}`"
    keep = f"{op} IS DISTINCT FROM '{DELETE_OP}'"
    delete = f"{op} = '{DELETE_OP}'"
    if mode.order_by is not None:
        delete += f" AND (s.`{mode.order_by}` IS NULL OR {newer})"
    return MergeClauses(
        delete=delete,
        update=keep if newer is None else f"{keep} AND ({newer})",
        insert=keep,
        except_cols=(OP_COLUMN,),
    )


def upserted_arrow(rows: pa.Table) -> pa.Table:
    """The rows an upsert batch writes to a table that holds none of its keys (its first
    batch): the deletes are no-ops, and ``_op`` is not a column of the table."""
    if OP_COLUMN not in rows.column_names:
        return rows
    op = rows.column(OP_COLUMN)
    keep = pc.fill_null(pc.not_equal(op, DELETE_OP), True)
    return rows.filter(keep).drop_columns([OP_COLUMN])


def upserted_frame(rows: DataFrame) -> DataFrame:
    """:func:`upserted_arrow` for a DataFrame."""
    if OP_COLUMN not in rows.columns:
        return rows
    return rows.filter(~F.col(OP_COLUMN).eqNullSafe(DELETE_OP)).drop(OP_COLUMN)


def latest_per_key(keys: tuple[str, ...], order_by: str | None) -> Callable[[DataFrame], DataFrame]:
    """Factory: keep, per key, only the newest row of the batch, newest by ``order_by`` (when
    given) and then by Kafka position; dead-letter rows (``_error`` set) all pass through.

    A MERGE must see each key at most once per batch (delta-spark refuses several source rows
    matching one target row), and within a partition the later record is the newer one.

    >>> df.transform(latest_per_key(("id",), "event_time"))  # doctest: +SKIP
    """

    def _latest(df: DataFrame) -> DataFrame:
        missing = [k for k in (*keys, *([order_by] if order_by else [])) if k not in df.columns]
        if missing:
            raise ValueError(
                f"upsert columns {missing} are not in the transform's output {df.columns}"
            )
        # A row without its key cannot be merged: it is a dead letter, not a silent insert.
        error = F.col(DEAD_LETTER_COLUMN) if DEAD_LETTER_COLUMN in df.columns else F.lit(None)
        for key in keys:
            error = F.when(
                error.isNull() & F.col(key).isNull(), F.lit(f"merge key {key!r} is null")
            ).otherwise(error)
        df = df.withColumn(DEAD_LETTER_COLUMN, error.cast("string"))
        order = [F.col(order_by).desc_nulls_last()] if order_by else []
        order += [F.col(c).desc() for c in ("offset", "partition") if c in df.columns]
        # Ranked among good rows only: a dead letter never displaces a good row of its key.
        good = F.col(DEAD_LETTER_COLUMN).isNull()
        rank = F.row_number().over(Window.partitionBy(good, *keys).orderBy(*order))
        # Dead letters keep every row: each bad record must reach the dead-letter table.
        # (Spark refuses a window function inside a filter, hence the helper column.)
        keep = ~good | (rank == 1)
        return df.withColumn("_keep", keep).filter("_keep").drop("_keep")

    return _latest
