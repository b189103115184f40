"""Spark's own floor on this machine: what a micro-batch pipeline on Spark pays before it does
any work of its own, measured the way the generated project runs locally (local[2], the JVM
class archive, the Python launcher, Spark's UI off).

- ``session_s``: script start to a ready Spark session;
- ``first_batch_s``: script start to the end of the first micro-batch of a trivial Python
  streaming data source (two partitions of one row each, written to Spark's ``noop`` sink: no
  Kafka, no decoding, no Delta);
- ``batch_s``: the median micro-batch of that query afterwards (``triggerExecution``);
- ``batch_no_job_s``: the median micro-batch of the same source whose batch function runs no
  Spark job at all (Spark's offset and commit logs, planning, the foreachBatch call);
- ``batch_python_write_s``: the median micro-batch of the same source whose batch is handed to
  Python to be written (``mapInArrow`` in each task, its results collected as Arrow), writing
  nothing: what Spark charges any sink written in Python, the delta-rs sink's shape, over the
  ``noop`` sink.

The pipeline's ``startup_s`` and ``batch_fixed_s`` (scripts/bench) are these plus its own work.
scripts/bench takes these figures in its own run (row 10's process runs :func:`measure` on its
session before the pipeline's read path): its last line holds the pipeline's start-up and fixed
cost per batch over them.

    scripts/spark_floor [--batches 40]
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from kafka_delta.runtime import jvm_archive as archive  # noqa: E402
from kafka_delta.runtime import python_launcher as launcher  # noqa: E402


def _session():
    launcher.use_for_spark()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("spark-floor")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
    )
    options = archive.option_string(archive.java_options(os.getpid()))
    if options:
        builder = builder.config("spark.driver.extraJavaOptions", options)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _register(spark, batches: int) -> None:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Reader(DataSourceStreamReader):
        def __init__(self) -> None:
            self.latest = 0

        def initialOffset(self) -> dict:
            return {"batch": 0}

        def latestOffset(self) -> dict:
            self.latest = min(self.latest + 1, batches)  # a new batch at each trigger, then none
            return {"batch": self.latest}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(i) for i in range(2)]

        def read(self, partition):
            yield (partition.value,)

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "spark_floor"

        def schema(self) -> str:
            return "x int"

        def streamReader(self, schema):
            return Reader()

    spark.dataSource.register(Floor)


def _run(spark, checkpoint: Path, batches: int, write: str | None) -> tuple[float, float]:
    """(the time batch 0 ended, epoch seconds; median batch seconds after the first five).
    ``write``: "noop" (Spark's noop sink), "python" (handed to Python tasks, as the delta-rs
    sink's files are written) or None (no job)."""
    first: list[float] = []

    def count(batches):
        """A Python writer that writes nothing: the rows it was handed, counted. (Defined here,
        so that it reaches the Python workers by value: they cannot import this script.)"""
        import pyarrow as pa

        rows = 0
        for batch in batches:
            rows += batch.num_rows
        yield pa.RecordBatch.from_pydict({"rows": [rows]})

    def batch(frame, batch_id: int) -> None:
        if write == "noop":
            frame.write.format("noop").mode("append").save()
        elif write == "python":
            frame.mapInArrow(count, "rows long").toArrow()
        if not first:
            first.append(time.time())

    query = (
        spark.readStream.format("spark_floor")
        .load()
        .writeStream.option("checkpointLocation", str(checkpoint))
        .foreachBatch(batch)
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        while (query.lastProgress or {}).get("batchId", -1) < batches - 1:
            if query.exception() is not None:
                raise RuntimeError(f"the floor query failed: {query.exception()}")
            time.sleep(0.2)
    finally:
        query.stop()
    durations = [p["durationMs"]["triggerExecution"] for p in query.recentProgress][5:]
    return first[0], statistics.median(durations) / 1000


def measure(spark, batches: int) -> dict[str, float]:
    """The floor's three queries on ``spark``: ``first_batch_at`` (epoch seconds at which the
    first one's batch 0 ended), ``batch_s``, ``batch_no_job_s`` and ``batch_python_write_s``
    (see the module's docstring)."""
    work = Path(tempfile.mkdtemp(prefix="spark-floor-"))
    try:
        _register(spark, batches)
        first_at, batch_s = _run(spark, work / "noop", batches, write="noop")
        _, no_job_s = _run(spark, work / "no-job", batches, write=None)
        _, python_s = _run(spark, work / "python", batches, write="python")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "first_batch_at": first_at,
        "batch_s": batch_s,
        "batch_no_job_s": no_job_s,
        "batch_python_write_s": python_s,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=40, help="micro-batches per query")
    args = parser.parse_args(argv)
    if args.batches < 10:
        parser.error("--batches must be at least 10 (the first five are warm-up)")
    spark = _session()
    session_s = time.time() - STARTED
    try:
        figures = measure(spark, args.batches)
    finally:
        spark.stop()
    print(
        f"floor: session_s={session_s:.2f} "
        f"first_batch_s={figures['first_batch_at'] - STARTED:.2f} "
        f"batch_s={figures['batch_s']:.3f} batch_no_job_s={figures['batch_no_job_s']:.3f} "
        f"batch_python_write_s={figures['batch_python_write_s']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
