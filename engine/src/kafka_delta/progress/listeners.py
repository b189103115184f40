"""What receives each batch's progress (:class:`.batch.ProgressListener`), as the config says:
Prometheus metrics, the JSON-lines progress file."""

from __future__ import annotations

import logging
from pathlib import Path

from kafka_delta.config import ConfigError, PipelineConfig
from kafka_delta.progress.batch import ProgressListener

log = logging.getLogger(__name__)


def build_listeners(config: PipelineConfig) -> list[ProgressListener]:
    """What receives each batch's progress, as the config says. The metrics module (and
    prometheus_client) is imported only when metrics are on. The metrics come first: a port
    in use stops the run before anything is written."""
    listeners: list[ProgressListener] = []
    try:
        metrics = config.metrics
        if metrics.exporter != "none":
            try:
                from kafka_delta.progress.metrics import MetricsError, PrometheusMetrics
            except ImportError as exc:
                raise ConfigError(
                    f"metrics.exporter {metrics.exporter} needs the package prometheus-client, "
                    f"which is not installed ({exc})"
                ) from None
            try:
                listeners.append(
                    PrometheusMetrics(
                        config.pipeline_id,
                        http_address=(metrics.host, metrics.port)
                        if metrics.exporter == "http"
                        else None,
                        textfile=Path(metrics.textfile)
                        if metrics.exporter == "textfile" and metrics.textfile
                        else None,
                    )
                )
            except MetricsError as exc:
                raise ConfigError(str(exc)) from None
        if config.progress.path:
            from kafka_delta.progress.log_file import JsonLinesProgress

            try:
                listeners.append(JsonLinesProgress(Path(config.progress.path)))
            except OSError as exc:
                raise ConfigError(
                    f"progress.path: cannot write {config.progress.path}: {exc.strerror or exc}"
                ) from None
    except ConfigError:
        close_listeners(listeners)
        raise
    return listeners


def close_listeners(listeners: list[ProgressListener]) -> None:
    for listener in listeners:
        try:
            listener.close()
        except Exception as exc:
            log.warning("closing %s failed: %s", type(listener).__name__, exc)
