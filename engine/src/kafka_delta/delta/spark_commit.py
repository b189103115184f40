"""A pipeline's commit as delta-spark carries it, one rule for the delta-spark sink and the
``offsets reset`` command on its table: the fence txn and the record of an append (writer
options, :func:`append_options`), the same three values for a MERGE, which takes no writer
options (session confs set for that one command and restored afterwards even when it fails,
:func:`delta_txn_confs`), and delta-spark's refusals of a commit that lost a race to another
writer (:func:`lost_race`).

delta-spark's writer carries ONE txn per commit, and it is the pipeline's fence
``txn(<pipeline>:fence, seq)`` with ``seq`` = the stored commit's seq + 1 (see
:mod:`kafka_delta.offsets.model`). Through Spark alone (I14): options and session confs, no JVM.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

from kafka_delta.offsets.model import BatchCommit, fence_app_id

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
AUTO_MERGE_CONF = "spark.databricks.delta.schema.autoMerge.enabled"


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
# (ConcurrentTransactionException and its kin), and two runs creating a table by path at once
# (the second finds the first's protocol and metadata: ProtocolChangedException "multiple
# writers are writing to an empty directory", MetadataChangedException). Each is a lost race,
# judged like any other by reading the table back: the loser is fenced, or finds its batch in.
LOST_RACE = (
    "ConcurrentTransaction",
    "CONCURRENT_TRANSACTION",
    "ConcurrentAppend",
    "CONCURRENT_APPEND",
    "DELTA_PROTOCOL_CHANGED",
    "ProtocolChangedException",
    "DELTA_METADATA_CHANGED",
    "MetadataChangedException",
)


def lost_race(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(mark in text for mark in LOST_RACE)
