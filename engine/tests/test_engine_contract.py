"""The engine contract, proven on every engine (docs/design.md sections 4 and 5).

Parametrized over the sinks (delta-rs, delta-spark) and over whole engines, presets and mixes:
embedded (confluent-kafka source + delta-rs), cluster (Spark's kafka source + delta-spark),
and the two mixes. An engine whose JVM connector jars this Spark session lacks is skipped with
the reason ``delta-spark/spark-sql-kafka jars not on the classpath``; set
``KAFKA_DELTA_CONNECTORS=packages`` to fetch them (needs Maven access) and run everything.
Tables are read back with delta-rs and Kafka with confluent-kafka, whatever wrote them.
"""

from __future__ import annotations

import json
import shutil

import pytest
from deltalake import DeltaTable

from conftest import engine_config, skip_without_connectors
from kafka_delta.engine_factory import build_engine
from kafka_delta.offsets.model import BatchCommit
from kafka_delta.pipeline import Pipeline
from kafka_delta_dev.produce import produce_events, produce_values
from kafka_delta_dev.pytest_plugin import KAFKA_SOURCE_AT_HAND
from support import assert_exactly_once, assert_offsets_agree, forget_last_spark_commit
from test_spark_only import refuse_delta_rs_in_the_engine

pytestmark = [pytest.mark.spark, pytest.mark.broker]

SINKS = ["delta_rs", "delta_spark"]
# Every mix of the two sources and two sinks. Spark's kafka source runs itself where its jar is
# at hand, else through its stand-in (kafka_delta_dev.spark_kafka_standin), whose planning
# test_cluster_path.py holds to the source's: the same cases, not twice.
ENGINES = [
    "embedded",
    "embedded+delta_spark",
    *(
        ["cluster", "spark_kafka+delta_rs"]
        if KAFKA_SOURCE_AT_HAND
        else ["standin+delta_spark", "standin+delta_rs"]
    ),
]


def _spark_only(engine: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """I14, dynamically: on a delta-spark sink the engine may not import deltalake (the test's
    own read-backs still do, with delta-rs, as an independent check)."""
    if engine["sink"] == "delta_spark":
        refuse_delta_rs_in_the_engine(monkeypatch)


@pytest.fixture(params=SINKS)
def sink_engine(request, spark, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    engine = {"source": "embedded", "sink": request.param}
    skip_without_connectors(spark, engine)
    _spark_only(engine, monkeypatch)
    return engine


@pytest.fixture(params=ENGINES)
def engine(request, spark, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    chosen = engine_config(request.param)
    skip_without_connectors(spark, chosen)
    _spark_only(chosen, monkeypatch)
    return chosen


def _commit(batch_id: int, end: int, app: str = "test-pipeline.q1") -> BatchCommit:
    return BatchCommit("test-pipeline", app, batch_id, {"o": {0: end}})


def _rows(spark, *rows: tuple) -> object:
    return spark.createDataFrame(list(rows), "id long, value string, v long")


def _table(cfg) -> list[tuple]:
    table = DeltaTable(cfg.delta.table).to_pyarrow_table().sort_by("id")
    return list(zip(*(table[c].to_pylist() for c in ("id", "value")), strict=True))


# -- the sink: replay (I2) and upsert ---------------------------------------------------------


def test_replayed_batch_writes_nothing_and_still_reports_success(
    spark, make_config, sink_engine
) -> None:
    cfg = make_config(["o"], engine=sink_engine)
    sink = build_engine(spark, cfg).sink
    first = sink.commit_batch(_rows(spark, (1, "a", 0), (2, "b", 0)), _commit(0, 2), start={})
    version = DeltaTable(cfg.delta.table).version()

    replay = sink.commit_batch(_rows(spark, (9, "z", 0)), _commit(0, 2), start={})

    assert (first.written, first.rows, first.delta_version) == (True, 2, version)
    assert (replay.written, replay.rows, replay.delta_version) == (False, 0, None)
    assert DeltaTable(cfg.delta.table).version() == version
    assert _table(cfg) == [(1, "a"), (2, "b")]


def test_a_new_checkpoints_batch_zero_is_written_not_taken_for_a_replay(
    spark, make_config, sink_engine
) -> None:
    cfg = make_config(["o"], engine=sink_engine)
    sink = build_engine(spark, cfg).sink
    sink.commit_batch(_rows(spark, (1, "a", 0)), _commit(0, 1, "test-pipeline.old"), start={})
    sink.commit_batch(
        _rows(spark, (2, "b", 0)), _commit(1, 2, "test-pipeline.old"), start={"o": {0: 1}}
    )

    fresh = sink.commit_batch(
        _rows(spark, (3, "c", 0)), _commit(0, 3, "test-pipeline.new"), start={"o": {0: 2}}
    )

    assert fresh.written
    assert _table(cfg) == [(1, "a"), (2, "b"), (3, "c")]


def test_upsert_keeps_one_row_per_key_and_a_replay_changes_nothing(
    spark, make_config, sink_engine
) -> None:
    cfg = make_config(["o"], engine=sink_engine, delta={"mode": "upsert", "merge_keys": ["id"]})
    sink = build_engine(spark, cfg).sink
    sink.commit_batch(_rows(spark, (1, "a", 0), (2, "b", 0)), _commit(0, 2), start={})
    sink.commit_batch(_rows(spark, (1, "c", 1), (3, "d", 0)), _commit(1, 4), start={"o": {0: 2}})
    version = DeltaTable(cfg.delta.table).version()

    replay = sink.commit_batch(_rows(spark, (1, "zz", 9)), _commit(1, 4), start={"o": {0: 2}})

    assert not replay.written
    assert DeltaTable(cfg.delta.table).version() == version
    assert _table(cfg) == [(1, "c"), (2, "b"), (3, "d")]


def test_upsert_with_order_by_never_lets_an_older_version_overwrite_a_newer_row(
    spark, make_config, sink_engine
) -> None:
    cfg = make_config(
        ["o"],
        engine=sink_engine,
        delta={"mode": "upsert", "merge_keys": ["id"], "order_by": "v"},
    )
    sink = build_engine(spark, cfg).sink
    sink.commit_batch(_rows(spark, (1, "v5", 5), (2, "v1", 1)), _commit(0, 2), start={})

    sink.commit_batch(_rows(spark, (1, "v3", 3), (2, "v2", 2)), _commit(1, 4), start={"o": {0: 2}})

    assert _table(cfg) == [(1, "v5"), (2, "v2")]


# -- whole engines against the broker --------------------------------------------------------


def test_records_land_exactly_once_and_the_group_holds_the_stored_offsets(
    spark, kafka_bootstrap, new_topics, make_config, engine
) -> None:
    topics = new_topics(2, partitions=3)
    produce_events(kafka_bootstrap, topics, 3000)
    cfg = make_config(topics, engine=engine, max_records_per_trigger=700)

    summary = Pipeline(spark, cfg).run()

    assert summary.batches >= 5  # 3000 records at <= 700 per trigger
    assert summary.rows_written == 3000
    assert_exactly_once(cfg, 3000)
    assert_offsets_agree(cfg)  # stored == planned == group committed == latest (I4)
    assert summary.commit_back is not None and summary.commit_back.failed == 0


def test_crash_after_delta_commit_before_spark_commit_replays_as_a_no_op(
    spark, kafka_bootstrap, new_topics, make_config, engine
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 500)
    cfg = make_config(topics, engine=engine, max_records_per_trigger=200)
    Pipeline(spark, cfg).run()
    version = DeltaTable(cfg.delta.table).version()

    forget_last_spark_commit(cfg)
    summary = Pipeline(spark, cfg).run()

    assert summary.replayed_batches == 1 and summary.rows_written == 0
    assert DeltaTable(cfg.delta.table).version() == version
    produce_events(kafka_bootstrap, topics, 100, first_id=500)
    Pipeline(spark, cfg).run()
    assert_exactly_once(cfg, 600)
    assert_offsets_agree(cfg)


def test_deleted_checkpoint_resumes_from_offsets_stored_in_the_table(
    spark, kafka_bootstrap, new_topics, make_config, engine
) -> None:
    topics = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, topics, 400)
    cfg = make_config(topics, engine=engine, max_records_per_trigger=150)
    Pipeline(spark, cfg).run()

    shutil.rmtree(cfg.checkpoint)  # a new checkpoint restarts batch ids at 0 (I3)
    produce_events(kafka_bootstrap, topics, 250, first_id=400)
    summary = Pipeline(spark, cfg).run()

    assert summary.rows_written == 250 and summary.replayed_batches == 0
    assert_exactly_once(cfg, 650)
    assert_offsets_agree(cfg)


def _order(event_id: int, amount: float) -> bytes:
    return json.dumps(
        {
            "id": event_id,
            "event_type": "order",
            "amount": amount,
            "event_time": "2026-01-01T00:00:00Z",
        }
    ).encode()


def test_upsert_the_same_key_twice_in_a_batch_and_across_batches_ends_as_its_latest_value(
    spark, kafka_bootstrap, new_topics, make_config, engine
) -> None:
    (topic,) = new_topics(1, partitions=2)
    # Records of one key share a partition, as a keyed producer sends them.
    produce_values(
        kafka_bootstrap, topic, [(0, _order(1, 1.0)), (1, _order(2, 20.0)), (0, _order(1, 2.0))]
    )
    cfg = make_config([topic], engine=engine, delta={"mode": "upsert", "merge_keys": ["id"]})
    first = Pipeline(spark, cfg).run()
    produce_values(kafka_bootstrap, topic, [(0, _order(1, 3.0)), (1, _order(3, 30.0))])

    second = Pipeline(spark, cfg).run()

    assert first.batches == 1 and second.batches == 1
    table = DeltaTable(cfg.delta.table).to_pyarrow_table().sort_by("id")
    assert table["id"].to_pylist() == [1, 2, 3]
    assert table["amount"].to_pylist() == [3.0, 20.0, 30.0]
    assert_offsets_agree(cfg)
