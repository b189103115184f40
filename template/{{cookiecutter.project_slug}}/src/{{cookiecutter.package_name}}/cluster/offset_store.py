"""Reads the pipeline's newest stored offsets back from the Delta log (delta-spark)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import SparkSession

from ..offsets import (
    StoredOffsets,
    fence_app_id,
    newest_stored_paged,
    stored_from_transactions,
)
from .commit_copies import CommitCopies


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
    copies: CommitCopies | None = None,
) -> StoredOffsets | None:
    """Offsets of the newest commit tagged with ``pipeline_id`` in ``table``'s log; when log
    cleanup removed every such commit, the copy of the commit the fence txn names (see
    :mod:`.commit_copies`), else what the table's txn actions keep for ``partitions()``; None
    when the pipeline never committed to the table. Txn actions are read with delta-rs:
    delta-spark's Python API has no reader of them."""
    stored = newest_stored_paged(history_reader(table), pipeline_id)
    if stored is not None or table_uri is None:
        return stored
    from deltalake import DeltaTable

    txns = DeltaTable(table_uri)
    seq = txns.transaction_version(fence_app_id(pipeline_id))
    if seq is None:
        return None
    kept = copies.read(seq) if copies is not None else None
    if kept is not None or partitions is None:
        return kept
    return stored_from_transactions(txns.transaction_version, pipeline_id, partitions())


class DeltaSparkOffsetStore:
    """Same tag and skipping rules as the delta-rs store: commits without this pipeline's tag
    (other writers, OPTIMIZE, VACUUM) are passed over."""

    def __init__(self, spark: SparkSession, table_uri: str, pipeline_id: str) -> None:
        self.spark = spark
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.copies = CommitCopies(spark, table_uri, pipeline_id)

    def read(
        self, partitions: Callable[[], Mapping[str, list[int]]] | None = None
    ) -> StoredOffsets | None:
        table = delta_table(self.spark, self.table_uri)
        if table is None:
            return None
        stored = newest_stored_in(table, self.pipeline_id, self.table_uri, partitions, self.copies)
        if stored is not None:
            # A crash between a commit and its copy left none: keep it now, while the log
            # still holds the commit.
            self.copies.ensure(stored)
        return stored
