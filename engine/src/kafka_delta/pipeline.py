"""Wires source -> transform -> exactly-once sink -> commit-back hook, one micro-batch at a time.

Before the query starts, :mod:`.resume` plans where the run starts (stored offsets, the
checkpoint's verdict, tables new to the pipeline or ahead of the others). One micro-batch
(docs/design.md section 3) is :meth:`Pipeline._process_batch`, the same steps for each of the
pipeline's tables (:mod:`.routing`; one table is a list of one):

1. Plan the ends: the source planned ``[start, end)`` per partition; Spark wrote ``end`` to the
   checkpoint's offset log before running the batch. The batch's end offsets are read from
   there, never derived from ``max(offset) + 1`` of the data (offsets have gaps; where the
   batch begins: :mod:`.offsets.run_positions`); each table's share (a
   :class:`~.routing.TableBatch`) covers the topics it reads, from where it holds nothing yet.
2. Fence each table: a table that has the batch (a replay) or may not commit it runs no task.
3. Transform: the user's transform runs on the table's records.
4. Write: the sink materializes the rows; the dead letters go to their table first.
5. Commit: the sink makes ONE Delta commit per table: data + ``txn(app_id, batch_id)`` + end
   offsets.
6. Commit back: the hook copies the group's offsets (the least of the tables') to the consumer
   group, asynchronously; then the progress line and the listeners
   (:mod:`.progress.run_progress`).

The run around the batches (the run lease, the query started again after an outage or a wider
schema, the stop between batches, the run's compaction) is :mod:`.runtime.run_loop`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

import kafka_delta.crash_points as crash_points
from kafka_delta.config import PipelineConfig
from kafka_delta.contract import Transform, load_transform, passthrough, warn_without_positions
from kafka_delta.dead_letters import DeadLetterError
from kafka_delta.engine import DeadLettersFound, Engine
from kafka_delta.engine_factory import build_engine_parts, build_source
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.kafka.commit_back import OffsetCommitter
from kafka_delta.offsets.model import BatchCommit, Offsets, app_id
from kafka_delta.offsets.run_positions import RunPositions
from kafka_delta.progress.batch import ProgressListener, StepClock
from kafka_delta.progress.run_progress import RunProgress
from kafka_delta.progress.summary import RunSummary
from kafka_delta.recovery.checkpoint import CheckpointLog, CheckpointMismatchError
from kafka_delta.resume import ResumePlanner, first_positions, joining_first_reads
from kafka_delta.routing import (
    BatchRead,
    TableBatch,
    TableRun,
    group_offsets,
    key_deletes,
    table_input,
    table_output,
    table_runs,
    without_held,
)
from kafka_delta.routing import table_batch as plan_table_batch
from kafka_delta.runtime.connect_server_copy import ServerCopy
from kafka_delta.runtime.graceful_stop import StopGate
from kafka_delta.runtime.python_workers import warm_up
from kafka_delta.runtime.run_loop import RunLoop, TriggerNotSupportedError, start_query
from kafka_delta.runtime.spark_session import is_connect, streaming_query_id
from kafka_delta.upsert import latest_per_key

log = logging.getLogger(__name__)


__all__ = [
    "CheckpointMismatchError",
    "DeadLetterError",
    "Pipeline",
    "RunSummary",
    "TriggerNotSupportedError",
]


class Pipeline(ServerCopy):
    """A configured streaming query. ``run()`` blocks until caught up (availableNow) or until
    :meth:`request_stop` (processing time); either way the commit-back hook is flushed."""

    def __init__(
        self,
        spark: SparkSession,
        config: PipelineConfig,
        transform: Transform | None = None,
        *,
        committer: OffsetCommitter | None = None,
        listeners: Sequence[ProgressListener] = (),
    ) -> None:
        """``transform``: the project's (:mod:`.contract`); None takes the one the config names,
        else :func:`~.contract.passthrough`. ``listeners`` receive each batch's
        :class:`~.progress.batch.BatchProgress` (metrics, the progress file)."""
        self.spark = spark
        self.config = config
        if transform is None:
            transform = load_transform(config.transform) if config.transform else passthrough
        self.transform = transform
        # The tables this pipeline writes, in commit order (kafka_delta.routing): one, as the
        # config's `delta:` names it, or one per entry of `tables:`, sharing one source.
        source = build_source(config) if config.tables else None
        self.tables: list[TableRun] = table_runs(
            config.table_configs(), lambda view: build_engine_parts(spark, view, source)
        )
        # The first table's engine (the only table's, for a pipeline of one table).
        self.engine: Engine = self.tables[0].engine
        self.checkpoint = CheckpointLog(spark, config.checkpoint)
        self.admin = KafkaAdmin(config.kafka.client_config())
        # Spark Connect (serverless, standard access): the batch function runs in a Python
        # process the server starts, and reports each batch back through the checkpoint
        # location (kafka_delta.progress.mailbox): the pipeline's copy there is
        # kafka_delta.runtime.connect_server_copy's.
        self.remote = is_connect(spark)
        self._worker = False  # True in the batch function's copy in the Connect server
        self._held_batch: DataFrame | None = None
        # Where the run stands in Kafka: the offsets stored when it started and as of its last
        # batch, the topics' ids, the topics recreated (kafka_delta.offsets.run_positions).
        self.positions = RunPositions()
        self._gate = StopGate()
        self._query: StreamingQuery | None = None
        # What follows each committed batch: the commit back, the progress line, the
        # listeners, the run's summary (kafka_delta.progress.run_progress).
        self.progress = RunProgress(
            config,
            self.admin,
            self._gate,
            committer=committer,
            listeners=listeners,
            remote=self.remote,
        )
        # The query, started again after the failures a run rides out (runtime.run_loop).
        self.run_loop = RunLoop(
            spark, config, self.tables, self._gate, self.progress, remote=self.remote
        )
        # Where this run moved a checkpoint the table had left behind (None: kept).
        self.set_aside_as: str | None = None
        # The tables whose transform output was checked for Kafka positions (once per run).
        self._positions_checked: set[str] = set()

    # -- set-up -----------------------------------------------------------------------------

    @property
    def summary(self) -> RunSummary:
        """What the run did so far (:meth:`run` returns it at its end)."""
        return self.progress.summary

    def start(self) -> StreamingQuery:
        """Starts the query where the run starts (:class:`.resume.ResumePlanner`, after judging
        the checkpoint against the tables: one the tables moved past is set aside,
        :attr:`set_aside_as`, and the run resumes from the tables; one ahead of them without
        explanation stops)."""
        planner = ResumePlanner(
            self.config, self.checkpoint, self.admin, self.tables, self.engine.source
        )
        resume = planner.plan()
        if resume.set_aside_as is not None:
            self.set_aside_as = resume.set_aside_as
        self.positions.start_at(resume)
        planner.place_tables(self.positions.initial)
        stored = resume.stored
        planner.log_start(stored)
        self.progress.start_commit_back(stored)
        decode = self.run_loop.decode_spec(self.engine.sink.columns)
        # Until the first batch's tasks run, the executors are idle (the driver registers the
        # source, starts the query, plans the batch): start their Python workers meanwhile.
        warm_up(
            self.spark,
            self.engine.source.worker_modules(decode) + self.engine.sink.worker_modules(),
        )
        stream = self.engine.source.stream(
            self.spark,
            stored,
            resuming=self.checkpoint.has_plan(),
            decode=decode,
            topic_ids=self.positions.topic_ids,
        )
        self.progress.query_starts()
        # Under Spark Connect the batch function is pickled here, with the state set above.
        self._query = start_query(stream, self.spark, self.config, self._gated_batch)
        return self._query

    # -- the micro-batch --------------------------------------------------------------------

    def _query_id(self, df: DataFrame) -> str:
        """The checkpoint's query id: Spark's local property inside foreachBatch, else (Spark
        Connect has no SparkContext) the id stored in the checkpoint's metadata file."""
        return streaming_query_id(df.sparkSession) or self.checkpoint.query_id() or ""

    def _gated_batch(self, df: DataFrame, batch_id: int) -> None:
        """The batch function Spark calls: :meth:`_process_batch`, and after it the query is
        stopped if a stop was requested (see :mod:`kafka_delta.runtime.graceful_stop`)."""
        if self._worker:  # in the Connect server's Python process
            self._in_server(df)
        self._gate.enter()
        succeeded = False
        try:
            self._process_batch(df, batch_id)
            succeeded = True
        finally:
            self._gate.leave(batch_id, succeeded=succeeded)

    def _process_batch(self, df: DataFrame, batch_id: int) -> None:
        """One micro-batch, as steps; each table's the same (one table: a list of one). Each
        step is timed (:class:`.progress.batch.StepClock`) into the batch's progress."""
        started = time.perf_counter()
        clock = StepClock()
        with clock.step("plan"):
            end, table_batches = self._plan_ends(df, batch_id)
        with clock.step("check"):
            self._fence(table_batches)
        read = BatchRead(df, writing=sum(not table_batch.replayed for table_batch in table_batches))
        try:
            for n, table_batch in enumerate(table_batches):
                if n:
                    # A crash here leaves the batch in the tables before this one only.
                    crash_points.reached("between_tables")
                if not table_batch.replayed:
                    self._write_table(table_batch, read, clock)
        finally:
            read.release()
        crash_points.reached("after_delta_commit")
        group = self._store_ends(table_batches, end)
        # The batch's progress, the commit back and the progress line, in the process that
        # started the run.
        self.progress.report(batch_id, table_batches, end, group, read.observation, started, clock)

    def _plan_ends(self, df: DataFrame, batch_id: int) -> tuple[Offsets, list[TableBatch]]:
        """The batch's end offsets, as the checkpoint planned them, and each table's share of
        the batch (:func:`.routing.table_batch`): the offsets it covers and the commit that
        records them."""
        end = self.checkpoint.end_offsets(batch_id)
        positions = self.positions
        query_id = self._query_id(df)
        if not query_id:
            raise CheckpointMismatchError("cannot determine the streaming query id")
        commit = BatchCommit(
            pipeline_id=self.config.pipeline_id,
            app_id=app_id(self.config.pipeline_id, query_id),
            batch_id=batch_id,
            end_offsets=end,
            topic_ids=positions.current_topic_ids(end, self.engine.source, self.admin),
        )
        rewound = positions.rewound(end, self.admin, self.config.kafka.fail_on_data_loss)
        if rewound:
            commit = replace(commit, rewound=rewound, rewound_from=positions.ends_before(rewound))
        start = positions.batch_start(
            batch_id, end, self.checkpoint, self.engine.source, self.admin
        )
        if not self.config.kafka.fail_on_data_loss:
            positions.say_skipped(start, end, self.admin)
        return end, [
            plan_table_batch(run, commit, start, query_id, self.tables) for run in self.tables
        ]

    def _fence(self, table_batches: Sequence[TableBatch]) -> None:
        """Fencing first, for every table, on the tables as they are now: a run that may not
        commit this batch stops here, and a table that has the batch (a replay) runs no task:
        nothing is read for it from Kafka, no data file and no dead letter is written."""
        for table_batch in table_batches:
            run = table_batch.run
            # A table new to the pipeline begins where the stream is.
            table_batch.first_reads = (
                joining_first_reads(table_batch.start, run.known)
                if run.joining
                else first_positions(self.admin, self.config, table_batch.start, run.known)
            )
            table_batch.replayed = run.engine.sink.check(
                table_batch.commit, table_batch.start, table_batch.first_reads
            )

    def _write_table(
        self, table_batch: TableBatch, read: BatchRead, clock: StepClock | None = None
    ) -> None:
        """Transform, write and commit one table's share of the batch: its records (topic
        routing, less what it holds), the transform's output, its dead letters, then its one
        Delta commit. ``clock`` times the steps (``materialize`` up to the commit, ``commit``,
        and of the commit the sink's ``read_back``).

        A sink may write a batch as clean in its commit's own job (the delta-spark sink's
        append, :class:`~.engine.DeadLettersFound`): when the batch holds a dead letter after
        all, that write fails before its commit, nothing is committed, and the table's share
        is done again the way every batch once was: checked again, materialized with its dead
        letters split off, the dead letters sent, then the commit; the records are observed
        afresh (the failed job counted part of them)."""
        clock = clock or StepClock()
        run = table_batch.run
        sink = run.engine.sink
        split = False
        while True:
            with clock.step("materialize"):
                records = without_held(
                    table_input(read.records, run, self.config.kafka.topics), table_batch.held_below
                )
                out = self._transform(run, records)
                written = sink.materialize(out, split=split)
            try:
                with clock.step("materialize"):
                    # The dead letters go to their table before the table's own commit, found
                    # again by position in the records the table read.
                    table_batch.dead_letters = (
                        0
                        if written.dead is None
                        else run.dead_letters.send(records, written.dead, table_batch.commit)
                    )
                crash_points.reached("before_delta_commit")
                with clock.step("commit"):
                    # The table's one Delta commit of the batch: its rows, txn and offsets.
                    table_batch.result = sink.commit_batch(
                        written.rows,
                        table_batch.commit,
                        start=table_batch.start,
                        first_reads=table_batch.first_reads,
                    )
                clock.add("read_back", table_batch.result.read_back_s)
            except DeadLettersFound as found:
                if split:
                    raise
                log.info("%s%s", found, f" (table {run.name})" if run.name else "")
                split = True
                read.renew()
                with clock.step("check"):
                    table_batch.replayed = sink.check(
                        table_batch.commit, table_batch.start, table_batch.first_reads
                    )
                if table_batch.replayed:
                    return
                continue
            finally:
                written.release()
            break
        if table_batch.result.written:
            run.joining = False

    def _transform(self, run: TableRun, records: DataFrame) -> DataFrame:
        """The rows table ``run`` receives: the rows read as deletes of their key as its own
        tombstones setting takes them, through the transform and the table's route
        (:func:`.routing.table_output`); of an upsert table, the latest row per key."""
        names = [r.name for r in self.tables]
        out = table_output(self.transform, key_deletes(records, run), run, names)
        if run.label not in self._positions_checked:  # at the run's first batch
            self._positions_checked.add(run.label)
            warn_without_positions(out.columns, run.name)  # the schema: no job
        mode = run.config.delta
        if mode.mode == "upsert":
            out = out.transform(latest_per_key(mode.merge_keys, mode.order_by))
        return out

    def _store_ends(self, table_batches: Sequence[TableBatch], end: Offsets) -> Offsets:
        """Where each table stands after the batch, and the group's offsets: what every table
        that reads a partition holds (one table: the batch's end offsets)."""
        for table_batch in table_batches:
            for topic, parts in table_batch.commit.end_offsets.items():
                table_batch.run.known.setdefault(topic, {}).update(parts)
        group = group_offsets(self.tables, within=end)
        written = any(table_batch.result.written for table_batch in table_batches)
        self.positions.stored(group, written)
        return group

    # -- running ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop after the current micro-batch (safe from a signal handler)."""
        self.run_loop.request_stop()

    def run(self) -> RunSummary:
        """Run the query (:class:`.runtime.run_loop.RunLoop`: started again after the failures
        a run rides out) until caught up or stopped; what the run did."""
        return self.run_loop.run(self.start, lambda: self._query.id if self._query else None)
