"""A run's progress: what follows each committed batch, and the run's figures.

Once a batch's Delta commit has landed, the pipeline (:class:`~kafka_delta.pipeline.Pipeline`)
hands it here (:meth:`RunProgress.report`): the batch's figures (:class:`.batch.BatchProgress`),
then, in the process that started the run, the group's offsets to the commit-back hook (I4),
the run's figures (:class:`.summary.RunSummary`), the progress line and the listeners
(:meth:`RunProgress._deliver`). On a classic session that is done off the batch's critical path
(:mod:`.reporter`); under Spark Connect the batch function's process posts it (:mod:`.mailbox`)
and the run's process takes it while it waits for the query (:meth:`RunProgress.drain`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from kafka_delta.engine import SinkResult
from kafka_delta.kafka.admin import KafkaAdmin, lag
from kafka_delta.kafka.commit_back import OffsetCommitter
from kafka_delta.offsets.model import Offsets, StoredOffsets, total_records
from kafka_delta.progress.batch import BatchProgress, ProgressListener, StepClock, steps_text
from kafka_delta.progress.mailbox import BatchMailbox, BatchReport
from kafka_delta.progress.reporter import BatchReporter
from kafka_delta.progress.summary import RunSummary

if TYPE_CHECKING:
    from pyspark.sql import Observation

    from kafka_delta.config import PipelineConfig
    from kafka_delta.routing import TableBatch
    from kafka_delta.runtime.graceful_stop import StopGate

# The progress line is the pipeline's: log configs, tools and the chaos harness select it by
# that logger.
log = logging.getLogger("kafka_delta.pipeline")


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


class RunProgress:
    """The progress of one run of a pipeline: each committed batch's report, the commit-back
    hook, the progress line, the listeners and the run's summary.

    ``admin``: the pipeline's Kafka admin client (the lag); ``gate``: its stop gate (under Spark
    Connect a batch counts as finished once its report arrived); ``committer``: the commit-back
    hook (None: started with the query when ``commit_back.enabled``); ``listeners`` receive each
    batch's :class:`~.batch.BatchProgress` (metrics, the progress file)."""

    def __init__(
        self,
        config: PipelineConfig,
        admin: KafkaAdmin,
        gate: StopGate,
        *,
        committer: OffsetCommitter | None = None,
        listeners: Sequence[ProgressListener] = (),
        remote: bool = False,
    ) -> None:
        self.config = config
        self.admin = admin
        self.gate = gate
        self.committer: OffsetCommitter | None = committer
        self.listeners = list(listeners)
        self.remote = remote
        self.summary = RunSummary()
        # Tells this run's lines apart from other runs' in the progress file.
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        # Run until caught up (trigger.mode: available_now): the latest offsets when the query
        # started, how far along this run is measured against.
        self.target: Offsets | None = None
        self._run_records_read = 0
        # Spark Connect: the batch function's process reports each batch through the checkpoint
        # location (kafka_delta.progress.mailbox); see __getstate__.
        self._mailbox: BatchMailbox | None = None
        self._worker = False  # True in the batch function's copy in the Connect server
        # Reports committed batches in order, off their critical path, while the run lasts.
        self._reporter: BatchReporter | None = None

    # -- Spark Connect: the batch function in the server's Python process -------------------

    # What only the process that started the run holds (kafka_delta.runtime.connect_server_copy
    # says why): its Kafka clients, its listeners and stop gate, the reporter.
    _DRIVER_ONLY = ("admin", "gate", "committer", "listeners", "_mailbox", "_reporter")

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k not in self._DRIVER_ONLY}

    def __setstate__(self, state: dict[str, object]) -> None:
        """In the batch function's process under Spark Connect: each batch is posted to the
        run's process (:class:`~.mailbox.BatchMailbox`); :meth:`attach` gives it that process's
        Kafka admin client and stop gate."""
        self.__dict__.update(state)
        self.admin = None  # type: ignore[assignment]  (attach)
        self.gate = None  # type: ignore[assignment]  (attach)
        self.committer = None
        self.listeners = []
        self._reporter = None
        self._mailbox = BatchMailbox(self.config.checkpoint, self.run_id)
        self._worker = True

    def attach(self, admin: KafkaAdmin, gate: StopGate) -> None:
        """The Kafka admin client and the stop gate of the process this copy runs in."""
        self.admin = admin
        self.gate = gate

    # -- the run ----------------------------------------------------------------------------

    def start_commit_back(self, stored: StoredOffsets | None) -> None:
        """At the query's start: the commit-back hook (``commit_back.enabled``), and the group
        aligned with the table's ``stored`` offsets."""
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

    def query_starts(self) -> None:
        """As the query starts: of a run until caught up, the latest offsets now (its
        :attr:`target`); under Spark Connect, where the batch function's process posts each
        batch, emptied of what an earlier start of this run left."""
        if self.config.trigger.mode == "available_now":
            self.target = self.admin.latest(self.admin.partitions(self.config.kafka.topics))
        if self.remote:
            self._mailbox = BatchMailbox(self.config.checkpoint, self.run_id)
            self._mailbox.clear()

    def open(self) -> None:
        """The run begins: committed batches are reported off their critical path."""
        self._reporter = BatchReporter()

    def close(self) -> None:
        """The run ends: every committed batch reported (the group's offsets submitted) before
        the hook's last flush; then the listeners hear that the run ended."""
        if self._reporter is not None:
            self._reporter.close()
            self._reporter = None
        if self.committer is not None:
            self.summary.commit_back = self.committer.close()
        for listener in self.listeners:
            try:
                listener.on_run_end(self.summary.commit_back)
            except Exception as exc:
                log.warning("progress listener %s failed: %s", type(listener).__name__, exc)

    def flush(self) -> None:
        """Wait until every batch committed so far is reported (see
        :meth:`.reporter.BatchReporter.flush`)."""
        if self._reporter is not None:
            self._reporter.flush()

    # -- each batch -------------------------------------------------------------------------

    def report(
        self,
        batch_id: int,
        table_batches: Sequence[TableBatch],
        end: Offsets,
        group: Offsets,
        observation: Observation | None,
        started: float,
        clock: StepClock | None = None,
    ) -> None:
        """The batch's progress (each table's share, of several tables; its steps' times),
        then the commit back and the progress line (:meth:`_deliver`), in the process that
        started the run."""
        written = [
            table_batch.result for table_batch in table_batches if table_batch.result.written
        ]
        result = SinkResult(
            written=bool(written),
            rows=sum(r.rows for r in written),
            delta_version=written[-1].delta_version if written else None,
        )
        dead_letters = sum(table_batch.dead_letters for table_batch in table_batches)
        elapsed = time.perf_counter() - started
        # Each table's share, by the name its commits carry (one table's commits name none).
        tables = {
            table_batch.run.commit_name: {
                "rows_written": table_batch.result.rows,
                "dead_letters": table_batch.dead_letters,
                "replayed": not table_batch.result.written,
                "delta_version": table_batch.result.delta_version,
            }
            for table_batch in table_batches
            if table_batch.run.commit_name is not None
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
        Connect server's process reports (:meth:`drain`)."""
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
            self.gate.leave(progress.batch_id, succeeded=True)
        self._log_progress(progress)
        for listener in self.listeners:
            try:
                listener.on_batch(progress)
            except Exception as exc:  # monitoring must never fail a committed batch
                log.warning("progress listener %s failed: %s", type(listener).__name__, exc)

    def drain(self) -> None:
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
            to_target=None if self.target is None else total_records(end, self.target),
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
