"""Prometheus metrics of the pipeline, from each batch's progress record.

Served over HTTP for Prometheus to scrape (``metrics.exporter: http``, on 127.0.0.1 unless
configured otherwise), or written after every batch to a ``.prom`` file that node_exporter's
textfile collector reads (``metrics.exporter: textfile``; written to a temporary file and
renamed, so a scrape never sees half a file). Only ``main.py`` imports this module, and only
when metrics are on: a pipeline without metrics never loads ``prometheus_client``.

Every series carries the label ``pipeline`` (the pipeline id), so several pipelines can share
one textfile directory or one Prometheus job.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, write_to_textfile
from prometheus_client.exposition import start_http_server

from kafka_delta.progress.batch import BatchProgress

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from kafka_delta.kafka.commit_back import CommitBackStats

log = logging.getLogger(__name__)

PREFIX = "kafka_delta"
# Batches take from under a second (a few records) to minutes (500k records on 2 cores).
DURATION_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, float("inf"))


class MetricsError(RuntimeError):
    """The metrics cannot be exposed where the config says (a port in use, a path not
    writable); raised at start-up, before any work."""


class PrometheusMetrics:
    """A :class:`~.progress.ProgressListener` keeping the pipeline's metrics in its own
    registry, exposed by ``http_address`` or ``textfile`` (exactly one of them).

    >>> metrics = PrometheusMetrics("orders", http_address=("127.0.0.1", 9464))  # doctest: +SKIP
    """

    def __init__(
        self,
        pipeline_id: str,
        *,
        http_address: tuple[str, int] | None = None,
        textfile: Path | None = None,
    ) -> None:
        if (http_address is None) == (textfile is None):
            raise ValueError("give exactly one of http_address and textfile")
        self.pipeline_id = pipeline_id
        self.textfile = textfile
        self.registry = CollectorRegistry()
        labels = ["pipeline"]

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, labels, registry=self.registry)

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"{PREFIX}_{name}", doc, [*labels, *extra], registry=self.registry)

        self.records_read = counter(
            "records_read", "Kafka records the pipeline's batches read (replays included)"
        )
        self.rows_written = counter("rows_written", "Rows the Delta commits added")
        self.dead_letters = counter(
            "dead_letters", "Records sent to the dead-letter table (the transform set _error)"
        )
        self.batches = counter("batches", "Micro-batches processed, replays included")
        self.replays = counter(
            "replayed_batches", "Micro-batches re-run after a crash that wrote nothing (I2)"
        )
        self.commit_back_ok = counter(
            "commit_back_succeeded", "Consumer-group commits of stored offsets that succeeded"
        )
        self.commit_back_failed = counter(
            "commit_back_failed", "Consumer-group commits that failed (monitoring only)"
        )
        self.duration = Histogram(
            f"{PREFIX}_batch_duration_seconds",
            "Time from the start of a micro-batch to the end of its Delta commit and hook",
            labels,
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.lag = gauge(
            "lag_records",
            "Records between the last batch's end offset and Kafka's latest, per partition",
            ("topic", "partition"),
        )
        self.to_target = gauge(
            "to_target_records",
            "Run until caught up: records left to the offsets seen at start",
        )
        self.last_batch = gauge("last_batch_id", "Id of the last micro-batch (Spark's)")
        self.delta_version = gauge("delta_version", "Delta table version of the last commit")
        self.last_batch_time = gauge(
            "last_batch_timestamp_seconds", "Unix time the last micro-batch finished"
        )
        # A pipeline of several tables (tables:): each table's share, labelled by its name.
        self.table_rows_written = Counter(
            f"{PREFIX}_table_rows_written",
            "Rows the Delta commits added, per table of a pipeline of several tables",
            [*labels, "table"],
            registry=self.registry,
        )
        self.table_dead_letters = Counter(
            f"{PREFIX}_table_dead_letters",
            "Records sent to a table's dead-letter table, per table of several",
            [*labels, "table"],
            registry=self.registry,
        )
        self.table_delta_version = gauge(
            "table_delta_version", "Delta version of a table's last commit", ("table",)
        )
        # The hook's counts are cumulative per run: count what is new since the last batch.
        self._seen_ok = 0
        self._seen_failed = 0
        for counter_ in (
            self.records_read,
            self.rows_written,
            self.dead_letters,
            self.batches,
            self.replays,
            self.commit_back_ok,
            self.commit_back_failed,
        ):
            counter_.labels(pipeline_id)  # present at 0 from the start, not after a first event
        self._server: WSGIServer | None = None
        if http_address is not None:
            host, port = http_address
            try:
                self._server, _ = start_http_server(port, addr=host, registry=self.registry)
            except OSError as exc:
                raise MetricsError(
                    f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} "
                    "(metrics.host / metrics.port in the config)"
                ) from None
            log.info("metrics served at http://%s:%d/metrics", host, self.port)
        else:
            assert textfile is not None
            try:
                textfile.parent.mkdir(parents=True, exist_ok=True)
                self._write()
            except OSError as exc:
                raise MetricsError(
                    f"cannot write the metrics textfile {textfile}: {exc.strerror or exc} "
                    "(metrics.textfile in the config)"
                ) from None
            log.info("metrics written to %s after every batch", textfile)

    @property
    def port(self) -> int | None:
        return None if self._server is None else int(self._server.server_port)

    def on_batch(self, progress: BatchProgress) -> None:
        pipeline = self.pipeline_id
        self.records_read.labels(pipeline).inc(progress.records_read or 0)
        self.rows_written.labels(pipeline).inc(progress.rows_written)
        self.dead_letters.labels(pipeline).inc(progress.dead_letters)
        self.batches.labels(pipeline).inc()
        if progress.replayed:
            self.replays.labels(pipeline).inc()
        self.duration.labels(pipeline).observe(progress.duration_s)
        if progress.lag is not None:
            for topic, parts in progress.lag.items():
                for partition, records in parts.items():
                    self.lag.labels(pipeline, topic, str(partition)).set(records)
        if progress.to_target is not None:
            self.to_target.labels(pipeline).set(progress.to_target)
        self.last_batch.labels(pipeline).set(progress.batch_id)
        if progress.delta_version is not None:
            self.delta_version.labels(pipeline).set(progress.delta_version)
        self.last_batch_time.labels(pipeline).set(progress.finished_at)
        for name, share in (progress.tables or {}).items():
            self.table_rows_written.labels(pipeline, name).inc(share.get("rows_written") or 0)
            self.table_dead_letters.labels(pipeline, name).inc(share.get("dead_letters") or 0)
            if share.get("delta_version") is not None:
                self.table_delta_version.labels(pipeline, name).set(share["delta_version"])
        self._count_commit_back(progress.commit_back_ok, progress.commit_back_failed)
        self._write()

    def on_run_end(self, commit_back: CommitBackStats | None) -> None:
        # The hook commits the last batch's offsets after that batch: its final counts arrive
        # only once it is flushed at the end of the run.
        if commit_back is not None:
            self._count_commit_back(commit_back.succeeded, commit_back.failed)
        self._seen_ok = self._seen_failed = 0  # a next run has a new hook counting from 0
        self._write()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _count_commit_back(self, succeeded: int | None, failed: int | None) -> None:
        if succeeded is not None and succeeded > self._seen_ok:
            self.commit_back_ok.labels(self.pipeline_id).inc(succeeded - self._seen_ok)
            self._seen_ok = succeeded
        if failed is not None and failed > self._seen_failed:
            self.commit_back_failed.labels(self.pipeline_id).inc(failed - self._seen_failed)
            self._seen_failed = failed

    def _write(self) -> None:
        if self.textfile is not None:
            write_to_textfile(str(self.textfile), self.registry)
