"""The freshness row's workers (:mod:`.freshness`), each in its own process while a steady
producer writes the topic, each stopped by a stop file the orchestrator writes:

- sides A and B, :func:`work_fresh_pipeline`: the project's continuous run (the generated
  project's engine, its Spark confs, the sample transform), on the embedded engine (A) or the
  cluster engine with the connector jars (B), with the trigger the spec names. A subclass of
  the engine's ``Pipeline`` times the batch function's steps; the engine itself is untouched;
- side C, :func:`work_fresh_idiom`: what a Spark user writes by hand,
  ``readStream.format("kafka")`` -> ``from_json`` -> ``writeStream.format("delta")``, with no
  trigger set: Spark's fastest (the next batch as soon as the last one ends), on the same
  session; side D, the same with each batch written by ``foreachBatch`` as one idempotent
  append (``txnAppId``/``txnVersion``): Spark's floor with the pipeline's guarantee.

Both return Spark's own timings of every trigger that ran a batch (``recentProgress``:
planning the ends, the offset log, the batch, the commit log), for the row's step shares.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .kafka_io import CLIENT
from .spark_run import _logging, _spark, _stop

log = logging.getLogger("bench")

# The Java client's fetch wait, as CLIENT sets librdkafka's for A (and the generated project's
# conf/local.yaml for both): a fetch at a partition's live end waits for records that long, and
# the Java client's default (500 ms) made B's and C's reads wait it out.
# The same broker setting on every side; nothing else of C is tuned.
JVM_CLIENT = {"fetch.max.wait.ms": "100"}
# Spark keeps the progress of this many triggers (default 100): all of a freshness run's.
PROGRESS_KEPT = "100000"


def _watch_stop_file(path: str, stop: Callable[[], None]) -> threading.Thread:
    """Call ``stop`` once ``path`` exists (the orchestrator's signal that the window is over)."""

    def watch() -> None:
        while not Path(path).exists():
            time.sleep(0.1)
        log.info("stop file found: stopping")
        stop()

    thread = threading.Thread(target=watch, name="stop-file", daemon=True)
    thread.start()
    return thread


def _progress(query: Any) -> list[dict[str, Any]]:
    """Spark's figures of each trigger that ran a batch: when it started (epoch seconds), its
    durations (ms) and its rows."""
    from datetime import datetime

    out = []
    for p in query.recentProgress:
        if p.numInputRows is None or p.batchId is None:
            continue
        started = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp()
        out.append(
            {
                "batch": p.batchId,
                "started": started,
                "rows": p.numInputRows,
                **{k: float(v) for k, v in (p.durationMs or {}).items()},
            }
        )
    return out


def _session(spec: dict[str, Any]) -> Any:
    spark = _spark(spec)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", PROGRESS_KEPT)
    return spark


def work_fresh_pipeline(spec: dict[str, Any]) -> dict[str, Any]:
    """Side A or B: the pipeline runs until the stop file appears; each batch's steps timed."""
    from kafka_delta.config import PipelineConfig
    from kafka_delta.pipeline import Pipeline
    from kafka_delta_dev.orders import TRANSFORM

    _logging()
    spark = _session(spec)
    config = PipelineConfig.model_validate(
        {
            "pipeline_id": spec["name"],
            "transform": TRANSFORM,
            "engine": spec["engine"],
            "kafka": {
                "bootstrap_servers": spec["bootstrap"],
                "topics": [spec["topic"]],
                "consumer_group": f"bench-{spec['name']}",
                "client": dict(CLIENT),
                "jvm_client": dict(JVM_CLIENT),
            },
            "delta": {"table": spec["table"]},
            "checkpoint": spec["checkpoint"],
            "decoding": spec["decoding"],
            "trigger": spec["trigger"],
            # Only when asked: A0's engine (--freshness-before) may predate the setting.
            **(
                {"maintenance": {"compact_every_seconds": spec["compact_every"]}}
                if spec.get("compact_every")
                else {}
            ),
        }
    )
    batches: list[dict[str, Any]] = []
    current: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                # The batch's own path only: what the engine reports off it (the count, in
                # kafka_delta.progress.reporter's thread) runs beside later batches.
                if threading.current_thread().name != "batch-reporter":
                    current[name] = current.get(name, 0.0) + time.perf_counter() - started

        return run

    # The count of records read waits on Spark's listener bus inside the batch's report.
    try:
        import kafka_delta.progress.run_progress as counting
    except ImportError:  # A0's engine (--freshness-before) may predate the module
        import kafka_delta.pipeline as counting  # type: ignore[no-redef]
    counting.records_read = timed("count", counting.records_read)

    class StepTimedPipeline(Pipeline):
        """Times the batch function's steps (docs/design.md section 3) as they run."""

        def _process_batch(self, df: Any, batch_id: int) -> None:
            current.clear()
            started = time.perf_counter()
            super()._process_batch(df, batch_id)
            batches.append(
                {
                    "batch": batch_id,
                    "end": time.time(),
                    "function": time.perf_counter() - started,
                    **current,
                }
            )

        def _plan_ends(self, *args: Any) -> Any:
            return timed("plan", super()._plan_ends)(*args)

        def _fence(self, *args: Any) -> Any:
            return timed("check", super()._fence)(*args)

    pipeline = StepTimedPipeline(spark, config)
    if hasattr(pipeline, "progress"):
        pipeline.progress.report = timed("report", pipeline.progress.report)
    else:  # A0's engine (--freshness-before) may predate kafka_delta.progress.run_progress
        pipeline._report = timed("report", pipeline._report)
    for run in pipeline.tables:
        sink = run.engine.sink
        sink.materialize = timed("write", sink.materialize)
        sink.commit_batch = timed("commit", sink.commit_batch)
    _watch_stop_file(spec["stop_file"], pipeline.request_stop)
    begin = time.time()
    try:
        summary = pipeline.run()
        progress = _progress(pipeline._query) if pipeline._query is not None else []
    finally:
        _stop(spark)
    stats = summary.commit_back
    return {
        "begin": begin,
        "end": time.time(),
        "rows": summary.rows_written,
        "batches": batches,
        "progress": progress,
        "commit_back_ok": getattr(stats, "succeeded", None),
        "commit_back_failed": getattr(stats, "failed", None),
    }


def work_fresh_idiom(spec: dict[str, Any]) -> dict[str, Any]:
    """Side C: ``readStream.format("kafka")`` -> ``from_json`` -> ``writeStream.format("delta")``
    as a Spark user writes it, no trigger set (Spark's fastest), on the pipeline's session.
    Side D (``spec["txn"]``): the same read, each batch written by ``foreachBatch`` as one
    idempotent append (``txnAppId``/``txnVersion``), as Databricks documents it."""
    from kafka_delta_dev.orders import EVENT_SCHEMA
    from pyspark.sql import functions as F

    _logging()
    spark = _session(spec)
    try:
        events = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", spec["bootstrap"])
            .option("subscribe", spec["topic"])
            .option("startingOffsets", "earliest")
            .options(**{f"kafka.{k}": v for k, v in JVM_CLIENT.items()})
            .load()
        )
        rows = events.select(
            F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("event"),
            F.col("timestamp").alias("kafka_timestamp"),
            "topic",
            "partition",
            "offset",
        ).select("event.*", "kafka_timestamp", "topic", "partition", "offset")
        if spec.get("txn"):
            app_id = f"fresh-{spec['topic']}"

            def append(df: Any, batch_id: int) -> None:
                (
                    df.write.format("delta")
                    .option("txnAppId", app_id)
                    .option("txnVersion", batch_id)
                    .mode("append")
                    .save(spec["table"])
                )

            query = (
                rows.writeStream.foreachBatch(append)
                .option("checkpointLocation", spec["checkpoint"])
                .start()
            )
        else:
            query = (
                rows.writeStream.format("delta")
                .option("checkpointLocation", spec["checkpoint"])
                .start(spec["table"])
            )
        log.info("stream started")
        stopping = threading.Event()
        _watch_stop_file(spec["stop_file"], stopping.set)
        begin = time.time()
        while not stopping.wait(0.2):
            if not query.isActive:
                query.awaitTermination()  # raises the query's failure
        # Between batches, as the pipeline's own stop does: stop() under a running batch fails
        # it with a job cancellation (the window's records are committed by now either way).
        deadline = time.monotonic() + 60
        while query.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.005)
        query.stop()
        progress = _progress(query)
    finally:
        _stop(spark)
    return {"begin": begin, "end": time.time(), "rows": 0, "batches": [], "progress": progress}
