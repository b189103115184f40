"""End to end on the embedded engine: a real broker, real Delta tables, a real Spark session."""

from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from {{ cookiecutter.package_name }}.config import PipelineConfig
from {{ cookiecutter.package_name }}.devtools.produce import event, produce_events, produce_values
from {{ cookiecutter.package_name }}.embedded.offset_store import DeltaRsOffsetStore
from {{ cookiecutter.package_name }}.kafka_admin import KafkaAdmin, total_lag
from {{ cookiecutter.package_name }}.pipeline import (
    CheckpointMismatchError,
    Pipeline,
    RunSummary,
    checkpoint_end_offsets,
)

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _run(spark, cfg: PipelineConfig, transform=None) -> RunSummary:
    pipeline = Pipeline(spark, cfg) if transform is None else Pipeline(spark, cfg, transform)
    return pipeline.run()


def _ids(cfg: PipelineConfig) -> Counter[int]:
    return Counter(DeltaTable(cfg.delta.table).to_pyarrow_table()["id"].to_pylist())


def _last_batch(cfg: PipelineConfig) -> int:
    return max(
        int(p.name) for p in (Path(cfg.checkpoint) / "commits").iterdir() if p.name.isdigit()
    )


def _assert_offsets_agree(cfg: PipelineConfig) -> None:
    """stored offsets == last batch's planned end offsets == group's committed == latest."""
    admin = KafkaAdmin(cfg.kafka.client_config())
    stored = DeltaRsOffsetStore(cfg.delta.table, cfg.pipeline_id).read()
    assert stored is not None
    planned = checkpoint_end_offsets(cfg.checkpoint, _last_batch(cfg))
    partitions = admin.partitions(cfg.kafka.topics)
    committed = admin.committed(cfg.kafka.consumer_group, partitions)
    latest = admin.latest(partitions)
    assert stored.offsets == planned == committed == latest
    assert total_lag(latest, committed) == 0


def test_records_across_topics_and_partitions_land_exactly_once_in_several_batches(
    spark,
    kafka_bootstrap,
    new_topics,
    make_config,
) -> None:
    topics = new_topics(2, partitions=3)
    produce_events(kafka_bootstrap, topics, 3000)
    cfg = make_config(topics, max_records_per_trigger=700)

    summary = _run(spark, cfg)

    assert summary.batches >= 5  # 3000 records at <= 700 per trigger
    assert summary.rows_written == 3000
    ids = _ids(cfg)
    assert set(ids) == set(range(3000))
    assert max(ids.values()) == 1
    _assert_offsets_agree(cfg)
    assert summary.commit_back is not None and summary.commit_back.failed == 0


def test_offset_gaps_from_transactions_give_exact_end_offsets_and_zero_lag(
    spark,
    kafka_bootstrap,
    new_topics,
    make_config,
) -> None:
    (topic,) = new_topics(1, partitions=2)
    # Two committed transactions per partition: each commit marker takes an offset that
    # holds no record, so max(offset) + 1 of the data is NOT the end offset.
    for round_ in range(2):
        rng = random.Random(round_)
        values = [(p, event(round_ * 100 + i * 2 + p, rng)) for i in range(20) for p in (0, 1)]
        produce_values(kafka_bootstrap, topic, values, transactional_id=f"tx-{topic}")
    cfg = make_config([topic])

    summary = _run(spark, cfg)

    table = DeltaTable(cfg.delta.table).to_pyarrow_table()
    assert table.num_rows == 80 == summary.rows_written
    latest = KafkaAdmin(cfg.kafka.client_config()).latest({topic: [0, 1]})
    for p in (0, 1):
        offsets = [
            o
            for o, part in zip(
                table["offset"].to_pylist(), table["partition"].to_pylist(), strict=True
            )
            if part == p
        ]
        assert max(offsets) + 1 < latest[topic][p]  # there really is a gap at the end
    _assert_offsets_agree(cfg)


def test_crash_after_delta_commit_before_spark_commit_replays_as_a_no_op(
    spark,
    kafka_bootstrap,
    new_topics,
    make_config,
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 500)
    cfg = make_config(topics, max_records_per_trigger=200)
    _run(spark, cfg)
    version = DeltaTable(cfg.delta.table).version()

    # The Delta commit of the last batch happened, but Spark never recorded the batch as done:
    # exactly the state a crash between the two leaves behind. Spark re-runs that batch.
    last = _last_batch(cfg)
    for entry in (str(last), f".{last}.crc"):
        (Path(cfg.checkpoint) / "commits" / entry).unlink(missing_ok=True)
    summary = _run(spark, cfg)

    assert summary.replayed_batches == 1 and summary.rows_written == 0
    assert DeltaTable(cfg.delta.table).version() == version
    produce_events(kafka_bootstrap, topics, 100, first_id=500)
    _run(spark, cfg)
    ids = _ids(cfg)
    assert set(ids) == set(range(600)) and max(ids.values()) == 1
    _assert_offsets_agree(cfg)


def test_deleted_checkpoint_resumes_from_offsets_stored_in_the_table(
    spark,
    kafka_bootstrap,
    new_topics,
    make_config,
) -> None:
    topics = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, topics, 400)
    cfg = make_config(topics, max_records_per_trigger=150)
    _run(spark, cfg)

    shutil.rmtree(cfg.checkpoint)  # a new checkpoint restarts batch ids at 0 (I3)
    produce_events(kafka_bootstrap, topics, 250, first_id=400)
    summary = _run(spark, cfg)

    assert summary.rows_written == 250 and summary.replayed_batches == 0
    ids = _ids(cfg)
    assert set(ids) == set(range(650)) and max(ids.values()) == 1
    _assert_offsets_agree(cfg)


def test_checkpoint_with_progress_but_no_table_offsets_stops_before_reading(
    spark,
    kafka_bootstrap,
    new_topics,
    make_config,
) -> None:
    topics = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, topics, 50)
    cfg = make_config(topics)
    _run(spark, cfg)
    shutil.rmtree(cfg.delta.table)

    with pytest.raises(CheckpointMismatchError, match="deleted or replaced"):
        _run(spark, cfg)


def test_raw_kafka_columns_match_sparks_kafka_source(
    spark,
    kafka_bootstrap,
    new_topics,
    make_config,
) -> None:
    (topic,) = new_topics(1, partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(
        topic,
        key=b"k1",
        value=b"v1",
        partition=0,
        headers=[("h", b"x"), ("n", None)],
        timestamp=1_700_000_000_000,
    )
    producer.flush(10)
    producer.produce(topic, key=None, value=None, partition=0)  # a tombstone
    producer.flush(10)
    cfg = make_config([topic])

    _run(spark, cfg, transform=lambda df: df)

    table = DeltaTable(cfg.delta.table).to_pyarrow_table().sort_by("offset")
    assert table.column_names == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    first, second = table.to_pylist()
    assert (first["key"], first["value"], first["topic"], first["partition"]) == (
        b"k1",
        b"v1",
        topic,
        0,
    )
    assert first["offset"] == 0 and first["timestampType"] == 0
    assert int(first["timestamp"].timestamp() * 1000) == 1_700_000_000_000
    assert first["headers"] == [{"key": "h", "value": b"x"}, {"key": "n", "value": None}]
    assert (second["key"], second["value"], second["headers"]) == (None, None, None)


def test_two_concurrent_runs_of_one_pipeline_cannot_both_commit(
    spark,
    kafka_bootstrap,
    new_topics,
    make_config,
    tmp_path,
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 600)
    cfg = make_config(topics, max_records_per_trigger=100)
    other = cfg.with_overrides(checkpoint=str(tmp_path / "checkpoint-of-a-second-run"))
    first, second = Pipeline(spark, cfg), Pipeline(spark, other)
    # Both read the table's (empty) offsets before either commits: a real race.
    queries = [first.start(), second.start()]
    errors = []
    for query in queries:
        try:
            query.awaitTermination()
        except Exception as exc:  # the loser's query fails with the fencing message
            errors.append(str(exc))
    for pipeline in (first, second):
        if pipeline.committer is not None:
            pipeline.committer.close()

    assert len(errors) == 1, errors
    assert "does not start where the table ends" in errors[0]
    ids = _ids(cfg)
    assert set(ids) == set(range(600)) and max(ids.values()) == 1  # the winner ran to the end
    admin = KafkaAdmin(cfg.kafka.client_config())
    stored = DeltaRsOffsetStore(cfg.delta.table, cfg.pipeline_id).read()
    assert stored is not None
    assert stored.offsets == admin.latest(admin.partitions(topics))
