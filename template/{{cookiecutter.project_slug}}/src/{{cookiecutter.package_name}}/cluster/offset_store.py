"""Reads the pipeline's newest stored offsets back from the Delta log (delta-spark)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from ..offsets import StoredOffsets, newest_stored_paged


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


def newest_stored_in(table: Any, pipeline_id: str) -> StoredOffsets | None:
    """Offsets of the newest commit tagged with ``pipeline_id`` in ``table``'s log, or None."""
    return newest_stored_paged(history_reader(table), pipeline_id)


class DeltaSparkOffsetStore:
    """Same tag and skipping rules as the delta-rs store: commits without this pipeline's tag
    (other writers, OPTIMIZE, VACUUM) are passed over."""

    def __init__(self, spark: SparkSession, table_uri: str, pipeline_id: str) -> None:
        self.spark = spark
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id

    def read(self) -> StoredOffsets | None:
        table = delta_table(self.spark, self.table_uri)
        return None if table is None else newest_stored_in(table, self.pipeline_id)
