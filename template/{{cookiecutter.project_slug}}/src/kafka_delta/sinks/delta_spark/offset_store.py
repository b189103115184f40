"""The pipeline's stored offsets in a table written with delta-spark (the delta-spark sink's).

The sink reads the log twice a batch (its check, then the read-back that proves the commit is this
batch's) and the offset store at every start. Spark's own reader of the history
(``DeltaTable.history()``) costs a query and a snapshot update each time; delta-rs reads the same
log directly, without Spark: a snapshot from the last Delta checkpoint and the commits after it (5-7
ms here for a local table). :class:`TableLogReader` reads through delta-rs, and through Spark only a
table delta-rs cannot open (a reader feature it lacks, a file system it cannot reach), saying so
once. Either way :func:`kafka_delta.offsets.stored.read_stored` reads the same commits, so the
guarantees do not depend on which engine read them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from pyspark.sql import SparkSession

from kafka_delta.offsets.model import StoredOffsets
from kafka_delta.offsets.stored import TableLog, newest_commit_version, read_stored
from kafka_delta.sinks.delta_rs.offset_store import DeltaRsLog, open_table
from kafka_delta.sinks.delta_spark.commit_copies import CommitCopies

log = logging.getLogger(__name__)


def delta_table(spark: SparkSession, table_uri: str) -> Any | None:
    """``delta.tables.DeltaTable`` at ``table_uri``, or None when there is no Delta table."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, table_uri):
        return None
    return DeltaTable.forPath(spark, table_uri)


class DeltaSparkLog:
    """A table's log as :func:`kafka_delta.offsets.stored.read_stored` reads it through Spark, for a
    table delta-rs cannot open: the history through delta-spark (a query), txn actions through
    delta-rs (delta-spark's Python API has no reader of them; opened only when asked), the
    commit copies through Spark's file system."""

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

    def row_positions(
        self, topics: Collection[str] | None = None
    ) -> dict[tuple[str, int], int] | None:
        from pyspark.sql import functions as F

        frame = self.table.toDF()
        if not {"topic", "partition", "offset"} <= set(frame.columns):
            return None
        if topics is not None:
            frame = frame.filter(F.col("topic").isin(sorted(topics)))
        rows = frame.groupBy("topic", "partition").agg(F.max("offset").alias("highest")).collect()
        return {
            (r["topic"], int(r["partition"])): int(r["highest"])
            for r in rows
            if r["topic"] is not None and r["partition"] is not None and r["highest"] is not None
        }


class TableLogReader:
    """One table's log as the delta-spark sink and its offset store read it (see the module
    docstring): a fresh delta-rs snapshot at each read (as the delta-rs sink reads its table:
    nothing carried over from a table replaced since), or Spark's history when delta-rs
    cannot open the table."""

    def __init__(
        self,
        spark: SparkSession,
        table_uri: str,
        copies: CommitCopies,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.spark = spark
        self.table_uri = table_uri
        self.copies = copies
        self.storage_options = dict(storage_options or {})
        # Why delta-rs cannot read this table, once it failed to: Spark reads it from then on.
        self.spark_only: str | None = None

    def read(self) -> TableLog | None:
        """The log as it is now; None when there is no Delta table at the location."""
        if self.spark_only is None:
            try:
                snapshot = open_table(self.table_uri, self.storage_options)
            except Exception as exc:  # a reader feature, a scheme or a credential delta-rs lacks
                self.spark_only = f"{type(exc).__name__}: {exc}".splitlines()[0]
                log.warning(
                    "delta-rs cannot read the log of %s (%s): Spark reads it, one query a read",
                    self.table_uri,
                    self.spark_only,
                )
            else:
                return None if snapshot is None else DeltaRsLog(snapshot, self.copies.read)
        table = delta_table(self.spark, self.table_uri)
        if table is None:
            return None
        return DeltaSparkLog(table, self.table_uri, self.copies, self.storage_options)


def newest_stored_in(
    reader: TableLogReader,
    pipeline_id: str,
    partitions: Callable[[], Mapping[str, list[int]]] | None = None,
) -> StoredOffsets | None:
    """This pipeline's stored offsets in the table ``reader`` reads (see
    :mod:`kafka_delta.offsets.stored`); None when there is no table or no commit of the pipeline."""
    table_log = reader.read()
    return None if table_log is None else read_stored(table_log, pipeline_id, partitions)


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
        self.reader = TableLogReader(spark, table_uri, self.copies, self.storage_options)

    def read(
        self, partitions: Callable[[], Mapping[str, list[int]]] | None = None
    ) -> StoredOffsets | None:
        stored = newest_stored_in(self.reader, self.pipeline_id, partitions)
        if stored is not None:
            # A crash between a commit and its copy left none: keep it now, while the log
            # still holds the commit.
            self.copies.ensure(stored)
        return stored

    def commit_version(self, app_id: str) -> int | None:
        """The Delta version of the newest commit ``app_id`` (one checkpoint) made here."""
        table_log = self.reader.read()
        if table_log is None:
            return None
        return newest_commit_version(table_log.history, self.pipeline_id, app_id)
