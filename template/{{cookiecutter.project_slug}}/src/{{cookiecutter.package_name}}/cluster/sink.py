"""Delta sink on delta-spark: one commit per micro-batch holding data, txn and end offsets.

Needs the delta-spark jars (built into Databricks Runtime; elsewhere ``spark-submit --packages
io.delta:delta-spark_2.13:<version>`` with Delta's session extension and catalog).

- append: ``DataFrameWriter`` options ``txnAppId``/``txnVersion`` and ``userMetadata``;
- upsert: MERGE, which takes no writer options, so the same three values go through the
  session confs ``spark.databricks.delta.write.txnAppId``/``txnVersion`` and
  ``spark.databricks.delta.commitInfo.userMetadata``, set for that one command and restored
  afterwards even when it fails (:func:`delta_txn_confs`).

Idempotence (I2): delta-spark itself skips a write whose ``txnVersion`` is ``<=`` the one
recorded for ``txnAppId``, atomically with the commit. The sink also checks first, from the
pipeline's newest commit in the history, so that a replay reports "replayed" and is not
mistaken for a fencing violation.

Fencing (I6): the stored offsets must equal the batch's start, checked on the history just
before the write. Two runs of one checkpoint share the appId, so delta-spark's conflict
checker rejects the second of two concurrent commits (ConcurrentTransactionException) or skips
it as a replay: atomic. Two runs of one pipeline on *different* checkpoints have different
appIds; delta-spark lets two blind appends both commit, so between them only the check-then-
write window is unfenced (the delta-rs sink, which commits without retry, has no such window).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame, SparkSession

from ..engine import (
    Materialized,
    Rows,
    SinkResult,
    WriteMode,
    check_contiguous,
    split_dead_letters_df,
)
from ..offsets import BatchCommit, Offsets
from .offset_store import delta_table, newest_stored_in

log = logging.getLogger(__name__)

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


def append_options(commit: BatchCommit) -> dict[str, str]:
    """Writer options that make one append idempotent and carry its end offsets."""
    return {
        "txnAppId": commit.app_id,
        "txnVersion": str(commit.batch_id),
        "userMetadata": commit.user_metadata(),
    }


@contextmanager
def delta_txn_confs(spark: SparkSession, commit: BatchCommit) -> Iterator[None]:
    """Session confs for a DML command (MERGE) that has no writer options: set for the block,
    then restored to what they were (unset when they were unset), also on failure, so no later
    write of the session is mistaken for this batch."""
    values = {
        TXN_APP_ID_CONF: commit.app_id,
        TXN_VERSION_CONF: str(commit.batch_id),
        USER_METADATA_CONF: commit.user_metadata(),
    }
    before = {key: spark.conf.get(key, None) for key in values}
    try:
        for key, value in values.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


class DeltaSparkSink:
    def __init__(
        self,
        spark: SparkSession,
        table_uri: str,
        pipeline_id: str,
        mode: WriteMode | None = None,
    ) -> None:
        self.spark = spark
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.mode = mode or WriteMode()

    def materialize(self, out: DataFrame) -> Materialized:
        """The batch stays distributed: cached once, dead letters counted and split in Spark."""
        return split_dead_letters_df(out)

    def _frame(self, rows: Rows) -> DataFrame:
        return rows if isinstance(rows, DataFrame) else self.spark.createDataFrame(rows)

    def append_unprotected(self, rows: Rows) -> SinkResult:
        frame = self._frame(rows)
        count = frame.count()
        frame.write.format("delta").mode("append").save(self.table_uri)
        return SinkResult(written=True, rows=count, delta_version=None)

    def commit_batch(
        self, rows: Rows, commit: BatchCommit, start: Offsets | None = None
    ) -> SinkResult:
        # One handle for the checks and the write; its history() reads the log as it is now.
        table = delta_table(self.spark, self.table_uri)
        stored = newest_stored_in(table, self.pipeline_id) if table is not None else None
        if (
            stored is not None
            and stored.app_id == commit.app_id
            and stored.batch_id >= commit.batch_id
        ):
            log.info(
                "batch %d of %s is already in the table (Delta version %d): replay skipped",
                commit.batch_id,
                commit.app_id,
                stored.delta_version,
            )
            return SinkResult(written=False, rows=0, delta_version=None)
        check_contiguous(stored, start, commit)
        frame = self._frame(rows)
        count = frame.count()
        if self.mode.kind == "upsert" and table is not None and count > 0:
            merge = (
                table.alias("t")
                .merge(frame.alias("s"), self.mode.merge_predicate())
                .whenMatchedUpdateAll(condition=self.mode.update_predicate())
                .whenNotMatchedInsertAll()
            )
            with delta_txn_confs(self.spark, commit):
                merge.execute()
        else:
            # An append; for an upsert also its first batch and an empty one, which must still
            # commit its offsets.
            frame.write.format("delta").mode("append").options(**append_options(commit)).save(
                self.table_uri
            )
        written = table if table is not None else delta_table(self.spark, self.table_uri)
        after = newest_stored_in(written, self.pipeline_id) if written is not None else None
        if after is None or (after.app_id, after.batch_id) != (commit.app_id, commit.batch_id):
            # delta-spark skipped the write: a concurrent run of this checkpoint got there first.
            log.info(
                "batch %d of %s was committed by a concurrent run", commit.batch_id, commit.app_id
            )
            return SinkResult(written=False, rows=0, delta_version=None)
        return SinkResult(written=True, rows=count, delta_version=after.delta_version)
