"""The first batch's Python workers, started while the stream is set up.

A run's first batch pays for cold Python workers: each read task's worker imports pyarrow,
confluent-kafka, the decoder and this package before it reads a record, and the delta-rs
sink's write task imports the file writer. Meanwhile the executors sit idle: the driver
registers the data source, starts the query and plans the batch (a Kafka metadata query).
:func:`warm_up` spends that idle time: one tiny job, in a background thread, runs one task per
core that imports the modules the engine's tasks need. Spark reuses Python workers
(``spark.python.worker.reuse``, on by default), so the first batch's tasks find them started
and their modules imported.

It changes nothing but timing: the job reads and writes nothing, a failure is logged and
ignored (the first batch then starts its workers itself, as without it), and a session
without a SparkContext (Spark Connect) is not warmed.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def _importer(modules: Sequence[str]) -> Any:
    names = tuple(modules)

    def imports(batches: Iterable[Any]) -> Iterator[Any]:
        for name in names:
            importlib.import_module(name)
        yield from batches

    return imports


def warm_up(spark: SparkSession, modules: Sequence[str]) -> threading.Thread | None:
    """Start the workers that will import ``modules``, one per core, in a background thread
    (returned, already started); None when there is nothing to warm."""
    from kafka_delta.runtime.spark_session import is_connect

    if not modules or is_connect(spark):  # Spark Connect: the workers live with the server
        return None
    tasks = max(1, int(spark.sparkContext.defaultParallelism))

    def run() -> None:
        try:
            spark.range(0, tasks, 1, tasks).mapInArrow(_importer(modules), "id long").collect()
        except Exception as exc:
            log.debug("warming the Python workers failed (%s): the first batch starts them", exc)

    thread = threading.Thread(target=run, name="warm-python-workers", daemon=True)
    thread.start()
    return thread
