"""Delta sink on delta-spark: one commit per micro-batch holding data, txn and end offsets.

Needs the delta-spark jars (built into Databricks Runtime; elsewhere ``spark-submit --packages
io.delta:delta-spark_<Spark major.minor>_2.13:<version>``, see
:func:`kafka_delta.runtime.connectors.connector_packages`, or ``--jars`` from a local folder, with
Delta's session extension and catalog).

- append: ``DataFrameWriter`` options ``txnAppId``/``txnVersion`` and ``userMetadata``;
- upsert: MERGE, which takes no writer options, so the same three values go through the
  session confs ``spark.databricks.delta.write.txnAppId``/``txnVersion`` and
  ``spark.databricks.delta.commitInfo.userMetadata``, set for that one command and restored
  afterwards even when it fails (:func:`kafka_delta.delta.spark_commit.delta_txn_confs`).

delta-spark's writer carries ONE txn per commit, and it is the pipeline's fence
``txn(<pipeline>:fence, seq)`` with ``seq`` = the stored commit's seq + 1 (see
:mod:`kafka_delta.offsets.model`).

Fencing (I6), atomic: the stored offsets must equal the batch's start, checked on the history
before the batch's tasks run (:meth:`DeltaSparkSink.check`; the write does not read it again);
between that check and the commit, every run of the pipeline (same checkpoint or not) reads and
writes the same fence appId, so delta-spark's conflict checker
rejects the second of two concurrent commits (``ConcurrentTransactionException``), and a run
whose ``seq`` another run already used is skipped by delta-spark itself. Either way the sink
reads the pipeline's newest commit back and raises :class:`FencingError` unless it is this
batch: two checkpoints of one pipeline can never both commit. A commit refused while the
pipeline's newest commit stayed where it was lost to a writer that is no run of the pipeline
(a compaction that overtook a MERGE): the batch is written again on the table as it is now.
A write whose commit landed needs no reading back: inside ``foreachBatch`` on a classic
session the batch's own session says whether its write committed and at which version, and an
observation on the written frame counts its rows in the write's own job
(:class:`kafka_delta.delta.spark_commit.CommitWatch`); the log is read back when it committed
nothing, lost a race, or runs under Spark Connect.

Idempotence (I2): a replay is recognised before writing from the identity ``(app_id,
batch_id)`` in the pipeline's newest commit, and reports "replayed"; a concurrent run of the
same checkpoint that commits the batch first makes this one a replay too.

Through Spark alone (I14): the table is reached by catalog name or by path through
:class:`kafka_delta.delta.spark_table.SparkTable` (Spark SQL: ``DESCRIBE HISTORY``, ``MERGE
INTO``; the writer's ``saveAsTable``/``save``); the check and the read-back read the pipeline's
commits from the table's history (:class:`kafka_delta.delta.spark_offset_store.TableLogReader`),
never its txn actions, which Spark cannot read (why replay, fencing and a new checkpoint need
none: :mod:`kafka_delta.delta.spark_offset_store`). A steady batch's check reads no history:
while the sink's own last commit is the table's newest version, as Delta tells without a job
(:meth:`~kafka_delta.delta.spark_table.SparkTable.newest_version_is`), that commit is where the
table ends (:meth:`DeltaSparkSink._newest`). A table by name that does not exist is
created before its first write (``CREATE TABLE IF NOT EXISTS``). The rows a commit wrote come
from the observation on its frame, or from its own ``operationMetrics`` where it was read back,
never from a count of their own.

One job reads and writes a clean batch (append): a batch is written as clean (:meth:`materialize`
hands the transform's output back with :func:`..dead_letters.clean_rows`: no cache, no job of its
own), and the write's own job is the one that reads Kafka, transforms and writes. A row with a
dead letter fails that job before the write commits (``raise_error``), so nothing of the batch is
committed; the sink raises :class:`kafka_delta.engine.DeadLettersFound`, and the pipeline checks
the batch again, has it split (cached once, the dead letters collected in Spark), sends the dead
letters and commits, as every batch did before. After a batch with dead letters the next
:data:`SPLIT_AFTER_DEAD_LETTERS` batches are split from the start, so a source that keeps sending
bad records pays the failed write once, not every batch. Neither the fence, the commit nor the
read-back changes: a clean batch is one commit of its rows, txn and offsets, and a batch with
dead letters commits only after them. What the failed write leaves is data files no commit names
in the table's folder (Delta's writer wrote them; any failed Spark write leaves such files),
which Delta's ``VACUUM`` removes (``table maintain``).

Log cleanup: the fence txn survives in Delta checkpoints, but delta-spark cannot add the
per-partition offset txns the delta-rs sink writes. After each commit it confirms as its own,
the sink keeps a copy of the commit's record beside the checkpoint (never in the table's
folder), named by its fence seq, which the offset store reads when the log no longer holds the
commit (:mod:`kafka_delta.delta.commit_copies`).
"""

from __future__ import annotations

import logging
import time

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

import kafka_delta.crash_points as crash_points
from kafka_delta.dead_letters import (
    CLEAN_WRITE_MARK,
    POSITION,
    TOPIC_ID,
    TopicIds,
    clean_rows,
    held_among,
    split_dead_letters_df,
)
from kafka_delta.delta.commit_copies import CommitCopies
from kafka_delta.delta.schema import fit_to_table, narrower_columns
from kafka_delta.delta.spark_commit import (
    CommitWatch,
    append_options,
    delta_txn_confs,
    lost_race,
)
from kafka_delta.delta.spark_offset_store import DeltaSparkLog, TableLogReader
from kafka_delta.delta.spark_table import SparkTable, quoted_part
from kafka_delta.engine import DeadLettersFound, Materialized, Rows, SinkResult, WriteMode
from kafka_delta.offsets.fencing import (
    RESTART,
    FencingError,
    TableMovedError,
    check_contiguous,
    check_unmoved,
)
from kafka_delta.offsets.model import (
    BatchCommit,
    Offsets,
    StoredOffsets,
    partitions_of,
)
from kafka_delta.offsets.stored import (
    TableLog,
    newest_stored,
    read_stored,
    unnamed_partitions,
)
from kafka_delta.sinks.delta_spark.widening import widen_columns
from kafka_delta.upsert import MergeClauses, merge_clauses, upserted_frame

log = logging.getLogger(__name__)

# How many of the newest commits are searched for a batch's own, for its metrics, when the
# history the read-back read does not hold it (other writers committed after it); beyond them
# the rows are counted with a Spark job.
METRICS_LOOKBACK = 10
# A write whose commit lost to a writer that is no run of the pipeline is tried this often.
_MAX_ATTEMPTS = 10
# After a batch with dead letters, this many batches are split before their write (cached, the
# dead letters collected first) instead of written as clean (see the module docstring).
SPLIT_AFTER_DEAD_LETTERS = 10


def _same_commit(a: StoredOffsets | None, b: StoredOffsets | None) -> bool:
    """Whether two reads found the same newest commit of the pipeline (or none both times)."""
    if a is None or b is None:
        return a is b
    return (a.app_id, a.seq, a.delta_version) == (b.app_id, b.seq, b.delta_version)


def merge_statement(
    target: str, view: str, columns: list[str], clauses: MergeClauses, on: str
) -> str:
    """Delta's ``MERGE INTO`` SQL of the view ``view`` (alias ``s``) into ``target`` (alias
    ``t``) by :func:`kafka_delta.upsert.merge_clauses`, the delta-rs sink's rule: WHEN
    MATCHED AND the delete predicate THEN DELETE, then UPDATE and INSERT of every column but
    ``except_cols`` (``SET *`` / ``INSERT *`` when none is left out; else the columns are
    named, which schema evolution (autoMerge) follows for columns the table lacks)."""
    parts = [f"MERGE INTO {target} AS t USING `{view}` AS s ON {on}"]
    if clauses.delete is not None:
        parts.append(f"WHEN MATCHED AND ({clauses.delete}) THEN DELETE")
    update = f" AND ({clauses.update})" if clauses.update else ""
    insert = f" AND ({clauses.insert})" if clauses.insert else ""
    if not clauses.except_cols:
        parts.append(f"WHEN MATCHED{update} THEN UPDATE SET *")
        parts.append(f"WHEN NOT MATCHED{insert} THEN INSERT *")
        return " ".join(parts)
    kept = [quoted_part(c) for c in columns if c not in clauses.except_cols]
    sets = ", ".join(f"t.{c} = s.{c}" for c in kept)
    parts.append(f"WHEN MATCHED{update} THEN UPDATE SET {sets}")
    parts.append(
        f"WHEN NOT MATCHED{insert} THEN INSERT ({', '.join(kept)}) "
        f"VALUES ({', '.join(f's.{c}' for c in kept)})"
    )
    return " ".join(parts)


class DeltaSparkSink:
    def __init__(
        self,
        spark: SparkSession,
        table_uri: str,
        pipeline_id: str,
        mode: WriteMode | None = None,
        storage_options: dict[str, str] | None = None,
        *,
        checkpoint: str,
    ) -> None:
        """``table_uri``: a path or a catalog name (:mod:`kafka_delta.table_names`);
        ``checkpoint``: the run's checkpoint, beside which the commit copies are kept."""
        self.spark = spark
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.mode = mode or WriteMode()
        self.table = SparkTable(spark, table_uri)
        self.copies = CommitCopies(table_uri, checkpoint, pipeline_id, storage_options)
        self.reader = TableLogReader(self.table, pipeline_id, self.copies)
        # What :meth:`check` read for a batch (its identity, whether the table exists, stored
        # offsets), for :meth:`commit_batch` of the same batch.
        self._checked: tuple[tuple[str, int], bool, StoredOffsets | None] | None = None
        # Batches still to split before their write, after one with dead letters.
        self._split_left = 0
        # This sink's own newest commit, while the table's log is known to end there (see
        # :meth:`_newest`): its Delta version and the stored offsets a read would find in it.
        self._head: tuple[int, StoredOffsets] | None = None

    def worker_modules(self) -> tuple[str, ...]:
        return ()  # delta-spark writes in the JVM

    def columns(self) -> tuple[str, ...] | None:
        schema = self.table.schema()
        return None if schema is None else tuple(schema.fieldNames())

    def materialize(self, out: DataFrame, split: bool = False) -> Materialized:
        """The batch stays distributed. An append is handed back to be written as clean, in
        the write's own job (:func:`..dead_letters.clean_rows`; see the module docstring),
        unless ``split`` or a recent batch had dead letters: then it is cached once, its dead
        letters collected and split off in Spark, as an upsert always is (its MERGE reads the
        source more than once). A number column wider than the table's (a producer's int
        became long) widens the table's column first, by a commit of its own
        (:func:`.widening.widen_columns`); without schema evolution it goes into the table's
        column where each value fits, its other rows dead letters
        (:func:`kafka_delta.delta.schema.fit_to_table`). The table is analysed once
        (:meth:`kafka_delta.delta.spark_table.SparkTable.schema`), again only after a widening
        commit."""
        schema = self.table.schema()
        if (
            schema is not None
            and self.mode.add_columns
            and widen_columns(self.spark, self.table, schema, out.schema)
        ):
            schema = self.table.frame().schema
        if schema is not None and narrower_columns(out.schema, schema, widening=False):
            out = fit_to_table(out, schema, widening=False, why="delta.schema_evolution is fail")
        if not split and self.mode.kind == "append" and not self._split_left:
            return Materialized(clean_rows(out), None)
        materialized = split_dead_letters_df(out)
        if materialized.dead is not None:
            self._split_left = SPLIT_AFTER_DEAD_LETTERS
        elif self._split_left:
            self._split_left -= 1
        return materialized

    def _frame(self, rows: Rows) -> DataFrame:
        return rows if isinstance(rows, DataFrame) else self.spark.createDataFrame(rows)

    def _stored(
        self, commit: BatchCommit, start: Offsets | None
    ) -> tuple[TableLog | None, StoredOffsets | None]:
        """(the log as it is now, None when there is no table; the pipeline's stored offsets
        in it)."""
        table_log = self.reader.read()
        if table_log is None:
            return None, None
        names = partitions_of(commit.end_offsets, start or {})
        return table_log, read_stored(table_log, self.pipeline_id, lambda: names)

    def _newest(
        self, commit: BatchCommit, start: Offsets | None
    ) -> tuple[bool, StoredOffsets | None]:
        """(whether the table exists, the pipeline's stored offsets in it) before a write.

        Where this sink's own last commit (version v) is still the table's newest version, as
        Delta tells it without a Spark job (:meth:`SparkTable.newest_version_is`), the stored
        offsets are that commit's, known since it landed: the history page, a Spark job, is
        not read. Any other commit since (another run's, a RESTORE, an ``offsets reset``, the
        run's own compaction, a table deleted) makes v+1 exist or v not, and the history is
        read as before; so is a batch naming a partition the commit did not (a topic or
        partition new to the pipeline: the rows tell where it ends). The fence at commit time
        is unchanged: delta-spark commits the batch only with its ``seq`` above the table's."""
        head = self._head
        if head is not None:
            version, stored = head
            named = partitions_of(commit.end_offsets, start or {})
            if not unnamed_partitions(stored, named) and self.table.newest_version_is(version):
                return True, stored
            self._head = None
        table_log, stored = self._stored(commit, start)
        return table_log is not None, stored

    def _landed_at(self, version: int, commit: BatchCommit, before: StoredOffsets | None) -> None:
        """Remember ``commit``, landed at ``version`` on top of ``before``, as the table's
        newest: the stored offsets a read of a history page holding both commits finds
        (:func:`kafka_delta.offsets.stored.newest_stored`, the one rule)."""
        page = [{"version": version, "userMetadata": commit.user_metadata()}]
        if before is not None and before.user_metadata and before.delta_version is not None:
            page.append({"version": before.delta_version, "userMetadata": before.user_metadata})
        stored = newest_stored(page, self.pipeline_id)
        self._head = (version, stored) if stored is not None else None

    def _rows_committed(self, version: int, frame: DataFrame, table_log: TableLog) -> int:
        """The rows the append at ``version`` wrote: its commit's ``numOutputRows`` metric,
        from the history the read-back just read, where it found the commit (no second reading
        of the log); counted with a Spark job only when the writer recorded no metrics
        (``spark.databricks.delta.history.metricsEnabled`` off)."""
        read = table_log.read_so_far() if isinstance(table_log, DeltaSparkLog) else ()
        entry = next((e for e in read if e.get("version") == version), None)
        if entry is None:
            newest = table_log.history(METRICS_LOOKBACK)
            entry = next((e for e in newest if e.get("version") == version), None)
        metrics = entry.get("operationMetrics") if entry is not None else None
        if isinstance(metrics, dict) and str(metrics.get("numOutputRows", "")).isdigit():
            return int(metrics["numOutputRows"])
        return int(frame.count())

    @staticmethod
    def _is_replay(stored: StoredOffsets | None, commit: BatchCommit) -> bool:
        return (
            stored is not None
            and stored.app_id == commit.app_id
            and stored.batch_id is not None
            and stored.batch_id >= commit.batch_id
        )

    def check(
        self, commit: BatchCommit, start: Offsets | None = None, first_reads: Offsets | None = None
    ) -> bool:
        """True when the batch is already in the table (a replay); raises
        :class:`FencingError` when it does not start where the table ends. Writes nothing."""
        self._checked = None
        exists, stored = self._newest(commit, start)
        if self._is_replay(stored, commit):
            return True
        check_contiguous(stored, start, commit, first_reads)
        self._checked = ((commit.app_id, commit.batch_id), exists, stored)
        return False

    def commit_batch(
        self,
        rows: Rows,
        commit: BatchCommit,
        start: Offsets | None = None,
        first_reads: Offsets | None = None,
        *,
        expected_seq: int | None = None,
    ) -> SinkResult:
        """Commit ``rows`` as batch ``commit`` (see the module docstring); ``expected_seq`` (the
        dead-letter table's fence, :func:`..offsets.fencing.check_unmoved`): the commit lands
        only on top of that commit of the pipeline. Checked on the log read here; a commit of
        the pipeline after that read takes the ``seq`` this one writes, so delta-spark rejects or
        skips this one and the read-back raises :class:`TableMovedError`. A write that
        committed, as its session tells, is read back from no log (:meth:`_landed`)."""
        # A batch that passed check() keeps what it read there: a run that commits in between
        # takes the fence seq this batch would write, so delta-spark skips this write and the
        # read-back below raises FencingError, exactly as for a race during the write itself.
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] == (commit.app_id, commit.batch_id):
            _, exists, stored = checked
        else:
            exists, stored = self._newest(commit, start)
        # Known again only once this batch's commit is: whatever happens to this write, the
        # next batch's check does not take the table's end from before it.
        self._head = None
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            if attempt > 1:
                log.info(
                    "batch %d: the commit that landed first is not pipeline %r's; the batch is "
                    "written again on the table as it is now (attempt %d of %d)",
                    commit.batch_id,
                    commit.pipeline_id,
                    attempt,
                    _MAX_ATTEMPTS,
                )
                exists, stored = self._newest(commit, start)
            result = self._commit_once(
                rows, commit, start, first_reads, expected_seq, exists, stored
            )
            if result is not None:
                return result
        raise FencingError(
            f"batch {commit.batch_id}: lost the commit race {_MAX_ATTEMPTS} times in a row on "
            f"{self.table_uri} to writers that are not this pipeline (compactions, other jobs); "
            "stop them, then restart."
        )

    def _commit_once(
        self,
        rows: Rows,
        commit: BatchCommit,
        start: Offsets | None,
        first_reads: Offsets | None,
        expected_seq: int | None,
        exists: bool,
        stored: StoredOffsets | None,
    ) -> SinkResult | None:
        """One write of the batch on the table where the pipeline's newest commit is
        ``stored``: its result; None when its commit lost to a writer that is no run of the
        pipeline (a compaction that rewrote files a MERGE read, a job that changed the table's
        schema), the pipeline's newest commit read back unchanged, so the caller writes again."""
        if self._is_replay(stored, commit):
            log.info(
                "batch %d of %s is already in the table (%s): replay skipped",
                commit.batch_id,
                commit.app_id,
                stored.describe() if stored is not None else "",
            )
            return SinkResult(written=False, rows=0, delta_version=None)
        check_unmoved(stored, expected_seq, commit, self.table_uri)
        check_contiguous(stored, start, commit, first_reads)
        commit = commit.on_top_of(stored)
        frame = self._frame(rows)
        # An upsert MERGEs a non-empty batch into an existing table; anything else appends.
        count = frame.count() if self.mode.kind == "upsert" and exists else None
        # A batch's own frame, on a classic session: its session tells whether the write
        # committed, and where, without reading the log back (CommitWatch).
        watched = isinstance(rows, DataFrame) and CommitWatch.applies(frame)
        watch: CommitWatch | None = None
        raced = False
        try:
            if count:
                clauses = merge_clauses(self.mode, frame.columns)
                target, on = self.table.sql_name(), self.mode.merge_predicate()
                # The batch's own session runs the MERGE, so its confs carry the txn.
                with delta_txn_confs(frame.sparkSession, commit, self.mode.add_columns):
                    watch = CommitWatch(frame, count_rows=False) if watched else None
                    self.table.merge(
                        frame,
                        lambda view: merge_statement(target, view, frame.columns, clauses, on),
                    )
            else:
                # An append; for an upsert also its first batch and an empty one, which must
                # still commit its offsets (their deletes delete nothing; `_op` is no column).
                if self.mode.kind == "upsert":
                    frame = upserted_frame(frame)
                if not exists:
                    # By name, the catalog's table is made first (its columns, the sink's
                    # properties); by path the append below creates it.
                    self.table.create_if_missing(frame.schema)
                if watched:
                    watch = CommitWatch(frame, count_rows=True)
                    frame = watch.frame
                writer = (
                    frame.write.format("delta").mode("append").options(**append_options(commit))
                )
                if self.mode.add_columns:
                    # New columns join the table in the batch's own commit.
                    writer = writer.option("mergeSchema", "true")
                self.table.save(writer)
        except Exception as exc:
            if CLEAN_WRITE_MARK in str(exc):
                # Written as clean, the batch held a dead letter: the write failed before its
                # commit, so nothing of the batch is in the table.
                self._split_left = SPLIT_AFTER_DEAD_LETTERS
                raise DeadLettersFound(
                    f"batch {commit.batch_id} holds dead letters: written again with them split off"
                ) from None
            if not lost_race(exc):
                raise
            first = str(exc).splitlines()[0][:200]
            log.info("batch %d: another commit landed first (%s)", commit.batch_id, first)
            watch, raced = None, True
        if watch is not None and (landed := self._landed(watch, stored, commit)) is not None:
            version, observed = landed
            rows_written = count if count is not None else observed
            assert rows_written is not None
            self._landed_at(version, commit, stored)
            return SinkResult(written=True, rows=rows_written, delta_version=version)
        read_back = time.perf_counter()
        after_log, after = self._stored(commit, start)
        read_back_s = time.perf_counter() - read_back
        if after is not None and (after.app_id, after.batch_id, after.seq) == (
            commit.app_id,
            commit.batch_id,
            commit.seq,
        ):
            assert after.delta_version is not None
            # Only now, with the commit read back as this batch's, is the copy written.
            self._keep_copy(commit, after.delta_version)
            self._landed_at(after.delta_version, commit, stored)
            if count is None:
                assert after_log is not None
                count = self._rows_committed(after.delta_version, frame, after_log)
            return SinkResult(
                written=True,
                rows=count,
                delta_version=after.delta_version,
                read_back_s=read_back_s,
            )
        if self._is_replay(after, commit):
            # A concurrent run of this checkpoint committed the same batch first.
            log.info(
                "batch %d of %s was committed by a concurrent run", commit.batch_id, commit.app_id
            )
            return SinkResult(written=False, rows=0, delta_version=None, read_back_s=read_back_s)
        if raced and _same_commit(after, stored):
            return None
        # Pinned to a commit of the pipeline (the dead-letter table): the caller looks again.
        lost = FencingError if expected_seq is None else TableMovedError
        raise lost(
            f"batch {commit.batch_id} of pipeline {commit.pipeline_id!r} lost to a concurrent "
            f"run: the table's newest commit of the pipeline is "
            f"{after.describe() if after is not None else 'missing'}, not this batch (commit "
            f"{commit.seq} of {commit.app_id}). {RESTART}"
        )

    def _landed(
        self, watch: CommitWatch, stored: StoredOffsets | None, commit: BatchCommit
    ) -> tuple[int, int | None] | None:
        """(the version this batch's commit made, its rows when observed), told by the batch's
        session (:class:`CommitWatch`), with its copy kept; None when the session saw no commit
        of this write (delta-spark skipped it), and the log is read back.

        A commit that landed is this batch's: it carries the batch's rows, txn and offsets in
        one commit, and delta-spark committed it only with the fence ``seq`` above the stored
        one and no commit of the same fence app id beside it, which is what the read-back's
        answer "the pipeline's newest commit is this batch" establishes too. A version at or
        below the stored commit's cannot be this write's: the log is read back."""
        landed = watch.committed()
        if landed is None:
            return None
        version, _ = landed
        if stored is not None and stored.delta_version is not None:
            if version <= stored.delta_version:
                return None
        self._keep_copy(commit, version)
        return landed

    def _keep_copy(self, commit: BatchCommit, version: int) -> None:
        """The copy of the commit this batch made, beside the checkpoint (a hint: the next start
        writes it from the log again when it cannot be kept now)."""
        crash_points.reached("before_commit_copy")
        try:
            self.copies.write(commit.seq, commit.user_metadata(), version)
        except Exception as exc:
            log.warning("cannot keep the copy of commit %d: %s", commit.seq, exc)

    def positions_held(
        self,
        table_uri: str,
        storage_options: dict[str, str] | None,
        dead: pa.Table,
        topic_ids: TopicIds = None,
    ) -> set[tuple[str, int, int]]:
        """As :meth:`kafka_delta.engine.Sink.positions_held`, for this sink's table (the
        dead-letter table), read through Spark: the position columns of the rows at the dead
        letters' offsets."""
        from pyspark.sql import functions as F

        if dead.num_rows == 0 or not self.table.exists():
            return set()
        frame = self.table.frame()
        offsets = sorted(set(dead.column("offset").to_pylist()))
        columns = [*POSITION, TOPIC_ID] if TOPIC_ID in frame.columns else POSITION
        rows = frame.filter(F.col("offset").isin(offsets)).select(*columns).collect()
        return held_among([row.asDict() for row in rows], dead, topic_ids)
