"""Rows 5, 7 and 10: the generated pipeline with its exactly-once machinery left out (no stored
offsets, no fencing, no commit-back), so the bench can measure what that machinery costs, and
with nothing written at all (row 10).

- Row 5 (delta-rs sink): no txn either.
- Row 7 (delta-spark sink): the idempotent write Databricks documents for ``foreachBatch``,
  ``batch_df.write.format("delta").option("txnAppId", ...).option("txnVersion", batch_id)
  .mode("append")``, the anchor the delta-spark sink is measured against (issue 18).
- Row 10, the ceiling: the pipeline's read path (Kafka read and decoding in the read task, the
  hand-off into Spark, the transform) with its batches written to Spark's ``noop`` sink.

It lives here, not in the product: a pipeline never runs this way. The rows are written by the
sink's own writer (the delta-rs sink's task-written files, committed with no commit properties;
the delta-spark sink's plain DataFrame append), so the only difference from row 4 is what
exactly-once adds.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger(__name__)

# Lost commit races are retried this often (the bench's tables have one writer).
ATTEMPTS = 10


def plain_append(sink: Any, rows: Any, txn: tuple[str, int] | None = None) -> int:
    """Append ``rows`` (what ``sink.materialize`` returned) with no offsets or fencing; the
    number of rows written. ``txn``: ``(txnAppId, txnVersion)`` of the delta-spark write."""
    if hasattr(sink, "_commit_files"):  # the delta-rs sink: files written by Spark's tasks
        from deltalake.exceptions import CommitFailedError

        table = sink._table()
        files = sink._write_files(table, rows)
        for _ in range(ATTEMPTS):
            try:
                sink._commit_files(table, files, None)
            except CommitFailedError:
                table = sink._table()
                continue
            return int(files.num_rows)
        raise RuntimeError(f"lost the commit race {ATTEMPTS} times on {sink.table_uri}")
    frame = sink._frame(rows)  # the delta-spark sink: a plain append of the batch
    count = frame.count()
    writer = frame.write.format("delta").mode("append")
    if txn is not None:
        writer = writer.option("txnAppId", txn[0]).option("txnVersion", str(txn[1]))
    writer.save(sink.table_uri)
    return int(count)


def plain_pipeline(base: type, txn: bool = False) -> type:
    """A subclass of the engine's ``Pipeline`` (kafka_delta.pipeline) whose batches are plain
    appends; with ``txn``, each carries ``(pipeline id, batch id)`` as its txn (row 7)."""

    class PlainPipeline(base):  # type: ignore[misc,valid-type]
        # The sink's share of a batch; the bench times it, as it times commit_batch in row 4.
        append = staticmethod(plain_append)

        def _process_batch(self, df: Any, batch_id: int) -> None:
            started = time.perf_counter()
            batch = self.engine.sink.materialize(self.transform(df), split=True)
            try:
                ident = (self.config.pipeline_id, batch_id) if txn else None
                rows = self.append(self.engine.sink, batch.rows, ident)
            finally:
                batch.release()
            self.summary.batches += 1
            self.summary.rows_written += rows
            self.summary.batch_seconds.add(time.perf_counter() - started)
            # The progress line's head, as the pipeline logs it: start-up's "first batch" ends
            # at the first one (benchlib/startup.py).
            log.info("batch=%d rows_written=%d (plain append%s)", batch_id, rows, ", txn" * txn)

    return PlainPipeline


def noop_pipeline(base: type) -> type:
    """A subclass of the engine's ``Pipeline`` whose batches go through the transform to Spark's
    ``noop`` sink: what the read path costs with nothing written (row 10). The rows are counted
    as the pipeline counts the records it read (``DataFrame.observe``, no extra job)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    class NoopPipeline(base):  # type: ignore[misc,valid-type]
        def _process_batch(self, df: Any, batch_id: int) -> None:
            from kafka_delta.progress.run_progress import records_read

            started = time.perf_counter()
            observation = Observation()
            out = self.transform(df.observe(observation, F.count(F.lit(1)).alias("records")))
            out.write.format("noop").mode("append").save()
            rows = records_read(observation) or 0
            self.summary.batches += 1
            self.summary.rows_written += rows
            self.summary.batch_seconds.add(time.perf_counter() - started)
            log.info("batch=%d rows_written=%d (noop sink)", batch_id, rows)

    return NoopPipeline
