"""The upsert rule: a MERGE sees each key at most once per batch."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from kafka_delta.contract import DEAD_LETTER_COLUMN


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
