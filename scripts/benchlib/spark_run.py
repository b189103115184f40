"""Workers that run the generated pipeline (rows 4-8 and 10; the sweep, the memory runs and row 11
in one session), each
in its own process started by :mod:`.procs`: the generated project's engine (its ``src/`` on the
worker's PYTHONPATH) with the sample transform, kafka_delta_dev.orders (``TRANSFORM``). The
engine itself is untouched: a subclass of its ``Pipeline`` records when each batch committed,
how long its sink took and the driver's RSS.

A pipeline result's ``batches`` are lists ``[commit time, rows, seconds in the batch function,
of which in the Delta sink, driver Python RSS MB, driver JVM RSS MB, the batch's steps]`` (see
:data:`BATCH`). The steps are the engine's own timings of the batch (its progress record's
``steps``: plan, check, materialize, commit, read_back; :class:`kafka_delta.progress.batch.
StepClock`), None for a batch the engine did not time (rows 5 and 7, whose batches are the
bench's own)."""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import memory
from .kafka_io import CLIENT
from .plain import noop_pipeline, plain_append, plain_pipeline

log = logging.getLogger("bench")

# Index of each field in a pipeline batch record.
BATCH = {
    "time": 0,
    "rows": 1,
    "function_s": 2,
    "sink_s": 3,
    "driver_mb": 4,
    "jvm_mb": 5,
    "steps": 6,
}
# The engine's own log format (kafka_delta.cli): start-up phases are parsed from it.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def _project_spark_conf(spec: dict[str, Any]) -> dict[str, str]:
    """The Spark confs of the generated project's ``conf/local.yaml``: the session users run."""
    import yaml

    path = Path(spec["src"]).parent / "conf" / "local.yaml"
    conf = (yaml.safe_load(path.read_text()).get("spark") or {}).get("conf") or {}
    return {str(k): str(v) for k, v in conf.items()}


def _spark(spec: dict[str, Any]) -> Any:
    """A local session with the generated project's own Spark confs (``conf/local.yaml``) on
    ``spec["master"]``; with ``spec["jars"]`` (delta-spark), those jars on spark.jars and Delta's
    session extension and catalog, as the engine's pytest plugin does."""
    from kafka_delta.runtime import jvm_archive as archive
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(spec["master"]).appName("bench")
    for key, value in {
        **_project_spark_conf(spec),
        "spark.sql.session.timeZone": "UTC",
    }.items():
        builder = builder.config(key, value)
    # As scripts/run_local.sh: the JVM maps Spark's classes from the class-data archive, or
    # records it at exit when there is none yet (the orchestrator's first run does).
    options = archive.option_string(archive.java_options(os.getpid()))
    if options:
        builder = builder.config("spark.driver.extraJavaOptions", options)
    if spec.get("jars"):
        from kafka_delta.runtime.connectors import DELTA_SESSION_CONFS

        builder = builder.config("spark.jars", ",".join(spec["jars"]))
        for key, value in DELTA_SESSION_CONFS.items():
            builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    log.info("spark session ready")
    return session


class DriverProbe:
    """RSS of the pipeline's driver, and only of it: this Python process (where foreachBatch
    runs and the delta-rs sink holds a batch as Arrow) and, separately, the JVM it started. In
    local mode that JVM also runs the executors' tasks, so its figure is not the driver's alone;
    the Python daemon and workers (executor side) are left out of both."""

    def __init__(self, spark: Any) -> None:
        self.python = os.getpid()
        self.jvm: int | None
        try:  # the JVM's own pid through py4j; else the java process under this one
            self.jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        except Exception:
            self.jvm = memory.find_jvm(self.python)

    def now(self) -> tuple[float | None, float | None]:
        return self._read("VmRSS")

    def peaks(self) -> tuple[float | None, float | None]:
        return self._read("VmHWM")

    def _read(self, field: str) -> tuple[float | None, float | None]:
        jvm = memory.status_mb(self.jvm, field) if self.jvm else None
        return memory.status_mb(self.python, field), jvm

    def reset(self, spark: Any) -> bool:
        """Collect garbage on both sides, then restart both peaks from the current RSS."""
        gc.collect()
        try:
            spark.sparkContext._jvm.java.lang.System.gc()
        except Exception:
            log.debug("no JVM access: JVM garbage not collected before the reset")
        ok = memory.reset_peak(self.python)
        if self.jvm:
            ok = memory.reset_peak(self.jvm) and ok
        return ok


def _timed(fn: Callable[..., Any], total: list[float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - started

    return timed


def _run_pipeline(
    spark: Any, spec: dict[str, Any], run: dict[str, Any], probe: DriverProbe
) -> dict[str, Any]:
    from kafka_delta.config import PipelineConfig
    from kafka_delta.pipeline import Pipeline
    from kafka_delta_dev.orders import TRANSFORM

    settings: dict[str, Any] = {
        "pipeline_id": run["name"],
        "transform": run.get("transform") or TRANSFORM,
        "kafka": {
            "bootstrap_servers": spec["bootstrap"],
            "topics": run.get("topics") or [run["topic"]],
            "consumer_group": f"bench-{run['name']}",
            "max_records_per_trigger": run["batch_size"],
            "client": dict(CLIENT),
            "jvm_client": dict(run.get("jvm_client") or {}),
        },
        "checkpoint": run["checkpoint"],
    }
    counted = None
    if run.get("tables"):  # row 11: one stream into several tables (tables:)
        settings["tables"] = run["tables"]
        counted = next(iter(run["tables"]))  # the table that takes every record
    else:
        settings["delta"] = {"table": run["table"]}
    if run.get("engine"):
        settings["engine"] = run["engine"]
    if run.get("decoding"):
        settings["decoding"] = run["decoding"]
    config = PipelineConfig.model_validate(settings)
    batches: list[list[Any]] = []
    in_sink = [0.0]

    exactly_once = run.get("exactly_once", True)
    if not exactly_once:
        config = config.with_overrides(**{"commit_back.enabled": False})
    if run.get("noop"):  # row 10: the read path to Spark's noop sink
        base = noop_pipeline(Pipeline)
    elif exactly_once:
        base = Pipeline
    else:
        base = plain_pipeline(Pipeline, txn=run.get("txn", False))

    class LastProgress:
        """A progress listener (kafka_delta.progress.batch): the last batch's progress."""

        progress: Any = None

        def on_batch(self, progress: Any) -> None:
            self.progress = progress

        def on_run_end(self, commit_back: Any) -> None:
            pass

    last = LastProgress()

    class TimedPipeline(base):  # type: ignore[valid-type,misc]
        """Records each batch when its commit returned (see BATCH), and logs when the stream
        started; the engine itself is untouched."""

        def start(self) -> Any:
            query = super().start()
            log.info("stream started")
            return query

        def _process_batch(self, df: Any, batch_id: int) -> None:
            rows_before, sink_before = self.summary.rows_written, in_sink[0]
            started = time.perf_counter()
            super()._process_batch(df, batch_id)
            elapsed = time.perf_counter() - started
            self.progress.flush()  # the batch's progress line, read below
            driver_mb, jvm_mb = probe.now()
            rows = self.summary.rows_written - rows_before
            progress = last.progress
            steps = (
                dict(progress.steps)
                if progress is not None
                and progress.batch_id == batch_id
                and getattr(progress, "steps", None)
                else None
            )
            if counted:  # of several tables, the records the batch read: the rows of `all`
                rows = last.progress.tables[counted]["rows_written"] or 0
            elif run.get("count_read"):  # a filtering transform: the records read
                read = last.progress.records_read
                rows = rows if read is None else read
            batches.append(
                [
                    time.time(),
                    rows,
                    elapsed,
                    in_sink[0] - sink_before,
                    driver_mb,
                    jvm_mb,
                    steps,
                ]
            )

    pipeline = TimedPipeline(spark, config, listeners=[last])
    sinks = [t.engine.sink for t in getattr(pipeline, "tables", [])] or [
        getattr(pipeline, "sink", None)
    ]
    for sink in sinks:  # every table's sink, for a pipeline of several
        if sink is not None and hasattr(sink, "commit_batch"):
            sink.commit_batch = _timed(sink.commit_batch, in_sink)
    if not exactly_once and not run.get("noop"):
        pipeline.append = _timed(plain_append, in_sink)
    begin = time.time()
    summary = pipeline.run()
    stats = getattr(summary, "commit_back", None)
    return {
        "rows": summary.rows_written,
        "records_read": sum(b[1] for b in batches),
        "begin": begin,
        "end": time.time(),
        "batches": batches,
        "commit_back_ok": getattr(stats, "succeeded", None),
        "commit_back_failed": getattr(stats, "failed", None),
    }


def work_pipeline(spec: dict[str, Any]) -> dict[str, Any]:
    """Rows 4-6: the generated pipeline in a fresh process (JVM start included); the driver's
    peak RSS over the whole process life."""
    _logging()
    session_started = time.time()
    spark = _spark(spec)
    session_ready = time.time()
    try:
        probe = DriverProbe(spark)
        result = _run_pipeline(spark, spec, spec, probe)
        result["driver_peak_mb"], result["jvm_peak_mb"] = probe.peaks()
    finally:
        jvm_exit_s = _stop(spark)
    result["spark_session_s"] = session_ready - session_started
    result["jvm_exit_s"] = jvm_exit_s
    return result


def work_ceiling(spec: dict[str, Any]) -> dict[str, Any]:
    """Row 10 and Spark's floor in one process, so that the bench pays one Spark start for both:
    first scripts/spark_floor's queries on a fresh session (its first batch timed from this
    process's start, as scripts/spark_floor times it from its own), then the pipeline's read path
    to Spark's noop sink, whose steady rate leaves its start (after the floor's) out."""
    import spark_floor  # scripts/, on the path of bench.py

    _logging()
    spark = _spark(spec)
    session_ready = time.time()
    try:
        floor = spark_floor.measure(spark, spec["floor_batches"])
        log.info("spark floor measured: %s", floor)
        probe = DriverProbe(spark)
        result = _run_pipeline(spark, spec, {**spec, "noop": True, "exactly_once": False}, probe)
        result["driver_peak_mb"], result["jvm_peak_mb"] = probe.peaks()
    finally:
        _stop(spark)
    result["floor"] = {"session_ready_at": session_ready, **floor}
    return result


def paid_orders(df: Any) -> Any:
    """The sample transform, then only the paid orders: row 11's ``paid`` table, written by a
    pipeline of its own (``benchlib.spark_run:paid_orders``, the bench's scripts/ on the path)."""
    from kafka_delta_dev.orders import transform
    from pyspark.sql import functions as F

    return transform(df).where(F.col("event_type") == "paid")


def _stop(spark: Any) -> float | None:
    """Stop the session, then the JVM, and wait for it: a JVM that records the class archive
    writes it as it exits, which must be over before this worker is done (the orchestrator
    signals what is left of its process group). Returns the seconds the JVM took to exit."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if proc is None or proc.stdin is None:
        return None
    started = time.perf_counter()
    proc.stdin.close()  # Spark's gateway JVM exits when its Python driver's pipe closes
    proc.wait(timeout=300)
    return time.perf_counter() - started


def work_session(spec: dict[str, Any]) -> dict[str, Any]:
    """The memory runs and the sweep: one Spark session runs every point in turn (steady state
    excludes start-up). Points with ``peak`` set measure the driver's peak RSS over that run
    alone (VmHWM reset before it); the orchestrator puts them first, smallest batches first,
    so none inherits a larger run's heap. One failed point does not lose the others."""
    _logging()
    spark = _spark(spec)
    try:
        probe = DriverProbe(spark)
        points = []
        for run in spec["points"]:
            log.info("%s point %s", run["role"], run["name"])
            try:
                reset = probe.reset(spark) if run.get("peak") else None
                result = _run_pipeline(spark, spec, run, probe)
                if run.get("peak"):
                    result["driver_peak_mb"], result["jvm_peak_mb"] = probe.peaks()
                    result["peak_reset"] = reset
                points.append({**run, **result})
            except Exception as exc:
                log.exception("%s point %s failed", run["role"], run["name"])
                points.append({**run, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
    finally:
        _stop(spark)
    return {"points": points}
