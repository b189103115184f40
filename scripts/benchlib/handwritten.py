"""Rows 12 and 13: what a Databricks user writes by hand with Structured Streaming, the
baseline the delta-spark pipeline (row 6) and the cluster engine (row 14) are measured against.

- Row 12: ``spark.readStream.format("kafka")`` -> ``from_json`` -> ``writeStream.format("delta")``,
  Delta's own streaming sink (exactly once through the checkpoint and the sink's txn);
- Row 13: the same read, each batch written by ``foreachBatch`` as Databricks documents an
  idempotent write, ``batch_df.write.format("delta").option("txnAppId", ...).option(
  "txnVersion", batch_id).mode("append")``.

Both read with Spark's kafka source (the connector jars beside delta-spark's), parse the value
with the same event schema the generated project's schema file names, keep the Kafka position
columns as the pipeline's transform does, and run ``availableNow`` with
``maxOffsetsPerTrigger`` = the bench's batch size, on a session built as the pipeline's is
(:func:`.spark_run._spark`): the rows differ only in what the pipeline adds. No dead-letter
split, no stored offsets, no commit-back: a record ``from_json`` cannot parse becomes a row of
nulls, which is what a hand-written stream does.

Batch records are :data:`.spark_run.BATCH` lists, from the query's own progress (Spark's
``durationMs``), so the steady rate is computed as for the pipeline rows: a batch ends when its
write returned (row 12: the trigger's start plus its duration less the commit log's write;
row 13: when the batch function returned).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

from .spark_run import DriverProbe, _logging, _spark, _stop

log = logging.getLogger("bench")

STYLES = ("write_stream", "foreach_batch")


def _end_time(progress: dict[str, Any]) -> float:
    """When a ``writeStream`` batch's write returned: the trigger's start plus its duration,
    less what Spark does after the write (the commit log)."""
    start = dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    durations = progress.get("durationMs") or {}
    after = durations.get("commitOffsets", 0) + durations.get("commitBatch", 0)
    return start + (durations.get("triggerExecution", 0) - after) / 1000


def work_stream(spec: dict[str, Any]) -> dict[str, Any]:
    """Row 12 (``spec["style"] == "write_stream"``) or row 13 (``"foreach_batch"``) in a fresh
    process, JVM start included; the driver's peak RSS over the whole process life."""
    import json

    from kafka_delta_dev.orders import EVENT_SCHEMA
    from pyspark.sql import functions as F

    _logging()
    style = spec["style"]
    assert style in STYLES, style
    session_started = time.time()
    spark = _spark(spec)
    session_ready = time.time()
    table, checkpoint = spec["table"], spec["checkpoint"]
    ended: dict[int, tuple[float, float]] = {}  # batch id -> (returned at, seconds in it)
    try:
        probe = DriverProbe(spark)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
        events = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", spec["bootstrap"])
            .option("subscribe", spec["topic"])
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(spec["batch_size"]))
            .options(**{f"kafka.{k}": str(v) for k, v in (spec.get("jvm_client") or {}).items()})
            .load()
            .select(
                F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("event"),
                "topic",
                "partition",
                "offset",
                F.col("timestamp").alias("kafka_timestamp"),
            )
            .select("event.*", "topic", "partition", "offset", "kafka_timestamp")
        )
        writer = events.writeStream.option("checkpointLocation", checkpoint).trigger(
            availableNow=True
        )
        begin = time.time()
        if style == "foreach_batch":
            app_id = spec["name"]

            def write(batch: Any, batch_id: int) -> None:
                started = time.perf_counter()
                (
                    batch.write.format("delta")
                    .option("txnAppId", app_id)
                    .option("txnVersion", str(batch_id))
                    .mode("append")
                    .save(table)
                )
                ended[batch_id] = (time.time(), time.perf_counter() - started)

            query = writer.foreachBatch(write).start()
        else:
            query = writer.format("delta").start(table)
        log.info("stream started")
        query.awaitTermination()
        end = time.time()
        progresses = [json.loads(p.json) for p in query.recentProgress]
        batches = []
        for p in sorted(progresses, key=lambda p: p["batchId"]):
            rows = int(p.get("numInputRows") or 0)
            if rows == 0:
                continue
            driver_mb, jvm_mb = probe.now()
            if style == "foreach_batch":
                at, seconds = ended[p["batchId"]]
            else:
                at, seconds = _end_time(p), (p.get("durationMs") or {}).get("addBatch", 0) / 1000
            batches.append([at, rows, seconds, seconds, driver_mb, jvm_mb, None])
            # Not the pipeline's progress line ("batch=<id> ..."): logged after the run, it
            # would end no start-up phase.
            log.info("hand-written %s: batch %d wrote %d rows", style, p["batchId"], rows)
        result: dict[str, Any] = {
            "rows": sum(b[1] for b in batches),
            "records_read": sum(b[1] for b in batches),
            "begin": begin,
            "end": end,
            "batches": batches,
        }
        result["driver_peak_mb"], result["jvm_peak_mb"] = probe.peaks()
    finally:
        jvm_exit_s = _stop(spark)
    result["spark_session_s"] = session_ready - session_started
    result["jvm_exit_s"] = jvm_exit_s
    return result
