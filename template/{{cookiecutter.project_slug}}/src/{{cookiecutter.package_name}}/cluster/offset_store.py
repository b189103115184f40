"""Reads the pipeline's newest stored offsets back from the Delta log (delta-spark)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import SparkSession

from ..offsets import StoredOffsets, newest_stored_paged, stored_from_transactions


def delta_table(spark: SparkSession, table_uri: str) -> Any | None:
    """``delta.tables.DeltaTable`` at ``table_uri``, or None when there is no Delta table."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, table_uri):
        return None
    return DeltaTable.forPath(spark, table_uri)


def history_reader(table: Any) -> Any:
    """``limit -> [{"version": ..., "userMetadata": ...}, ...]`` newest first, as the shared
    paging in :func:`..offsets.newest_stored_paged` expects."""

    def read(limit: int | None) -> list[dict[str, object]]:
        frame = table.history(limit) if limit is not None else table.history()
        return [row.asDict() for row in frame.select("version", "userMetadata").collect()]

    return read


def newest_stored_in(
    table: Any,
    pipeline_id: str,
    table_uri: str | None = None,
    partitions: Callable[[], Mapping[str, list[int]]] | None = None,
) -> StoredOffsets | None:
    """Offsets of the newest commit tagged with ``pipeline_id`` in ``table``'s log; when log
    cleanup removed every such commit, what the table's txn actions keep (read with delta-rs:
    delta-spark's Python API has no reader of txn actions); None when the pipeline never
    committed to the table."""
    stored = newest_stored_paged(history_reader(table), pipeline_id)
    if stored is not None or partitions is None or table_uri is None:
        return stored
    from deltalake import DeltaTable

    txns = DeltaTable(table_uri)
    return stored_from_transactions(txns.transaction_version, pipeline_id, partitions())


class DeltaSparkOffsetStore:
    """Same tag and skipping rules as the delta-rs store: commits without this pipeline's tag
    (other writers, OPTIMIZE, VACUUM) are passed over."""

    def __init__(self, spark: SparkSession, table_uri: str, pipeline_id: str) -> None:
        self.spark = spark
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id

    def read(
        self, partitions: Callable[[], Mapping[str, list[int]]] | None = None
    ) -> StoredOffsets | None:
        table = delta_table(self.spark, self.table_uri)
        if table is None:
            return None
        return newest_stored_in(table, self.pipeline_id, self.table_uri, partitions)
