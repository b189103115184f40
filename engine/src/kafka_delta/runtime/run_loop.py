"""A run of a pipeline: its streaming query, started again after the failures a run rides out.

:meth:`kafka_delta.pipeline.Pipeline.run` hands over to :class:`RunLoop`, which holds the run
lease of each table (:mod:`kafka_delta.recovery.lease`), starts the run's own compaction
(:mod:`.compaction`), starts the query and waits for it while the run's progress is delivered
(:mod:`kafka_delta.progress.run_progress`), stops it between batches when asked
(:mod:`.graceful_stop`), and starts it again after a failure that committed nothing and that
waiting or a wider reader schema mends (:meth:`RunLoop._restart_after`): the producers' schema
gained fields, Protobuf records carry another message, the Schema Registry or Kafka
(:mod:`kafka_delta.kafka.outage`) is unreachable for a while.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING

from kafka_delta.decoding.failures import message_seen, registry_down, schema_changed
from kafka_delta.delta.maintenance import Maintainer, maintainer_for
from kafka_delta.kafka.jvm_refusals import refused
from kafka_delta.kafka.outage import KafkaOutage, got_through_a_trigger, kafka_down
from kafka_delta.kafka.refusals import KafkaRefusedError
from kafka_delta.recovery.lease import RunLease
from kafka_delta.runtime.compaction import RunCompaction
from kafka_delta.runtime.spark_session import session_of_its_own

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from kafka_delta.config import PipelineConfig
    from kafka_delta.decoding.spec import DecodeSpec
    from kafka_delta.progress.run_progress import RunProgress
    from kafka_delta.progress.summary import RunSummary
    from kafka_delta.routing import TableRun
    from kafka_delta.runtime.graceful_stop import StopGate

# The run's lines are the pipeline's: log configs and tools select them by its logger.
log = logging.getLogger("kafka_delta.pipeline")


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


# Spark's pause before it asks a streaming source again after it had nothing new.
POLLING_DELAY = "spark.sql.streaming.pollingDelay"


def query_name(config: PipelineConfig) -> str:
    """The pipeline's query name: one per pipeline and checkpoint (Spark refuses two active
    queries of one name)."""
    digest = hashlib.sha1(config.checkpoint.encode()).hexdigest()[:8]
    return f"kafka-delta-{config.pipeline_id}-{digest}"


def start_query(
    stream: DataFrame,
    spark: SparkSession,
    config: PipelineConfig,
    batch_function: Callable[[DataFrame, int], None],
) -> StreamingQuery:
    """The pipeline's query on ``stream``, on the checkpoint and trigger the config names:
    ``batch_function`` runs each micro-batch. A trigger the compute refuses stops the run with
    :class:`TriggerNotSupportedError`."""
    writer = (
        stream.writeStream.queryName(query_name(config))
        .option("checkpointLocation", config.checkpoint)
        .foreachBatch(batch_function)
    )
    trigger = config.trigger
    if trigger.mode == "available_now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger.interval_seconds} seconds")
    if trigger.idle_poll is not None:
        # Interval 0: Spark asks the source again this long after finding nothing new (its
        # own 10 ms cost an idle run 15-20% of a core); read as the query starts.
        spark.conf.set(POLLING_DELAY, f"{max(1, round(trigger.idle_poll * 1000))}ms")
    try:
        return writer.start()
    except Exception as exc:
        refused = trigger_refused(exc, trigger.mode)
        if refused is not None:
            raise TriggerNotSupportedError(refused) from None
        raise


class RunLoop:
    """Runs one pipeline's streaming query until it is caught up (availableNow) or until
    :meth:`request_stop` (processing time), starting it again where a failure allows; either
    way the run's progress is complete and the commit-back hook flushed when it returns.

    ``tables``: the pipeline's tables (their configs: the leases, the compaction); ``gate``: the
    stop gate the batch function passes through; ``progress``: the run's progress and summary;
    ``remote``: a Spark Connect session (the batch function runs in another process)."""

    def __init__(
        self,
        spark: SparkSession,
        config: PipelineConfig,
        tables: Sequence[TableRun],
        gate: StopGate,
        progress: RunProgress,
        *,
        remote: bool = False,
    ) -> None:
        self.spark = spark
        self.config = config
        self.tables = tables
        self.gate = gate
        self.progress = progress
        self.remote = remote
        # Writer schemas (registry ids) seen in records whose fields the decoder's reader
        # schema lacked: the next query's reader schema includes them (schema evolution).
        self.writer_schema_ids: set[int] = set()
        # Protobuf without `message:`: the message the records were found to carry, the
        # reader's from then on in this run (the file's default is a guess until then).
        self.message_seen: str | None = None

    def decode_spec(
        self, table_columns: Callable[[], Iterable[str] | None] | None = None
    ) -> DecodeSpec | None:
        """The reader schema of the query as it starts (again), with what the restarts learnt:
        the writer schemas seen, the protobuf message the records carry
        (:func:`kafka_delta.decoding.resolve.build_decode_spec`; ``table_columns``: the table's,
        a table that exists says which protobuf message it takes). None: raw bytes."""
        if self.config.decoding.value.format == "raw":
            return None
        # Only then: a project on raw bytes never imports the decoders' libraries.
        from kafka_delta.decoding.resolve import build_decode_spec

        return build_decode_spec(
            self.spark, self.config, self.writer_schema_ids, self.message_seen, table_columns
        )

    def request_stop(self) -> None:
        """Stop after the current micro-batch (safe from a signal handler)."""
        self.gate.request()

    def run(
        self, start: Callable[[], StreamingQuery], query_id: Callable[[], str | None]
    ) -> RunSummary:
        """``start`` starts the query (the pipeline's, each time it starts again); ``query_id``:
        the running query's id, as the run lease shows it."""
        # The run lease tells `offsets reset` (another process) that this pipeline is running.
        # Of several tables, each holds it: a reset of any one of them sees the run.
        with ExitStack() as leases:
            for run in self.tables:
                leases.enter_context(RunLease.hold(run.config, query_id))
            return self._run(start)

    def _run_query(self, query: StreamingQuery) -> None:
        try:
            while query.isActive:
                self.progress.drain()
                if self.gate.requested and self._safe_to_stop(query):
                    break
                # Once stopping, look often: the gap between Spark recording a batch and
                # planning the next one is where the stop belongs.
                wait = 0.005 if self.gate.requested else 0.5
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
                if not self.gate.stopped_by_gate(exc):
                    raise
                log.info("a batch planned while stopping was left for the next run")
        finally:
            self.progress.drain()

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
        return self.gate.stop_when_safe(query)

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
        if self.gate.requested:
            return False
        changed = schema_changed(exc)
        if changed is not None and self.config.delta.schema_evolution == "add_columns":
            fields, schema_id = changed
            if schema_id is not None and schema_id in self.writer_schema_ids:
                return False  # the wider schema did not take: never loop
            if schema_id is not None:
                self.writer_schema_ids.add(schema_id)
            log.warning(
                "the producers' schema gained field(s) %s%s: the batch was not committed; "
                "restarting the query with them (delta.schema_evolution: add_columns)",
                ", ".join(fields),
                "" if schema_id is None else f" (schema id {schema_id})",
            )
            return True
        seen = message_seen(exc)
        if seen is not None:
            if self.message_seen is not None:
                return False  # the reader already follows the records: never loop
            self.message_seen = seen
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
            return not self.gate.wait(wait)  # a stop requested while waiting ends the run
        unreachable = kafka_down(exc)
        if unreachable is not None:
            wait = outage.next_wait()
            if wait is None:
                raise outage.gave_up(unreachable) from exc
            outage.retrying(unreachable, wait)
            return not self.gate.wait(wait)
        return False

    def _compaction(self) -> RunCompaction | None:
        """The run's own compaction of its tables and dead-letter tables
        (maintenance.compact_every_seconds), started; None when the config says never."""
        every = self.config.maintenance.compact_every_seconds
        if not every:
            return None
        sink, views = self.config.engine.sink, [run.config for run in self.tables]
        appended = [view for view in views if view.delta.mode == "append"]
        for view in views:
            if view not in appended:
                log.info(
                    "table %s is not compacted by the run (an upsert table): a batch's MERGE "
                    "that read the files a compaction rewrites would lose its commit; "
                    "`table maintain` compacts it",
                    view.delta.table,
                )
        tables = [(view, view.delta.table) for view in appended]
        # Dead-letter tables are only appended to, whatever their table's mode.
        dead = [(view, view.dead_letter_table) for view in views if view.dead_letter_table]
        # Each location once (tables may share a dead-letter table), the tables first.
        places = list({uri: view for view, uri in tables + dead}.items())
        if not places:
            return None
        # delta-spark's compaction runs in a session of its own: a batch's MERGE sets its txn
        # and record as session confs, which an OPTIMIZE in the batch's session would commit
        # with (kafka_delta.runtime.spark_session.session_of_its_own).
        session = self.spark if sink == "delta_rs" else session_of_its_own(self.spark)
        if session is None:
            log.warning(
                "the run does not compact its tables: it needs a Spark session of its own "
                "beside the batches'; `table maintain` compacts them"
            )
            return None
        maintained: list[tuple[str, Maintainer]] = [
            (uri, maintainer_for(sink, view.delta.storage_options, session)) for uri, view in places
        ]
        return RunCompaction(every, maintained).start()

    def _run(self, start: Callable[[], StreamingQuery]) -> RunSummary:
        summary = self.progress.summary
        if self.gate.requested:
            log.info("stop requested before the query started: nothing to do")
            return summary
        registry = self.config.decoding.schema_registry
        backoff = registry_backoff(registry.retry_seconds if registry else 0)
        registry_waits, committed = iter(backoff), 0
        kafka = self.config.kafka
        outage = KafkaOutage(kafka.bootstrap_servers, kafka.unavailable_timeout_seconds)
        self.progress.open()
        compaction = self._compaction()
        try:
            while True:
                began, query = time.monotonic(), None
                try:
                    query = start()
                    self._run_query(query)
                    return summary
                except Exception as exc:
                    # Kafka answered and refused (a login, a handshake, an ACL; the Java
                    # client's of Spark's kafka source too): the settings must change, so the
                    # run stops with the sentence, never waiting it out as an outage.
                    refusal = refused(exc, kafka)
                    if refusal is not None:
                        raise KafkaRefusedError(refusal) from None
                    # Batches went through since the last outage, or the query got through a
                    # trigger (a quiet topic has no batch): a new outage gets every wait. Not
                    # the time an attempt took: one that waits out the clients' own timeouts
                    # (30 s for a metadata request, a read task's poll) longer than
                    # kafka.unavailable_timeout_seconds would start the outage over forever.
                    progressed = got_through_a_trigger(query)
                    if (
                        summary.batches > committed
                        or progressed
                        or (
                            progressed is None
                            and time.monotonic() - began > kafka.unavailable_timeout_seconds
                        )
                    ):
                        registry_waits, committed = iter(backoff), summary.batches
                        outage = KafkaOutage(
                            kafka.bootstrap_servers, kafka.unavailable_timeout_seconds
                        )
                    if not self._restart_after(exc, registry_waits, outage):
                        raise
        finally:
            if compaction is not None:
                compaction.close()
            # Every committed batch reported (the group's offsets submitted) before the hook's
            # last flush; then the listeners hear that the run ended.
            self.progress.close()
