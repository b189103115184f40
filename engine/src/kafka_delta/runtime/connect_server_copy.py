"""The pipeline's copy in the Spark Connect server's Python process.

Under Spark Connect (serverless, standard access mode) the batch function runs in a Python
process the server starts: the pipeline is pickled when the query starts and unpickled there.
What only the process that started the run holds does not cross: its session, its Kafka
clients, its listeners and stop gate, the query handle, the run loop. The copy builds its own
Kafka admin client and, at its first batch, its engine parts on the batch's session
(:meth:`ServerCopy._bind`), keeping where each table stands; it reports each batch back through
the checkpoint location (:mod:`kafka_delta.progress.mailbox`), and the process that started the
run commits the group's offsets, logs the progress line and calls the listeners, as a classic
run does. The run's progress crosses without its own driver-only parts
(:meth:`kafka_delta.progress.run_progress.RunProgress.__getstate__`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kafka_delta.engine_factory import build_engine_parts, build_source
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.recovery.checkpoint import CheckpointLog
from kafka_delta.runtime.graceful_stop import StopGate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class ServerCopy:
    """How a :class:`~kafka_delta.pipeline.Pipeline` crosses to the batch function's process
    (a base of the pipeline: pickling is its ``__getstate__``/``__setstate__``)."""

    # What only the process that started the run holds.
    _DRIVER_ONLY = ("spark", "admin", "_gate", "_query", "run_loop")

    def __getstate__(self) -> dict[str, object]:
        state = {k: v for k, v in self.__dict__.items() if k not in self._DRIVER_ONLY}
        state["checkpoint"] = CheckpointLog(None, self.config.checkpoint, lazy_spark=True)
        # The engines hold this process's session (the delta-spark sink, its tables): the
        # batch function's process builds its own on its own session (_bind).
        state["tables"] = [replace(run, engine=None, dead_letters=None) for run in self.tables]
        state["engine"] = None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.spark = None  # type: ignore[assignment]  (each batch's DataFrame brings it)
        self.admin = KafkaAdmin(self.config.kafka.client_config())
        self._gate = StopGate()
        self._query = None
        self.run_loop = None  # type: ignore[assignment]  (the run is the other process's)
        self.progress.attach(self.admin, self._gate)
        self._worker = True

    def _in_server(self, df: DataFrame) -> None:
        """At each batch in the server's process: at the first, the session and the engine
        parts built on it (:meth:`_bind`); then the batch's DataFrame is held until the next.

        A Connect batch DataFrame releases its server-side relation in ``__del__``, by a call
        to the server. Made as pyspark's worker drops the DataFrame after the batch function
        returned, that call was seen to block for good under load (the worker, and the query
        with it; most often on a replayed batch). Held until the next batch, the previous one
        is released during a batch, while the server serves the function's calls; the last one
        goes with the query."""
        if self.spark is None:
            self._bind(df.sparkSession)
        self._held_batch = df

    def _bind(self, spark: SparkSession) -> None:
        """The session, and the engine parts built on it, as the run's own process built
        them."""
        self.spark = spark
        self.checkpoint.spark = spark
        source = build_source(self.config)
        for run in self.tables:
            run.engine, run.dead_letters = build_engine_parts(spark, run.config, source)
        self.engine = self.tables[0].engine
