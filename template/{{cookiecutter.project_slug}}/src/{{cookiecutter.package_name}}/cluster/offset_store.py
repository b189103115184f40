"""The pipeline's stored offsets in a table read with delta-spark (the delta-spark sink's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyspark.sql import SparkSession

from ..offsets import StoredOffsets
from ..stored_offsets import read_stored
from .commit_copies import CommitCopies


def delta_table(spark: SparkSession, table_uri: str) -> Any | None:
    """``delta.tables.DeltaTable`` at ``table_uri``, or None when there is no Delta table."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, table_uri):
        return None
    return DeltaTable.forPath(spark, table_uri)


class DeltaSparkLog:
    """A table's log as :func:`..stored_offsets.read_stored` reads it: the history through
    delta-spark (a Spark job), txn actions through delta-rs (delta-spark's Python API has no
    reader of them; opened only when asked), the commit copies through Spark's file system."""

    def __init__(
        self,
        table: Any,
        table_uri: str,
        copies: CommitCopies | None,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.table = table
        self.table_uri = table_uri
        self.copies = copies
        self.storage_options = dict(storage_options or {})
        self._txns: Any | None = None

    def history(self, limit: int | None) -> Sequence[Mapping[str, object]]:
        frame = self.table.history(limit) if limit is not None else self.table.history()
        columns = ["version", "timestamp", "operation", "operationParameters", "userMetadata"]
        rows = [row.asDict() for row in frame.select(*columns).collect()]
        for row in rows:
            # As delta-rs gives it: epoch milliseconds.
            stamp = row.get("timestamp")
            row["timestamp"] = int(stamp.timestamp() * 1000) if stamp is not None else None
        return rows

    def transaction_version(self, app_id: str) -> int | None:
        if self._txns is None:
            from deltalake import DeltaTable

            self._txns = DeltaTable(self.table_uri, storage_options=self.storage_options or None)
        return self._txns.transaction_version(app_id)

    def commit_copy(self, seq: int) -> StoredOffsets | None:
        return self.copies.read(seq) if self.copies is not None else None


def newest_stored_in(
    table: Any,
    pipeline_id: str,
    table_uri: str,
    partitions: Callable[[], Mapping[str, list[int]]] | None = None,
    copies: CommitCopies | None = None,
    storage_options: dict[str, str] | None = None,
) -> StoredOffsets | None:
    """This pipeline's stored offsets in ``table`` (see :mod:`..stored_offsets`)."""
    log = DeltaSparkLog(table, table_uri, copies, storage_options)
    return read_stored(log, pipeline_id, partitions)


class DeltaSparkOffsetStore:
    """Same tag and skipping rules as the delta-rs store: commits without this pipeline's tag
    (other writers, OPTIMIZE, VACUUM) are passed over."""

    def __init__(
        self,
        spark: SparkSession,
        table_uri: str,
        pipeline_id: str,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.spark = spark
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.storage_options = dict(storage_options or {})
        self.copies = CommitCopies(spark, table_uri, pipeline_id)

    def read(
        self, partitions: Callable[[], Mapping[str, list[int]]] | None = None
    ) -> StoredOffsets | None:
        table = delta_table(self.spark, self.table_uri)
        if table is None:
            return None
        stored = newest_stored_in(
            table, self.pipeline_id, self.table_uri, partitions, self.copies, self.storage_options
        )
        if stored is not None:
            # A crash between a commit and its copy left none: keep it now, while the log
            # still holds the commit.
            self.copies.ensure(stored)
        return stored
