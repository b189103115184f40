"""A pipeline's commit as delta-spark carries it, one rule for the delta-spark sink and the
``offsets reset`` command on its table: the fence txn and the record of an append (writer
options, :func:`append_options`), the same three values for a MERGE, which takes no writer
options (session confs set for that one command and restored afterwards even when it fails,
:func:`delta_txn_confs`), delta-spark's refusals of a commit that lost a race to another
writer (:func:`lost_race`), and whether a write committed, told by the session that ran it
(:class:`CommitWatch`).

delta-spark's writer carries ONE txn per commit, and it is the pipeline's fence
``txn(<pipeline>:fence, seq)`` with ``seq`` = the stored commit's seq + 1 (see
:mod:`kafka_delta.offsets.model`). Through Spark alone (I14): options and session confs, no JVM.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame, SparkSession

from kafka_delta.offsets.model import BatchCommit, fence_app_id

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
AUTO_MERGE_CONF = "spark.databricks.delta.schema.autoMerge.enabled"
# Set by delta-spark, in the session that ran it, to the version each commit made (of any table).
LAST_COMMIT_CONF = "spark.databricks.delta.lastCommitVersionInSession"
# How long a commit's observed row count is waited for (CommitWatch._observed_rows).
OBSERVED_WAIT_S = 30.0


def append_options(commit: BatchCommit) -> dict[str, str]:
    """Writer options that fence one append (the pipeline's fence txn at ``commit.seq``) and
    carry its identity and end offsets."""
    return {
        "txnAppId": fence_app_id(commit.pipeline_id),
        "txnVersion": str(commit.seq),
        "userMetadata": commit.user_metadata(),
    }


@contextmanager
def delta_txn_confs(
    spark: SparkSession, commit: BatchCommit, add_columns: bool = False
) -> Iterator[None]:
    """Session confs for a DML command (MERGE) that has no writer options: set for the block,
    then restored to what they were (unset when they were unset), also on failure, so no later
    write of the session is mistaken for this batch. ``add_columns``: the MERGE adds the
    source's new columns to the table (Delta's schema auto-merge), in the same commit."""
    values = {
        TXN_APP_ID_CONF: fence_app_id(commit.pipeline_id),
        TXN_VERSION_CONF: str(commit.seq),
        USER_METADATA_CONF: commit.user_metadata(),
    }
    if add_columns:
        values[AUTO_MERGE_CONF] = "true"
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


# delta-spark's refusals of a commit that lost a race to another writer: a concurrent commit
# (ConcurrentTransactionException and its kin: Delta 4.4 refuses a MERGE that a compaction
# overtook with ConcurrentAppendException, Delta's conflict rules elsewhere with
# ConcurrentDeleteReadException), and two runs creating a table by path at once (the second
# finds the first's protocol and metadata: ProtocolChangedException "multiple writers are
# writing to an empty directory", MetadataChangedException). Each is a lost race, judged like
# any other by reading the table back: the loser is fenced, or finds its batch in, or, where
# the pipeline's newest commit is unchanged (the winner was no run of it), writes again.
LOST_RACE = (
    "ConcurrentTransaction",
    "CONCURRENT_TRANSACTION",
    "ConcurrentAppend",
    "CONCURRENT_APPEND",
    "ConcurrentDeleteRead",
    "CONCURRENT_DELETE_READ",
    "ConcurrentDeleteDelete",
    "CONCURRENT_DELETE_DELETE",
    "ConcurrentWrite",
    "CONCURRENT_WRITE",
    "DELTA_PROTOCOL_CHANGED",
    "ProtocolChangedException",
    "DELTA_METADATA_CHANGED",
    "MetadataChangedException",
)


def lost_race(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(mark in text for mark in LOST_RACE)


class CommitWatch:
    """Whether one write of ``frame`` committed, and at which version, told by the session that
    ran it instead of by reading the table's log back (a Spark job of its own, whose tasks open
    every commit file of the page read).

    delta-spark sets :data:`LAST_COMMIT_CONF` in the session that ran a commit, after the commit
    landed. The watch unsets it before the write; set after it, the write committed, at that
    version. Unset, the write committed nothing: delta-spark skipped it (its fence ``seq`` was
    no longer above the stored one) and the caller reads the log back to learn why. The rows
    come from an observation on the written frame (``count_rows``), collected by the write's own
    job: delta-spark writes the data files before it commits, so a commit that landed ran it.

    The session must be the batch's alone between the write and :meth:`committed`: inside
    ``foreachBatch`` on a classic session it is the streaming query's own (Spark gives each query
    a session of its own), and the engine writes a batch's tables one after the other. The sink
    watches only there (:meth:`applies`); under Spark Connect the batch runs in the client's
    session, which the run's other threads share (its compaction), so the log is read back."""

    def __init__(self, frame: DataFrame, count_rows: bool) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        self.session = frame.sparkSession
        self.observation = Observation() if count_rows else None
        self.frame = (
            frame
            if self.observation is None
            else frame.observe(self.observation, F.count(F.lit(1)).alias("rows"))
        )
        self.session.conf.unset(LAST_COMMIT_CONF)

    @staticmethod
    def applies(frame: DataFrame) -> bool:
        from kafka_delta.runtime.spark_session import is_connect

        return not is_connect(frame.sparkSession)

    def committed(self) -> tuple[int, int | None] | None:
        """(the version the write committed, its rows when counted); None when it committed
        nothing, or when its rows are not observed within :data:`OBSERVED_WAIT_S`."""
        version = self.session.conf.get(LAST_COMMIT_CONF, None)
        if version is None:
            return None
        if self.observation is None:
            return int(version), None
        rows = self._observed_rows()
        return None if rows is None else (int(version), rows)

    def _observed_rows(self) -> int | None:
        """The observed row count. Spark hands it over through its listener bus just after
        the write's job, and ``Observation.get`` waits for it without a bound, so it is taken
        in a thread of its own, waited for :data:`OBSERVED_WAIT_S`: a commit that was not this
        write's (another writer in the session, which the engine never is) leaves the
        observation unset, and the caller reads the log back instead of waiting forever."""
        assert self.observation is not None
        observation, got = self.observation, []
        thread = threading.Thread(
            target=lambda: got.append(int(observation.get["rows"])),
            name="commit-watch",
            daemon=True,
        )
        thread.start()
        thread.join(OBSERVED_WAIT_S)
        return got[0] if got else None
