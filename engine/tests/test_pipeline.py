"""End to end on the embedded engine: a real broker, real Delta tables, a real Spark session.

What every engine must do is proven in test_engine_contract.py; this file covers the rest:
offset gaps, dead letters, data loss, fencing, the hook, Kafka's columns."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from kafka_delta.config import PipelineConfig
from kafka_delta.delta.rs_offset_store import DeltaRsOffsetStore
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.pipeline import CheckpointMismatchError, Pipeline
from kafka_delta.progress.summary import RunSummary
from kafka_delta_dev.produce import event, produce_events, produce_values
from support import (
    assert_exactly_once,
    assert_offsets_agree,
    forget_last_spark_commit,
    table_ids,
)

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _run(spark, cfg: PipelineConfig, **pipeline_args) -> RunSummary:
    return Pipeline(spark, cfg, **pipeline_args).run()


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
    assert_offsets_agree(cfg)


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
    producer.produce(topic, key=None, value=None, partition=0)  # a tombstone
    assert producer.flush(60) == 0, "the two records were not acknowledged within 60 s"
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
        if pipeline.progress.committer is not None:
            pipeline.progress.committer.close()

    assert len(errors) == 1, errors
    assert "does not start where the table ends" in errors[0] or "backwards" in errors[0]
    assert_exactly_once(cfg, 600)
    admin = KafkaAdmin(cfg.kafka.client_config())
    stored = DeltaRsOffsetStore(cfg.delta.table, cfg.pipeline_id).read()
    assert stored is not None
    assert stored.offsets == admin.latest(admin.partitions(topics))


def _produce_raw(bootstrap: str, topic: str, values: list[bytes | None]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 4_000_000})
    failures: list[str] = []
    for i, value in enumerate(values):
        producer.produce(
            topic,
            key=f"k{i}".encode(),
            value=value,
            partition=0,
            on_delivery=lambda err, _msg: failures.append(str(err)) if err else None,
        )
        producer.flush(10)  # one record per broker batch: exact watermarks on Tansu too
    assert not failures, failures


BAD_VALUES: list[bytes | None] = [
    b"not json",
    b'{"id": 7, "event_ty',
    None,
    b'{"id": "seven"}',
    b'{"id": 8, "pad": "' + b"x" * 1_200_000 + b'"}',
]


def test_bad_records_go_to_the_dead_letter_table_once_and_never_half_parsed_to_the_table(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    # Kafka refuses a record over 1 MB unless the topic allows it (max.message.bytes).
    (topic,) = new_topics(1, partitions=1, config={"max.message.bytes": "4000000"})
    good = [event(i, random.Random(i)) for i in range(6)]
    values = [good[0], *BAD_VALUES[:2], good[1], good[2], *BAD_VALUES[2:], *good[3:]]
    _produce_raw(kafka_bootstrap, topic, values)
    cfg = make_config([topic], max_records_per_trigger=4)

    summary = _run(spark, cfg)
    assert summary.dead_letters == len(BAD_VALUES)

    table = DeltaTable(cfg.delta.table).to_pyarrow_table()
    assert sorted(table["id"].to_pylist()) == list(range(6))
    assert "_error" not in table.column_names
    dead = DeltaTable(cfg.dead_letter_table).to_pyarrow_table().sort_by("offset")
    assert dead.column_names == [
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "value",
        "error",
        "topic_id",
    ]
    assert len(set(dead["topic_id"].to_pylist())) == 1 and dead["topic_id"][0].as_py()
    bad_offsets = [1, 2, 5, 6, 7]
    assert dead["offset"].to_pylist() == bad_offsets
    assert dead["value"].to_pylist() == BAD_VALUES
    assert dead["key"].to_pylist() == [f"k{o}".encode() for o in bad_offsets]
    assert all(dead["error"].to_pylist()) and all(
        t is not None for t in dead["timestamp"].to_pylist()
    )

    # A new checkpoint resumes after the stored offsets: no bad record is dead-lettered twice.
    shutil.rmtree(cfg.checkpoint)
    summary = _run(spark, cfg)
    assert summary.rows_written == 0 and summary.dead_letters == 0
    assert DeltaTable(cfg.dead_letter_table).to_pyarrow_table().num_rows == len(BAD_VALUES)
    assert_offsets_agree(cfg)


def test_a_dead_letter_table_written_before_topic_ids_gains_the_column_and_keeps_its_rows(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    """A project upgraded from an engine whose dead-letter rows had no ``topic_id``: its table
    takes the new column on the next dead letter, its old rows kept (with a null id)."""
    from deltalake import write_deltalake

    (topic,) = new_topics(1, partitions=1)
    _produce_raw(kafka_bootstrap, topic, [event(1, random.Random(1)), b"oops"])
    cfg = make_config([topic])
    _run(spark, cfg)
    old = DeltaTable(cfg.dead_letter_table).to_pyarrow_table().drop_columns(["topic_id"])
    write_deltalake(cfg.dead_letter_table, old, mode="overwrite", schema_mode="overwrite")
    assert "topic_id" not in DeltaTable(cfg.dead_letter_table).schema().to_arrow().names

    _produce_raw(kafka_bootstrap, topic, [b"oops again", event(2, random.Random(2))])
    summary = _run(spark, cfg)
    assert summary.dead_letters == 1
    dead = DeltaTable(cfg.dead_letter_table).to_pyarrow_table().sort_by("offset")
    assert dead["offset"].to_pylist() == [1, 2]
    ids = dead["topic_id"].to_pylist()
    assert ids[0] is None and ids[1]
    assert_offsets_agree(cfg)


def test_replayed_batch_with_dead_letters_adds_nothing_to_either_table(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    (topic,) = new_topics(1, partitions=1)
    _produce_raw(
        kafka_bootstrap, topic, [event(1, random.Random(1)), b"oops", event(2, random.Random(2))]
    )
    cfg = make_config([topic])
    _run(spark, cfg)
    versions = (DeltaTable(cfg.delta.table).version(), DeltaTable(cfg.dead_letter_table).version())

    forget_last_spark_commit(cfg)
    summary = _run(spark, cfg)

    assert summary.replayed_batches == 1
    assert (
        DeltaTable(cfg.delta.table).version(),
        DeltaTable(cfg.dead_letter_table).version(),
    ) == versions
    assert DeltaTable(cfg.dead_letter_table).to_pyarrow_table()["value"].to_pylist() == [b"oops"]


def test_with_dead_letters_off_a_bad_record_stops_the_pipeline_before_any_commit(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    (topic,) = new_topics(1, partitions=1)
    _produce_raw(kafka_bootstrap, topic, [event(1, random.Random(1)), b"{broken"])
    cfg = make_config([topic]).with_overrides(**{"dead_letters.enabled": False})

    with pytest.raises(Exception, match=r"offset 1: malformed JSON.*dead_letters.enabled: false"):
        _run(spark, cfg)
    assert not Path(cfg.delta.table).exists()


def test_offsets_kafka_no_longer_has_stop_the_pipeline_unless_skipping_is_allowed(
    spark, kafka_bootstrap, new_topics, make_config, caplog
) -> None:
    from confluent_kafka.admin import AdminClient

    from kafka_delta_dev.produce import ensure_topics

    (topic,) = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, [topic], 50)
    cfg = make_config([topic])
    _run(spark, cfg)
    # The topic is deleted and recreated with fewer records: stored offset 50 is gone.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result()
    ensure_topics(kafka_bootstrap, [topic], 1)
    produce_events(kafka_bootstrap, [topic], 20, first_id=1000)
    shutil.rmtree(cfg.checkpoint)  # resume from the offsets stored in the table
    version = DeltaTable(cfg.delta.table).version()

    # Kafka's topic id tells the new topic from the old one (topic_identity.py).
    with pytest.raises(Exception, match=rf"{topic} \(id \S+ then \S+\) were deleted and created"):
        _run(spark, cfg)
    assert DeltaTable(cfg.delta.table).version() == version  # nothing written

    shutil.rmtree(cfg.checkpoint, ignore_errors=True)
    skipping = cfg.with_overrides(**{"kafka.fail_on_data_loss": False})
    summary = _run(spark, skipping)
    assert summary.rows_written == 20  # the recreated topic, read from its beginning
    assert sorted(table_ids(cfg))[-20:] == list(range(1000, 1020))


def test_unreachable_coordinator_never_fails_a_batch_and_the_group_catches_up(
    spark, kafka_bootstrap, new_topics, make_config, tcp_proxy
) -> None:
    from kafka_delta.kafka.commit_back import OffsetCommitter

    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 300)
    cfg = make_config(topics, max_records_per_trigger=100)

    def committer() -> OffsetCommitter:  # the hook reaches Kafka only through the proxy
        return OffsetCommitter(
            {"bootstrap.servers": tcp_proxy.address}, cfg.kafka.consumer_group, timeout_s=1.0
        )

    down = _run(spark, cfg, committer=committer())
    assert down.rows_written == 300 and down.batches >= 3  # every batch committed to Delta
    assert down.commit_back is not None
    assert down.commit_back.succeeded == 0 and down.commit_back.failed >= 1
    admin = KafkaAdmin(cfg.kafka.client_config())
    assert admin.committed(cfg.kafka.consumer_group, admin.partitions(topics)) == {}

    tcp_proxy.start()  # the coordinator is back
    produce_events(kafka_bootstrap, topics, 100, first_id=300)
    up = _run(spark, cfg, committer=committer())
    assert up.commit_back is not None and up.commit_back.failed == 0
    assert_offsets_agree(cfg)
    assert_exactly_once(cfg, 400)
