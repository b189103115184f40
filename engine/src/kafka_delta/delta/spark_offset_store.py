"""The pipeline's stored offsets in a table written with delta-spark, read through Spark alone.

The sink reads the log before each batch (its check), again after it only when the batch's
session cannot tell that its commit landed (the read-back that proves the commit is this
batch's, :class:`kafka_delta.delta.spark_commit.CommitWatch`), and the offset store at every
start, all through :class:`DeltaSparkLog`: the
table's history (``DESCRIBE HISTORY``), its rows, and the commit copies beside the
checkpoint. :func:`kafka_delta.offsets.stored.read_stored` reads the same commits it reads on a
delta-rs table, so the guarantees do not depend on the engine.

No txn reader (I14)
-------------------
Spark has no reader of a table's ``txn`` actions (delta-rs's ``transaction_version``; delta-spark
reads them only inside its own write). The delta-spark side needs none:

- **I2, replay.** A batch is a replay when the pipeline's newest commit in effect, read from
  the history, names its ``(app_id, batch_id)`` (or a later batch of the same app id): the sink
  writes nothing. A replay the history cannot show yet (a run of the same checkpoint that
  committed between the check and the write) carries a fence ``seq`` that run already used, and
  delta-spark skips a write whose ``txnVersion`` is not above the stored one, atomically, in the
  write's own transaction (``DeltaCommand.hasBeenExecuted``); the read-back then finds the
  other run's commit of the same batch.
- **I3, a new checkpoint.** Its app id is new (pipeline id + query id), and its commits are
  found by the pipeline's tag, never by app id; its first commit takes ``seq`` past the
  pipeline's newest, so Delta never takes it for an old one.
- **I6, fencing.** Every commit of the pipeline writes the one fence txn
  ``(<pipeline>:fence, seq)``, ``seq`` = the stored commit's + 1. Delta enforces it on write:
  two runs committing on top of the same stored offsets write the same ``seq``; the second is
  rejected (``ConcurrentTransactionException``) or skipped (its ``seq`` is no longer above the
  stored one). Neither lands twice, and the read-back names the loser's fate.
- **The fence's value where the history cannot show it** (a RESTORE undid the pipeline's
  newest commits; log cleanup removed them all): Delta skips a ``seq`` at or below the stored
  fence, so the next ``seq`` must clear it. Every commit of the pipeline takes ``seq`` =
  (the highest ``seq`` it knows of) + 1 and lands at a Delta version of its own, so no fence ever
  exceeds the version of the commit that wrote it + 1 (the first is 1, at version >= 0; each
  next at least one version later). :meth:`DeltaSparkLog.transaction_version` therefore answers
  for the fence with the highest ``seq`` of the pipeline's commits in the history when the
  history is complete (it starts at version 0), and with the bound ``newest version + 1`` when
  log cleanup shortened it: never below the stored fence, which is all a write needs. The fence
  numbers then jump; they only ever order the pipeline's commits.
- **I11, one truth.** After log cleanup removed every commit of the pipeline, the offsets are
  recomputed from the table's rows (:func:`kafka_delta.offsets.stored.from_the_rows`); the
  newest commit copy lends its topic ids and the offsets it names past the rows, never the
  offsets in effect. The per-partition offset txns and topic-id txns of the delta-rs sink are
  hints this side does not read (it writes none).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence

from pyspark.sql import SparkSession

from kafka_delta.delta.commit_copies import CommitCopies
from kafka_delta.delta.spark_table import SparkTable
from kafka_delta.offsets.model import StoredOffsets, fence_app_id, parse_user_metadata
from kafka_delta.offsets.stored import (
    HISTORY_PAGES,
    TableLog,
    newest_commit_version,
    read_stored,
)

log = logging.getLogger(__name__)


class DeltaSparkLog:
    """A table's log as :func:`kafka_delta.offsets.stored.read_stored` reads it, through Spark
    (see the module docstring)."""

    def __init__(
        self,
        table: SparkTable,
        pipeline_id: str,
        copies: CommitCopies | None,
        pages: Mapping[int | None, Sequence[Mapping[str, object]]] | None = None,
    ) -> None:
        self.table = table
        self.pipeline_id = pipeline_id
        self.copies = copies
        # The history pages read so far, by limit: one object is the log as it was when read,
        # and every reading of delta-spark's history is a Spark job (DeltaHistoryManager reads
        # the commit files in one), so a page is read once and serves every smaller one.
        self._pages: dict[int | None, Sequence[Mapping[str, object]]] = dict(pages or {})

    def read_so_far(self) -> Sequence[Mapping[str, object]]:
        """The longest page of history read so far (newest first), without reading any."""
        return max(self._pages.values(), key=len, default=())

    def history(self, limit: int | None) -> Sequence[Mapping[str, object]]:
        for read, page in self._pages.items():
            complete = read is None or len(page) < read
            if complete or (limit is not None and read >= limit):
                return page if limit is None else page[:limit]
        page = self.table.history(limit)
        self._pages[limit] = page
        return page

    def transaction_version(self, app_id: str) -> int | None:
        """For the pipeline's fence: a ``seq`` no lower than the one Delta stores (see the module
        docstring); None when the complete history holds no commit of the pipeline. For any
        other app id (the delta-rs sink's offset and topic-id txns): None, no hint."""
        if app_id != fence_app_id(self.pipeline_id):
            return None
        history = self.history(None)
        if not history:
            return None
        seqs = [
            record.seq
            for entry in history
            if (record := parse_user_metadata(entry.get("userMetadata"), self.pipeline_id))
        ]
        versions = [int(e["version"]) for e in history]  # type: ignore[call-overload]
        if min(versions) == 0:
            return max(seqs) if seqs else None
        return max([*seqs, max(versions) + 1])

    def commit_copy(self, seq: int) -> StoredOffsets | None:
        return self.copies.read(seq) if self.copies is not None else None

    def row_positions(
        self, topics: Collection[str] | None = None
    ) -> dict[tuple[str, int], int] | None:
        from pyspark.sql import functions as F

        frame = self.table.frame()
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
    """One table's log as the delta-spark sink and its offset store read it: the table as it
    is at each read (nothing carried over from a table replaced since)."""

    def __init__(self, table: SparkTable, pipeline_id: str, copies: CommitCopies | None) -> None:
        self.table = table
        self.pipeline_id = pipeline_id
        self.copies = copies

    def read(self) -> TableLog | None:
        """The log as it is now, its newest page of history read; None when the table does
        not exist. One Spark job (the history's) for a table by path; by name, the catalog
        first tells whether the table and its schema exist."""
        if self.table.name is not None and not self.table.exists():
            return None
        first = self.table.history(HISTORY_PAGES[0])
        if not first:  # by path: no Delta table there
            return None
        return DeltaSparkLog(
            self.table, self.pipeline_id, self.copies, pages={HISTORY_PAGES[0]: first}
        )


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
        *,
        checkpoint: str,
    ) -> None:
        self.spark = spark
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.copies = CommitCopies(table_uri, checkpoint, pipeline_id, storage_options)
        self.reader = TableLogReader(SparkTable(spark, table_uri), pipeline_id, self.copies)

    def read(
        self, partitions: Callable[[], Mapping[str, list[int]]] | None = None
    ) -> StoredOffsets | None:
        stored = newest_stored_in(self.reader, self.pipeline_id, partitions)
        if stored is not None:
            # A crash between a commit and its copy left none: keep it now, while the log
            # still holds the commit. A hint: a side folder that cannot be written is said,
            # never a failed start.
            try:
                self.copies.ensure(stored)
            except Exception as exc:
                log.warning("cannot keep the copy of commit %d: %s", stored.seq, exc)
        return stored

    def commit_version(self, app_id: str) -> int | None:
        """The Delta version of the newest commit ``app_id`` (one checkpoint) made here."""
        table_log = self.reader.read()
        if table_log is None:
            return None
        return newest_commit_version(table_log.history, self.pipeline_id, app_id)
