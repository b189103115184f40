"""Metrics and the progress file, from real runs: a real broker, real Delta tables, a real
Spark session. The metrics are scraped the way Prometheus scrapes them (an HTTP GET of the
port, or a read of node_exporter's textfile), parsed with prometheus_client's own parser and
compared with what the tables and Kafka say."""

from __future__ import annotations

import logging
import random
import re
import urllib.request
from pathlib import Path

import pytest
from deltalake import DeltaTable

from kafka_delta.commands import report
from kafka_delta.delta.rs_offset_store import DeltaRsOffsetStore
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.pipeline import Pipeline
from kafka_delta.progress.log_file import JsonLinesProgress, read_progress
from kafka_delta.progress.metrics import PrometheusMetrics
from kafka_delta_dev.children import free_port
from kafka_delta_dev.produce import event, produce_values
from support import forget_last_spark_commit, last_batch

pytestmark = [pytest.mark.spark, pytest.mark.broker]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by name and sorted labels."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_scraped_over_http_equal_the_tables_figures(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path: Path, caplog
) -> None:
    topics = new_topics(2, partitions=2)
    rng = random.Random(3)
    produced = 0
    for t, topic in enumerate(topics):
        values = [(i % 2, event(t * 1000 + i, rng)) for i in range(200)]
        if t == 0:  # three records the transform cannot parse: dead letters
            values[10:10] = [(0, b"oops"), (1, b'{"id": "x"'), (0, b"null")]
        produce_values(kafka_bootstrap, topic, values)
        produced += len(values)
    cfg = make_config(topics, max_records_per_trigger=120)
    metrics = PrometheusMetrics(cfg.pipeline_id, http_address=("127.0.0.1", free_port()))
    progress_path = tmp_path / "progress" / "pipeline.jsonl"
    progress = JsonLinesProgress(progress_path)
    try:
        with caplog.at_level(logging.INFO):
            summary = Pipeline(spark, cfg, listeners=[metrics, progress]).run()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics", timeout=10) as r:
            assert r.status == 200
            scraped = samples(r.read().decode())
    finally:
        metrics.close()
        progress.close()

    pipeline = (("pipeline", cfg.pipeline_id),)

    def value(name: str, labels: tuple[tuple[str, str], ...] = pipeline) -> float:
        return scraped[(f"kafka_delta_{name}", labels)]

    table = DeltaTable(cfg.delta.table)
    dead_letters = DeltaTable(cfg.dead_letter_table).to_pyarrow_table().num_rows
    batches = last_batch(cfg) + 1  # batches Spark committed in the checkpoint
    assert batches >= 3
    assert value("records_read_total") == produced
    assert value("rows_written_total") == table.to_pyarrow_table().num_rows == produced - 3
    assert value("dead_letters_total") == dead_letters == 3
    assert value("batches_total") == batches == summary.batches
    assert value("replayed_batches_total") == 0
    assert summary.commit_back is not None
    assert value("commit_back_succeeded_total") == summary.commit_back.succeeded >= batches
    assert value("commit_back_failed_total") == 0
    assert value("batch_duration_seconds_count") == batches
    assert value("batch_duration_seconds_sum") == pytest.approx(summary.batch_seconds.total)
    assert value("delta_version") == table.version()
    assert value("last_batch_id") == batches - 1
    assert value("to_target_records") == 0
    # Lag per partition equals Kafka's latest offsets minus the offsets stored in the table.
    admin = KafkaAdmin(cfg.kafka.client_config())
    partitions = admin.partitions(topics)
    latest = admin.latest(partitions)
    stored = DeltaRsOffsetStore(cfg.delta.table, cfg.pipeline_id).read(lambda: partitions)
    assert stored is not None
    for topic, parts in partitions.items():
        for p in parts:
            labels = (("partition", str(p)), ("pipeline", cfg.pipeline_id), ("topic", topic))
            assert value("lag_records", labels) == latest[topic][p] - stored.offsets[topic][p]

    # One progress line per batch, with the same figures; `report` draws them.
    lines = read_progress(progress_path)
    assert [b.batch_id for b in lines] == list(range(batches))
    assert sum(b.records_read for b in lines) == produced
    assert sum(b.rows_written for b in lines) == produced - 3
    assert sum(b.dead_letters for b in lines) == 3
    assert lines[0].target_done is not None and lines[0].target_done < 1
    assert lines[-1].to_target == 0 and lines[-1].target_done == 1.0
    png = tmp_path / "report.png"
    assert report.main(["--progress", str(progress_path), "--output", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A run until caught up says, batch by batch, how far along it is.
    done = re.findall(r"to_target=(\d+) done=(\d+)%", caplog.text)
    assert len(done) == batches
    assert int(done[0][0]) > 0 and int(done[0][1]) < 100
    assert done[-1] == ("0", "100")
    percents = [int(p) for _, p in done]
    assert percents == sorted(percents)


def test_metrics_textfile_counts_a_replayed_batch_that_writes_nothing(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path: Path
) -> None:
    (topic,) = new_topics(1, partitions=2)
    rng = random.Random(5)
    produce_values(kafka_bootstrap, topic, [(i % 2, event(i, rng)) for i in range(100)])
    cfg = make_config([topic])
    Pipeline(spark, cfg).run()
    version = DeltaTable(cfg.delta.table).version()
    forget_last_spark_commit(cfg)  # as if the run crashed after its Delta commit

    textfile = tmp_path / "textfile" / "pipeline.prom"
    metrics = PrometheusMetrics(cfg.pipeline_id, textfile=textfile)
    pipeline = (("pipeline", cfg.pipeline_id),)
    at_start = samples(textfile.read_text())  # written at start-up: the counters exist at 0
    assert at_start[("kafka_delta_batches_total", pipeline)] == 0
    try:
        summary = Pipeline(spark, cfg, listeners=[metrics]).run()
    finally:
        metrics.close()

    scraped = samples(textfile.read_text())
    assert summary.replayed_batches == 1
    assert scraped[("kafka_delta_replayed_batches_total", pipeline)] == 1
    assert scraped[("kafka_delta_batches_total", pipeline)] == 1
    assert scraped[("kafka_delta_rows_written_total", pipeline)] == 0
    # The replayed batch 0 starts where the table's offsets end (the embedded source's initial
    # offsets), so it reads nothing: the counter says what was read, not what was planned.
    assert scraped[("kafka_delta_records_read_total", pipeline)] == 0
    assert DeltaTable(cfg.delta.table).version() == version
    # Written to a temporary file and renamed: nothing else is left in the folder.
    assert sorted(p.name for p in textfile.parent.iterdir()) == [textfile.name]


def test_a_runs_summary_keeps_no_figure_per_batch() -> None:
    import pickle

    from kafka_delta.progress.summary import RunSummary

    summary = RunSummary()
    for _ in range(1000):
        summary.batch_seconds.add(0.5)
        summary.commit_back_ms.add(2.0)
    size = len(pickle.dumps(summary))
    for _ in range(10_000):
        summary.batch_seconds.add(0.5)
        summary.commit_back_ms.add(2.0)

    assert len(pickle.dumps(summary)) == size
    # What the done line and the metrics read: the count, the total, the mean hook time.
    assert summary.batch_seconds.count == 11_000
    assert summary.batch_seconds.total == pytest.approx(5500.0)
    assert summary.commit_back_ms.mean == pytest.approx(2.0)
