"""Wires source -> transform -> exactly-once sink -> commit-back hook, one micro-batch at a time.

Before the query starts, :mod:`.resume` plans where the run starts (stored offsets, the
checkpoint's verdict, tables new to the pipeline or ahead of the others). One micro-batch
(docs/design.md section 3) is :meth:`Pipeline._process_batch`, the same steps for each of the
pipeline's tables (:mod:`.routing`; one table is a list of one):

1. Plan the ends: the source planned ``[start, end)`` per partition; Spark wrote ``end`` to the
   checkpoint's offset log before running the batch. The batch's end offsets are read from
   there, never derived from ``max(offset) + 1`` of the data (offsets have gaps); each table's
   share covers the topics it reads, from where it holds nothing yet.
2. Fence each table: a table that has the batch (a replay) or may not commit it runs no task.
3. Transform: the user's transform runs on the table's records.
4. Write: the sink materializes the rows; the dead letters go to their table first.
5. Commit: the sink makes ONE Delta commit per table: data + ``txn(app_id, batch_id)`` + end
   offsets.
6. Commit back: the hook copies the group's offsets (the least of the tables') to the consumer
   group, asynchronously; then the progress line and the listeners.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import replace

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from kafka_delta.config import PipelineConfig
from kafka_delta.contract import POSITION_COLUMNS, Transform, load_transform, passthrough
from kafka_delta.decoding.failures import message_seen, registry_down, schema_changed
from kafka_delta.delta.maintenance import Maintainer, maintainer_for
from kafka_delta.engine import DeadLettersFound, Engine, Materialized, Sink, SinkResult, Source
from kafka_delta.engine_factory import build_engine, build_source
from kafka_delta.kafka.admin import KafkaAdmin, lag
from kafka_delta.kafka.commit_back import OffsetCommitter
from kafka_delta.kafka.outage import KafkaOutage, got_through_a_trigger, kafka_down
from kafka_delta.offsets.model import BatchCommit, Offsets, StoredOffsets, app_id, total_records
from kafka_delta.offsets.topic_identity import recreated_while_running
from kafka_delta.progress.batch import BatchProgress, ProgressListener, StepClock, steps_text
from kafka_delta.progress.mailbox import BatchMailbox, BatchReport
from kafka_delta.progress.reporter import BatchReporter
from kafka_delta.progress.summary import RunSummary
from kafka_delta.recovery.checkpoint import CheckpointLog, CheckpointMismatchError
from kafka_delta.recovery.lease import RunLease
from kafka_delta.resume import ResumePlanner, first_positions, joined_at
from kafka_delta.routing import (
    TableBatch,
    TableRun,
    group_offsets,
    key_deletes,
    table_batch,
    table_input,
    table_output,
    table_runs,
    without_held,
)
from kafka_delta.runtime.compaction import RunCompaction
from kafka_delta.runtime.faults import crash_point
from kafka_delta.runtime.graceful_stop import StopGate
from kafka_delta.runtime.python_workers import warm_up
from kafka_delta.runtime.spark_session import is_connect, streaming_query_id
from kafka_delta.sinks.dead_letters import DeadLetterError, DeadLetterQueue
from kafka_delta.sinks.upsert import latest_per_key

log = logging.getLogger(__name__)


def registry_backoff(total_s: float) -> list[float]:
    """Waits before a query that failed on an unreachable Schema Registry starts again: 1, 2,
    4 ... 60 s, as many as fit in ``total_s``; then the run stops with the registry's sentence.

    >>> registry_backoff(10)
    [1.0, 2.0, 4.0]
    """
    waits: list[float] = []
    wait, spent = 1.0, 0.0
    while spent + wait <= total_s:
        waits.append(wait)
        spent += wait
        wait = min(60.0, wait * 2)
    return waits


__all__ = [
    "CheckpointMismatchError",
    "DeadLetterError",
    "Pipeline",
    "RunSummary",
    "TriggerNotSupportedError",
]


# Spark's pause before it asks a streaming source again after it had nothing new.
POLLING_DELAY = "spark.sql.streaming.pollingDelay"


class TriggerNotSupportedError(RuntimeError):
    """The compute refuses the configured trigger (serverless runs streams only until caught
    up); nothing was read or written."""


# How Databricks serverless (and standard access with that limit) refuses a trigger that never
# ends: its error class, and the sentence of its message.
_UNENDING_TRIGGER_REFUSED = (
    "INFINITE_STREAMING_TRIGGER_NOT_SUPPORTED",
    "Trigger type ProcessingTime is not supported",
)


def trigger_refused(exc: BaseException, mode: str) -> str | None:
    """The one sentence for a query start the compute refused because of ``trigger.mode``, or
    None when ``exc`` is something else.

    >>> trigger_refused(RuntimeError("[INFINITE_STREAMING_TRIGGER_NOT_SUPPORTED] ..."),
    ...                 "processing_time")[:43]
    'this compute runs streams only until caught'
    """
    if mode != "processing_time" or not any(m in str(exc) for m in _UNENDING_TRIGGER_REFUSED):
        return None
    return (
        "this compute runs streams only until caught up (Databricks serverless has no "
        "processing-time trigger): set trigger.mode: available_now in the config (or pass "
        "--trigger available-now) and run the job on a schedule; nothing was read or written"
    )


def records_read(observation: Observation, wait_s: float = 2.0) -> int | None:
    """The Kafka records the batch read, counted by DataFrame.observe on the batch's input
    while the sink's own job ran (no extra Spark job); None if that count did not arrive
    within wait_s (a transform that does not read its input).

    Spark delivers the count through its listener bus, a moment after the job that computed it
    returns: the count is waited for, briefly, rather than taken as missing.
    """
    future = getattr(getattr(observation, "_jo", None), "future", None)
    try:
        if future is not None:
            # Observation.get would block for good on a plan that never ran.
            deadline = time.monotonic() + wait_s
            while not future().isCompleted():
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.002)
        return int(observation.get["records"])
    except Exception:  # progress reporting must never fail a committed batch
        return None


class BatchRead:
    """The batch's records as its tables read them, read from Kafka once for all of them
    (persisted while more than one writes), and the count of what was read: observed while
    the sinks' own jobs run (no extra job); a batch every table has (a replay) reads nothing,
    so nothing is observed."""

    def __init__(self, df: DataFrame, writing: int) -> None:
        self.df = df
        self.writing = writing
        self._observe()

    def _observe(self) -> None:
        self.observation: Observation | None = Observation() if self.writing else None
        observed = (
            self.df
            if self.observation is None
            else self.df.observe(self.observation, F.count(F.lit(1)).alias("records"))
        )
        self.records = observed.persist() if self.writing > 1 else observed

    def renew(self) -> None:
        """Observe the records afresh: a job that failed part way (a clean write that met a
        dead letter) filled the observation with what its finished tasks had counted."""
        self.release()
        self._observe()

    def release(self) -> None:
        if self.writing > 1:
            self.records.unpersist()


def _per_table(p: BatchProgress) -> str:
    """Each table's share of the batch line, for a pipeline of several tables:
    `` tables=2 orders:rows=10,dead=0,v=3 payments:replayed``."""
    if not p.tables:
        return ""
    each = [
        f"{name}:replayed"
        if t.get("replayed")
        else f"{name}:rows={t.get('rows_written')},dead={t.get('dead_letters')},"
        f"v={t.get('delta_version')}"
        for name, t in p.tables.items()
    ]
    return f" tables={len(p.tables)} " + " ".join(each)


def _engine_parts(
    spark: SparkSession, view: PipelineConfig, source: Source | None
) -> tuple[Engine, DeadLetterQueue]:
    """A table's engine, built on ``spark`` (``source``: the stream the tables share), and its
    dead-letter queue."""
    engine = build_engine(spark, view, source=source)
    queue = DeadLetterQueue(
        engine.dead_letter_sink, engine.dead_letter_offsets, view.delta.storage_options
    )
    return engine, queue


class Pipeline:
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
            config.table_configs(), lambda view: _engine_parts(spark, view, source)
        )
        # The first table's parts (the only table's, for a pipeline of one table).
        self.engine: Engine = self.tables[0].engine
        self.dead_letters = self.tables[0].dead_letters
        self.checkpoint = CheckpointLog(spark, config.checkpoint)
        self.admin = KafkaAdmin(config.kafka.client_config())
        # Spark Connect (serverless, standard access): the batch function runs in a Python
        # process the server starts, and reports each batch back through the checkpoint
        # location (kafka_delta.progress.mailbox); see __getstate__.
        self.remote = is_connect(spark)
        self._mailbox: BatchMailbox | None = None
        self._worker = False  # True in the batch function's copy in the Connect server
        self._held_batch: DataFrame | None = None
        self.committer: OffsetCommitter | None = committer
        self.summary = RunSummary()
        self.listeners = list(listeners)
        # Tells this run's lines apart from other runs' in the progress file.
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self._run_records_read = 0
        self._target: Offsets | None = None
        # Offsets the table held when this run started: where batch 0 of a new checkpoint
        # must begin ({} = nothing stored yet).
        self._initial: Offsets = {}
        # The offsets stored as of the last batch of this run (at first, the table's).
        self._known: Offsets = {}
        self._gate = StopGate()
        self._query: StreamingQuery | None = None
        # Reports committed batches in order, off their critical path, while the run lasts.
        self._reporter: BatchReporter | None = None
        # Where this run moved a checkpoint the table had left behind (None: kept).
        self.set_aside_as: str | None = None
        # Kafka's ids of the topics, as this run found them; the stored offsets of topics
        # deleted and created again since (read from their start when allowed).
        self._topic_ids: dict[str, str] = {}
        self._recreated: set[str] = set()
        # The stored offsets of the recreated topics before they were forgotten (the old
        # topics' ends), recorded with the batch that starts them over.
        self._recreated_from: Offsets = {}
        # Writer schemas (registry ids) seen in records whose fields the decoder's reader
        # schema lacked: the next query's reader schema includes them (schema evolution).
        self._writer_schema_ids: set[int] = set()
        # The tables whose transform output was checked for Kafka positions (once per run).
        self._positions_checked: set[str] = set()
        # Protobuf without `message:`: the message the records were found to carry, the
        # reader's from then on in this run (the file's default is a guess until then).
        self._message_seen: str | None = None

    # -- Spark Connect: the batch function in the server's Python process -------------------

    # What only the process that started the run holds: its session, its Kafka clients, its
    # listeners and stop gate, the query handle. None of it crosses to the batch function's
    # process under Spark Connect, which builds its own Kafka admin client and reports each
    # batch back (BatchMailbox); the process that started the run commits the group's
    # offsets, logs the progress line and calls the listeners, as a classic run does.
    _DRIVER_ONLY = (
        "spark",
        "admin",
        "committer",
        "listeners",
        "_gate",
        "_query",
        "_mailbox",
        "_reporter",
    )

    def __getstate__(self) -> dict[str, object]:
        state = {k: v for k, v in self.__dict__.items() if k not in self._DRIVER_ONLY}
        state["checkpoint"] = CheckpointLog(None, self.config.checkpoint, lazy_spark=True)
        # The engines hold this process's session (the delta-spark sink, its tables): the
        # batch function's process builds its own on its own session (_bind), keeping where
        # each table stands.
        state["tables"] = [replace(run, engine=None, dead_letters=None) for run in self.tables]
        state["engine"] = state["dead_letters"] = None
        return state

    def _bind(self, spark: SparkSession) -> None:
        """In the Connect server's process, at the first batch: the session, and the engine
        parts built on it, as the run's own process built them."""
        self.spark = spark
        self.checkpoint.spark = spark
        source = build_source(self.config)
        for run in self.tables:
            run.engine, run.dead_letters = _engine_parts(spark, run.config, source)
        self.engine = self.tables[0].engine
        self.dead_letters = self.tables[0].dead_letters

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.spark = None  # type: ignore[assignment]  (each batch's DataFrame brings it)
        self.admin = KafkaAdmin(self.config.kafka.client_config())
        self.committer = None
        self.listeners = []
        self._gate = StopGate()
        self._query = None
        self._reporter = None
        self._mailbox = BatchMailbox(self.config.checkpoint, self.run_id)
        self._worker = True

    # -- set-up -----------------------------------------------------------------------------

    @property
    def query_name(self) -> str:
        # One name per pipeline and checkpoint: Spark refuses two active queries of one name.
        digest = hashlib.sha1(self.config.checkpoint.encode()).hexdigest()[:8]
        return f"kafka-delta-{self.config.pipeline_id}-{digest}"

    def _resume_planner(self) -> ResumePlanner:
        return ResumePlanner(
            self.config, self.checkpoint, self.admin, self.tables, self.engine.source
        )

    def resume_point(self, planner: ResumePlanner | None = None) -> StoredOffsets | None:
        """Stored offsets to start from when the checkpoint is new, after judging the
        checkpoint against the tables (:class:`.resume.ResumePlanner`): one the tables moved
        past is set aside (:attr:`set_aside_as`) and the run resumes from the tables, one ahead
        of them without explanation stops."""
        resume = (planner or self._resume_planner()).plan()
        self._topic_ids = resume.topic_ids
        if resume.recreated:
            self._recreated, self._recreated_from = resume.recreated, resume.recreated_from
        if resume.set_aside_as is not None:
            self.set_aside_as = resume.set_aside_as
        return resume.stored

    @property
    def sink(self) -> Sink:
        return self.engine.sink

    @property
    def dead_letter_sink(self) -> Sink | None:
        return self.engine.dead_letter_sink

    def start(self) -> StreamingQuery:
        planner = self._resume_planner()
        stored = self.resume_point(planner)
        self._initial = stored.offsets if stored is not None else {}
        self._known = {t: dict(parts) for t, parts in self._initial.items()}
        planner.place_tables(self._initial)
        planner.log_start(stored)
        if self.committer is None and self.config.commit_back.enabled:
            self.committer = OffsetCommitter(
                self.config.kafka.client_config(),
                self.config.kafka.consumer_group,
                timeout_s=self.config.commit_back.timeout_seconds,
            )
        if self.committer is not None and stored is not None:
            # Align the group with the table at once: after a run whose commit-back failed,
            # lag tools are right again before the first new batch.
            self.committer.submit(
                -1 if stored.batch_id is None else stored.batch_id, stored.offsets
            )
        decode = None
        if self.config.decoding.value.format != "raw":
            # Only then: a project on raw bytes never imports the decoders' libraries.
            from kafka_delta.decoding.resolve import build_decode_spec

            value = self.config.decoding.value
            columns = (
                self.engine.sink.columns()
                if value.format == "protobuf" and not value.message and not self._message_seen
                else None
            )  # a table that exists says which protobuf message it takes
            decode = build_decode_spec(
                self.spark, self.config, self._writer_schema_ids, self._message_seen, columns
            )
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
            topic_ids=self._topic_ids,
        )
        if self.config.trigger.mode == "available_now":
            self._target = self.admin.latest(self.admin.partitions(self.config.kafka.topics))
        if self.remote:
            self._mailbox = BatchMailbox(self.config.checkpoint, self.run_id)
            self._mailbox.clear()
        # Under Spark Connect the batch function is pickled here, with the state set above.
        writer = (
            stream.writeStream.queryName(self.query_name)
            .option("checkpointLocation", self.config.checkpoint)
            .foreachBatch(self._gated_batch)
        )
        trigger = self.config.trigger
        if trigger.mode == "available_now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{trigger.interval_seconds} seconds")
        if trigger.idle_poll is not None:
            # Interval 0: Spark asks the source again this long after finding nothing new (its
            # own 10 ms cost an idle run 15-20% of a core); read as the query starts.
            self.spark.conf.set(POLLING_DELAY, f"{max(1, round(trigger.idle_poll * 1000))}ms")
        try:
            self._query = writer.start()
        except Exception as exc:
            refused = trigger_refused(exc, self.config.trigger.mode)
            if refused is not None:
                raise TriggerNotSupportedError(refused) from None
            raise
        return self._query

    # -- the micro-batch --------------------------------------------------------------------

    def _query_id(self, df: DataFrame) -> str:
        """The checkpoint's query id: Spark's local property inside foreachBatch, else (Spark
        Connect has no SparkContext) the id stored in the checkpoint's metadata file."""
        return streaming_query_id(df.sparkSession) or self.checkpoint.query_id() or ""

    def _batch_start(self, batch_id: int, end: Offsets) -> Offsets:
        """Where the batch really begins, as the checkpoint planned it: the previous batch's
        planned end; for batch 0, the initial offsets the source persisted in the checkpoint
        (Spark's kafka source), else the offsets the table held when this run started (the
        embedded source plans batch 0 from exactly those).

        A partition the previous plan does not name (a topic or partition new to the
        checkpoint) starts where the source starts it: the embedded source at the offset the
        table stores for it, Spark's kafka source at the earliest offset Kafka has.
        """
        if batch_id == 0:
            start = self.checkpoint.initial_offsets() or self._initial
        else:
            start = self.checkpoint.end_offsets(batch_id - 1)
        new = {
            t: [p for p in parts if p not in start.get(t, {}) and p in self._initial.get(t, {})]
            for t, parts in end.items()
        }
        new = {t: parts for t, parts in new.items() if parts}
        if not new:
            return start
        if self.engine.source.new_partitions_start_at_stored_offsets:
            firsts = {t: {p: self._initial[t][p] for p in parts} for t, parts in new.items()}
        else:
            firsts = self.admin.watermarks(new).earliest
        merged = {t: dict(parts) for t, parts in start.items()}
        for t, parts in firsts.items():
            merged.setdefault(t, {}).update(parts)
        return merged

    def _ends_before(self, rewound: Iterable[tuple[str, int]]) -> Offsets:
        """Where the stored offsets of the ``rewound`` partitions stood before the move back."""
        before: Offsets = {}
        for t, p in rewound:
            offset = self._recreated_from.get(t, {}).get(p, self._known.get(t, {}).get(p))
            if offset is not None:
                before.setdefault(t, {})[p] = offset
        return before

    def _rewound(self, end: Offsets) -> tuple[tuple[str, int], ...]:
        """Partitions the batch moves below the offsets the pipeline stored, allowed only where
        Kafka no longer has the stored position (the topic was deleted and recreated, which the
        source's data-loss guard already reported) and ``kafka.fail_on_data_loss`` is off.
        Anywhere else a move backwards is a stale plan, and the sink refuses it."""
        # A recreated topic starts over: its first batch neither starts nor ends where the old
        # topic's offsets are stored.
        recreated = [(t, p) for t, parts in end.items() if t in self._recreated for p in parts]
        if self.config.kafka.fail_on_data_loss:
            return tuple(sorted(recreated))
        behind = {
            t: [p for p, o in parts.items() if o < self._known.get(t, {}).get(p, o)]
            for t, parts in end.items()
        }
        behind = {t: parts for t, parts in behind.items() if parts}
        if not behind:
            return tuple(sorted(recreated))
        latest = self.admin.latest(behind)
        lost = [
            (t, p) for t, parts in behind.items() for p in parts if latest[t][p] < self._known[t][p]
        ]
        for t, p in lost:
            log.warning(
                "%s[%d] restarts at offset %d below the stored %d: Kafka's latest is %d (the "
                "topic was recreated) and kafka.fail_on_data_loss is off",
                t,
                p,
                end[t][p],
                self._known[t][p],
                latest[t][p],
            )
        rewound = tuple(sorted({*recreated, *lost}))
        return rewound

    def _current_topic_ids(self, end: Offsets) -> dict[str, str]:
        """Kafka's ids of the batch's topics, recorded in its commit; a topic deleted and
        created again while this run read it stops the batch before anything is written (the
        next start handles it as :mod:`kafka_delta.offsets.topic_identity` says).

        A source that checks the ids itself (the embedded source: in the one metadata request
        its planning makes per batch) planned this batch only if they were still the ones the
        run started with, so the ids come from here without a request: the batch's only Kafka
        round trip is then the lag's offsets (:meth:`_progress`)."""
        if getattr(self.engine.source, "checks_topic_ids", False):
            return {t: i for t, i in self._topic_ids.items() if t in end}
        current = self.admin.topic_ids(end)
        changed = sorted(
            t for t, i in current.items() if t in self._topic_ids and self._topic_ids[t] != i
        )
        if changed:
            raise recreated_while_running(changed)
        self._topic_ids.update(current)
        return {t: i for t, i in current.items() if t in end}

    def _gated_batch(self, df: DataFrame, batch_id: int) -> None:
        """The batch function Spark calls: :meth:`_process_batch`, and after it the query is
        stopped if a stop was requested (see :mod:`kafka_delta.runtime.graceful_stop`)."""
        if self.spark is None:  # in the Connect server's Python process
            self._bind(df.sparkSession)
        if self._worker:
            # A Connect batch DataFrame releases its server-side relation in __del__, by a call
            # to the server. Made as pyspark's worker drops the DataFrame after this function
            # returned, that call was seen to block for good under load (the worker, and the
            # query with it; most often on a replayed batch). Held here until the next batch,
            # the previous one is released during a batch, while the server serves this
            # function's calls; the last one goes with the query.
            self._held_batch = df
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
            end, shares = self._plan_ends(df, batch_id)
        with clock.step("check"):
            self._fence(shares)
        read = BatchRead(df, writing=sum(not s.replayed for s in shares))
        try:
            for n, share in enumerate(shares):
                if n:
                    # A crash here leaves the batch in the tables before this one only.
                    crash_point("between_tables")
                if not share.replayed:
                    self._write_table(share, read, clock)
        finally:
            read.release()
        crash_point("after_delta_commit")
        group = self._store_ends(shares, end)
        self._report(batch_id, shares, end, group, read.observation, started, clock)

    def _plan_ends(self, df: DataFrame, batch_id: int) -> tuple[Offsets, list[TableBatch]]:
        """The batch's end offsets, as the checkpoint planned them, and each table's share of
        the batch (:func:`.routing.table_batch`): the offsets it covers and the commit that
        records them."""
        end = self.checkpoint.end_offsets(batch_id)
        query_id = self._query_id(df)
        if not query_id:
            raise CheckpointMismatchError("cannot determine the streaming query id")
        commit = BatchCommit(
            pipeline_id=self.config.pipeline_id,
            app_id=app_id(self.config.pipeline_id, query_id),
            batch_id=batch_id,
            end_offsets=end,
            topic_ids=self._current_topic_ids(end),
        )
        rewound = self._rewound(end)
        if rewound:
            commit = replace(commit, rewound=rewound, rewound_from=self._ends_before(rewound))
        start = self._batch_start(batch_id, end)
        return end, [table_batch(run, commit, start, query_id, self.tables) for run in self.tables]

    def _fence(self, shares: Sequence[TableBatch]) -> None:
        """Fencing first, for every table, on the tables as they are now: a run that may not
        commit this batch stops here, and a table that has the batch (a replay) runs no task:
        nothing is read for it from Kafka, no data file and no dead letter is written."""
        for share in shares:
            run = share.run
            share.firsts = (
                joined_at(share.start, run.known)  # new to the pipeline: from where the stream is
                if run.joining
                else first_positions(self.admin, self.config, share.start, run.known)
            )
            share.replayed = run.engine.sink.check(share.commit, share.start, share.firsts)

    def _write_table(
        self, share: TableBatch, read: BatchRead, clock: StepClock | None = None
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
        run = share.run
        sink = run.engine.sink
        split = False
        while True:
            with clock.step("materialize"):
                records = without_held(
                    table_input(read.records, run, self.config.kafka.topics), share.skipped
                )
                out = self._transform(run, records)
                written = sink.materialize(out, split=split)
            try:
                with clock.step("materialize"):
                    share.dead_letters = self._send_dead_letters(share, records, written)
                crash_point("before_delta_commit")
                with clock.step("commit"):
                    share.result = self._commit(share, written)
                clock.add("read_back", share.result.read_back_s)
            except DeadLettersFound as found:
                if split:
                    raise
                log.info("%s%s", found, f" (table {run.name})" if run.name else "")
                split = True
                read.renew()
                with clock.step("check"):
                    share.replayed = sink.check(share.commit, share.start, share.firsts)
                if share.replayed:
                    return
                continue
            finally:
                written.release()
            break
        if share.result.written:
            run.joining = False

    def _transform(self, run: TableRun, records: DataFrame) -> DataFrame:
        """The rows table ``run`` receives: the rows read as deletes of their key as its own
        tombstones setting takes them, through the transform and the table's route
        (:func:`.routing.table_output`); of an upsert table, the latest row per key."""
        out = table_output(self.transform, key_deletes(records, run), run, self._names)
        self._check_positions(run, out)
        mode = run.config.delta
        if mode.mode == "upsert":
            out = out.transform(latest_per_key(mode.merge_keys, mode.order_by))
        return out

    @property
    def _names(self) -> list[str | None]:
        return [r.name for r in self.tables]

    @staticmethod
    def _send_dead_letters(share: TableBatch, records: DataFrame, written: Materialized) -> int:
        """The table's dead letters to its dead-letter table, before its own commit; found
        again by position in the records the table read. How many were sent."""
        if written.dead is None:
            return 0
        return share.run.dead_letters.send(records, written.dead, share.commit)

    @staticmethod
    def _commit(share: TableBatch, written: Materialized) -> SinkResult:
        """The table's one Delta commit of the batch: its rows, txn and offsets."""
        return share.run.engine.sink.commit_batch(
            written.rows, share.commit, start=share.start, firsts=share.firsts
        )

    def _store_ends(self, shares: Sequence[TableBatch], end: Offsets) -> Offsets:
        """Where each table stands after the batch, and the group's offsets: what every table
        that reads a partition holds (one table: the batch's end offsets)."""
        for share in shares:
            for topic, parts in share.commit.end_offsets.items():
                share.run.known.setdefault(topic, {}).update(parts)
        group = {
            t: {p: o for p, o in parts.items() if p in end.get(t, {})}
            for t, parts in group_offsets(self.tables).items()
            if t in end
        }
        if any(s.result.written for s in shares):
            self._recreated = set()  # the recreated topics' offsets are the new ones from now
        for topic, parts in group.items():
            self._known.setdefault(topic, {}).update(parts)
        return group

    def _report(
        self,
        batch_id: int,
        shares: Sequence[TableBatch],
        end: Offsets,
        group: Offsets,
        observation: Observation | None,
        started: float,
        clock: StepClock | None = None,
    ) -> None:
        """The batch's progress (each table's share, of several tables; its steps' times),
        then the commit back and the progress line (:meth:`_deliver`), in the process that
        started the run."""
        written = [s.result for s in shares if s.result.written]
        result = SinkResult(
            written=bool(written),
            rows=sum(r.rows for r in written),
            delta_version=written[-1].delta_version if written else None,
        )
        dead_letters = sum(s.dead_letters for s in shares)
        elapsed = time.perf_counter() - started
        # Each table's share, by the name its commits carry (one table's commits name none).
        tables = {
            s.run.commit_name: {
                "rows_written": s.result.rows,
                "dead_letters": s.dead_letters,
                "replayed": not s.result.written,
                "delta_version": s.result.delta_version,
            }
            for s in shares
            if s.run.commit_name is not None
        }

        def report() -> None:
            read = 0 if observation is None else records_read(observation)
            progress = self._progress(batch_id, read, result, dead_letters, end, elapsed)
            progress = replace(
                progress,
                tables=tables or None,
                steps=clock.figures() if clock is not None else None,
            )
            if self._worker:  # the Connect server's process: the run's own process delivers it
                assert self._mailbox is not None
                self._mailbox.post(BatchReport(progress, group))
            else:
                self._deliver(BatchReport(progress, group))

        if self._reporter is None:
            # The Connect server's process: the batch function's process may end with the
            # query, so its report is posted before the function returns.
            report()
        else:
            # Off the critical path (kafka_delta.progress.reporter): the next batch starts
            # while this one's count, lag, commit-back hand-off and progress line are done.
            self._reporter.submit(report)

    def _deliver(self, report: BatchReport) -> None:
        """What follows a committed batch in the process that started the run: the group's
        offsets to the commit-back hook, the run's figures, the progress line, the listeners.
        Called by the batch function itself on a classic session, and for each batch the
        Connect server's process reports (:meth:`_drain`)."""
        progress = report.progress
        hook_started = time.perf_counter()
        if self.committer is not None:
            self.committer.submit(progress.batch_id, report.group)
        hook_ms = (time.perf_counter() - hook_started) * 1000
        stats = self.committer.stats() if self.committer is not None else None
        progress = replace(
            progress,
            duration_s=progress.duration_s + hook_ms / 1000,  # the batch includes its hook
            commit_back_ok=stats.succeeded if stats else None,
            commit_back_failed=stats.failed if stats else None,
            hook_ms=hook_ms,
        )
        summary = self.summary
        summary.batches += 1
        summary.replayed_batches += 1 if progress.replayed else 0
        summary.rows_written += progress.rows_written
        summary.dead_letters += progress.dead_letters
        if progress.delta_version is not None:
            summary.last_delta_version = progress.delta_version
        summary.end_offsets = progress.end_offsets
        summary.commit_back_ms.add(hook_ms)
        summary.batch_seconds.add(progress.duration_s)
        if self.remote:
            self._gate.leave(progress.batch_id, succeeded=True)
        self._log_progress(progress)
        for listener in self.listeners:
            try:
                listener.on_batch(progress)
            except Exception as exc:  # monitoring must never fail a committed batch
                log.warning("progress listener %s failed: %s", type(listener).__name__, exc)

    def _drain(self) -> None:
        """Deliver the batches the Connect server's process reported since the last look."""
        if self._mailbox is None:
            return
        for report in self._mailbox.take():
            self._deliver(report)

    def _progress(
        self,
        batch_id: int,
        records_read: int | None,
        result: SinkResult,
        dead_letters: int,
        end: Offsets,
        elapsed: float,
    ) -> BatchProgress:
        """The batch's figures, built once: logged, then handed to the listeners (the
        commit-back's figures are filled in where the hook runs, :meth:`_deliver`)."""
        behind: Offsets | None = None
        lag_error: str | None = None
        try:
            behind = lag(self.admin.latest({t: sorted(parts) for t, parts in end.items()}), end)
        except Exception as exc:  # progress reporting must never fail a committed batch
            lag_error = str(exc)
        self._run_records_read += records_read or 0
        return BatchProgress(
            pipeline_id=self.config.pipeline_id,
            run_id=self.run_id,
            batch_id=batch_id,
            finished_at=time.time(),
            duration_s=elapsed,
            records_read=records_read,
            rows_written=result.rows,
            dead_letters=dead_letters,
            replayed=not result.written,
            delta_version=result.delta_version,
            end_offsets=end,
            lag=behind,
            lag_error=lag_error,
            to_target=None if self._target is None else total_records(end, self._target),
            run_records_read=self._run_records_read,
            commit_back_ok=None,
            commit_back_failed=None,
            hook_ms=0.0,
        )

    def _log_progress(self, p: BatchProgress) -> None:
        behind = p.behind_latest if p.lag is not None else f"unknown ({p.lag_error})"
        read = "unknown" if p.records_read is None else p.records_read
        # Run until caught up: how far along this run is, as it goes.
        target = (
            f" to_target={p.to_target} done={100 * p.target_done:.0f}%"
            if p.to_target is not None and p.target_done is not None
            else ""
        )
        back = (
            f"commit_back_ok={'off' if p.commit_back_ok is None else p.commit_back_ok} "
            f"commit_back_failed={'off' if p.commit_back_failed is None else p.commit_back_failed}"
        )
        if p.replayed:
            # I2: the batch is already in the table (a restart after the Delta commit and
            # before Spark's); its dead letters were committed before it, or not needed.
            log.info(
                "replayed batch %d: nothing written (already in the table) records_read=%s "
                "behind_latest=%s%s %s",
                p.batch_id,
                read,
                behind,
                target,
                back,
            )
            return
        log.info(
            "batch=%d records_read=%s rows_written=%d dead_letters=%d records_per_s=%.0f "
            "delta_version=%s behind_latest=%s%s %s hook_ms=%.2f%s%s",
            p.batch_id,
            read,
            p.rows_written,
            p.dead_letters,
            p.records_per_s,
            p.delta_version,
            behind,
            target,
            back,
            p.hook_ms,
            steps_text(p.steps),
            _per_table(p),
        )

    def _check_positions(self, run: TableRun, out: DataFrame) -> None:
        """At a run's first batch, warn when the transform's rows for ``run`` lack ``topic``,
        ``partition`` or ``offset``. Exactly once does not rest on them (the offsets ride in the
        commit), and a table of aggregates or of one row per key may rightly drop them, so this
        warns rather than refuses; but without them ``offsets verify`` cannot audit the rows,
        and once Delta log cleanup removed the commits that name the stored offsets, a lost
        checkpoint resumes only after ``offsets reset --to-offsets`` (offsets.stored)."""
        if run.label in self._positions_checked:
            return
        self._positions_checked.add(run.label)
        missing = [c for c in POSITION_COLUMNS if c not in out.columns]  # the schema: no job
        if missing:
            of = f" for table {run.name}" if run.name else ""
            log.warning(
                "the transform's rows%s lack %s: they carry no Kafka position, so `offsets "
                "verify` cannot audit them, and after Delta log cleanup a lost checkpoint "
                "resumes only with `offsets reset --to-offsets`; keep %s in the transform's "
                "output unless the table is meant to hold none (aggregates)",
                of,
                ", ".join(missing),
                "them" if len(missing) > 1 else "it",
            )

    # -- running ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop after the current micro-batch (safe from a signal handler)."""
        self._gate.request()

    def run(self) -> RunSummary:
        # The run lease tells `offsets reset` (another process) that this pipeline is running.
        # Of several tables, each holds it: a reset of any one of them sees the run.
        with ExitStack() as leases:
            for run in self.tables:
                leases.enter_context(
                    RunLease.hold(run.config, lambda: self._query.id if self._query else None)
                )
            return self._run()

    def _run_query(self, query: StreamingQuery) -> None:
        try:
            while query.isActive:
                self._drain()
                if self._gate.requested and self._safe_to_stop(query):
                    break
                # Once stopping, look often: the gap between Spark recording a batch and
                # planning the next one is where the stop belongs.
                wait = 0.005 if self._gate.requested else 0.5
                if self.remote:
                    # Waited here rather than in the server: a Connect client's timed
                    # awaitTermination is a server-side command whose response stream was seen
                    # to hang for good when the server cut it (INVALID_CURSOR.DISCONNECTED).
                    time.sleep(wait)
                else:
                    query.awaitTermination(wait)
            try:
                query.awaitTermination()  # re-raises the query's failure, if any
            except Exception as exc:
                if not self._gate.stopped_by_gate(exc):
                    raise
                log.info("a batch planned while stopping was left for the next run")
        finally:
            self._drain()

    def _safe_to_stop(self, query: StreamingQuery) -> bool:
        """The stop gate's decision. Under Spark Connect the batch function runs in another
        process, whose gate this one cannot see: a batch counts as in progress while Spark
        says a trigger is active (a stop that races a trigger's start interrupts that batch,
        which the next run replays exactly once: I1, I2)."""
        if self.remote:
            try:
                if query.status.get("isTriggerActive"):
                    return False
            except Exception:  # the query just ended: awaitTermination says how
                return True
        return self._gate.stop_when_safe(query)

    def _restart_after(
        self, exc: Exception, registry_waits: Iterator[float], outage: KafkaOutage
    ) -> bool:
        """Whether the query that failed with ``exc`` starts again in this run. The batch it
        failed in committed nothing (decoding runs before the commit), so Spark plans it again
        from the checkpoint's offset log, and it lands exactly once:

        - the producers' schema gained fields (delta.schema_evolution: add_columns): the
          query restarts with a reader schema that holds them; the sink adds the columns;
        - Protobuf records carry another message than the file's default the reader guessed
          (no ``message:``): the query restarts with the columns of the message they carry;
        - the Schema Registry is unreachable: the query restarts after a wait that grows,
          until the waits are used up (then the run stops with the registry's sentence);
        - Kafka is unavailable (:mod:`kafka_delta.kafka.outage`): the same, until the outage
          lasted ``kafka.unavailable_timeout_seconds``; then this raises its sentence.
        """
        if self._gate.requested:
            return False
        changed = schema_changed(exc)
        if changed is not None and self.config.delta.schema_evolution == "add_columns":
            fields, schema_id = changed
            if schema_id is not None and schema_id in self._writer_schema_ids:
                return False  # the wider schema did not take: never loop
            if schema_id is not None:
                self._writer_schema_ids.add(schema_id)
            log.warning(
                "the producers' schema gained field(s) %s%s: the batch was not committed; "
                "restarting the query with them (delta.schema_evolution: add_columns)",
                ", ".join(fields),
                "" if schema_id is None else f" (schema id {schema_id})",
            )
            return True
        seen = message_seen(exc)
        if seen is not None:
            if self._message_seen is not None:
                return False  # the reader already follows the records: never loop
            self._message_seen = seen
            log.warning(
                "the records carry protobuf message %s, not the file's default the columns "
                "were made from: the batch was not committed; restarting the query with the "
                "columns of %s (set decoding.value.message to choose)",
                seen,
                seen,
            )
            return True
        down = registry_down(exc)
        if down is not None:
            wait = next(registry_waits, None)
            if wait is None:
                return False
            log.warning("%s: the batch was not committed; retrying in %.0f s", down, wait)
            return not self._gate.wait(wait)  # a stop requested while waiting ends the run
        unreachable = kafka_down(exc)
        if unreachable is not None:
            wait = outage.next_wait()
            if wait is None:
                raise outage.gave_up(unreachable) from exc
            outage.retrying(unreachable, wait)
            return not self._gate.wait(wait)
        return False

    def _compaction(self) -> RunCompaction | None:
        """The run's own compaction of its tables and dead-letter tables
        (maintenance.compact_every_seconds), started; None when the config says never."""
        every = self.config.maintenance.compact_every_seconds
        if not every:
            return None
        sink, views = self.config.engine.sink, [run.config for run in self.tables]

        def place(view: PipelineConfig, uri: str) -> tuple[str, Maintainer]:
            return uri, maintainer_for(sink, view.delta.storage_options, self.spark)

        appended = [view for view in views if view.delta.mode == "append"]
        for view in views:
            if view not in appended:
                log.info(
                    "table %s is not compacted by the run (an upsert table): a batch's MERGE "
                    "that read the files a compaction rewrites would lose its commit; "
                    "`table maintain` compacts it",
                    view.delta.table,
                )
        tables = [place(view, view.delta.table) for view in appended]
        # Dead-letter tables are only appended to, whatever their table's mode.
        dead = [place(view, view.dead_letter_table) for view in views if view.dead_letter_table]
        # Each location once (tables may share a dead-letter table), the tables first.
        places = list(dict(tables + dead).items())
        return RunCompaction(every, places).start() if places else None

    def _run(self) -> RunSummary:
        if self._gate.requested:
            log.info("stop requested before the query started: nothing to do")
            return self.summary
        registry = self.config.decoding.schema_registry
        backoff = registry_backoff(registry.retry_seconds if registry else 0)
        registry_waits, committed = iter(backoff), 0
        kafka = self.config.kafka
        outage = KafkaOutage(kafka.bootstrap_servers, kafka.unavailable_timeout_seconds)
        self._reporter = BatchReporter()
        compaction = self._compaction()
        try:
            while True:
                began, query = time.monotonic(), None
                try:
                    query = self.start()
                    self._run_query(query)
                    return self.summary
                except Exception as exc:
                    # Batches went through since the last outage, or the query got through a
                    # trigger (a quiet topic has no batch): a new outage gets every wait. Not
                    # the time an attempt took: one that waits out the clients' own timeouts
                    # (30 s for a metadata request, a read task's poll) longer than
                    # kafka.unavailable_timeout_seconds would start the outage over forever.
                    progressed = got_through_a_trigger(query)
                    if (
                        self.summary.batches > committed
                        or progressed
                        or (
                            progressed is None
                            and time.monotonic() - began > kafka.unavailable_timeout_seconds
                        )
                    ):
                        registry_waits, committed = iter(backoff), self.summary.batches
                        outage = KafkaOutage(
                            kafka.bootstrap_servers, kafka.unavailable_timeout_seconds
                        )
                    if not self._restart_after(exc, registry_waits, outage):
                        raise
        finally:
            if compaction is not None:
                compaction.close()
            # Every committed batch reported (the group's offsets submitted) before the hook's
            # last flush.
            self._reporter.close()
            self._reporter = None
            if self.committer is not None:
                self.summary.commit_back = self.committer.close()
            for listener in self.listeners:
                try:
                    listener.on_run_end(self.summary.commit_back)
                except Exception as exc:
                    log.warning("progress listener %s failed: %s", type(listener).__name__, exc)
