"""One table is a list of one (kafka_delta.routing, kafka_delta.resume): the rules written for
several tables give a pipeline of one table exactly what it had alone (its stored offsets as
they are, its commit as the batch's, nothing held below its start), whether under ``delta:`` or
as the one entry of ``tables:``; of several tables, each stands for its own topics and its
commits name it. Pure functions: no Spark session, no broker."""

from __future__ import annotations

from pathlib import Path

from kafka_delta.config import PipelineConfig
from kafka_delta.offsets.model import BatchCommit, StoredOffsets, app_id
from kafka_delta.resume import held_below, stream_start
from kafka_delta.routing import TableRun, table_batch, table_range, table_runs


def _config(tmp_path: Path, tables: dict[str, dict] | None = None) -> PipelineConfig:
    data: dict = {
        "pipeline_id": "shop",
        "kafka": {
            "bootstrap_servers": "127.0.0.1:9092",
            "topics": ["orders", "payments"],
            "consumer_group": "shop",
        },
        "delta": {"table": str(tmp_path / "table")},
        "checkpoint": str(tmp_path / "checkpoint"),
    }
    if tables is not None:
        del data["delta"]
        data["tables"] = {
            name: {"path": str(tmp_path / name), **spec} for name, spec in tables.items()
        }
    return PipelineConfig.model_validate(data)


def _runs(config: PipelineConfig) -> list[TableRun]:
    # The rules read no engine part: none is built.
    return table_runs(config.table_configs(), lambda view: (None, None))


# The table stores a topic since dropped from kafka.topics ("refunds"): its store is the
# pipeline's, and a re-added topic resumes there.
STORED = StoredOffsets(
    {"payments": {1: 7, 0: 4}, "refunds": {0: 9}, "orders": {0: 5}},
    3,
    "shop.q0",
    2,
    seq=3,
    topic_ids={"orders": "id-o", "payments": "id-p"},
)
START = {"orders": {0: 5}, "payments": {0: 4, 1: 7}, "refunds": {0: 9}}
BATCH = BatchCommit(
    "shop",
    app_id("shop", "q1"),
    3,
    {"orders": {0: 8}, "payments": {0: 6, 1: 7}},
    topic_ids={"orders": "id-o", "payments": "id-p"},
)


def test_a_pipeline_of_one_table_starts_and_commits_as_that_table_alone(tmp_path: Path) -> None:
    for config in (_config(tmp_path), _config(tmp_path, {"only": {}})):
        (run,) = _runs(config)
        own = run.scoped_stored(STORED)
        assert own is not None and list(own.offsets.items()) == list(STORED.offsets.items())

        start = stream_start([run], [own])
        assert start == STORED and list(start.offsets.items()) == list(STORED.offsets.items())
        assert start.topic_ids == STORED.topic_ids and start.batch_id == 2
        assert held_below(own.offsets, start.offsets) == {}

        assert table_range(run, START, BATCH.end_offsets) == (START, BATCH.end_offsets, {})
        share = table_batch(run, BATCH, START, "q1", [run])
        assert share.commit == BATCH.starting_at(START)
        assert share.commit.user_metadata() == BATCH.starting_at(START).user_metadata()
        assert share.held_below == {}


def test_of_several_tables_each_stands_for_its_topics_and_its_commits_name_it(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, {"orders": {"topics": ["orders"]}, "all": {}})
    orders, every = _runs(config)
    assert orders.scoped(STORED.offsets) == {"orders": {0: 5}}

    # A new checkpoint starts at the least the tables store; "all" holds more of orders.
    behind = StoredOffsets({"orders": {0: 3}}, 1, "shop.orders.q0", 1)
    start = stream_start(
        [orders, every], [orders.scoped_stored(behind), every.scoped_stored(STORED)]
    )
    assert start is not None and start.offsets == {"orders": {0: 3}, "payments": {0: 4, 1: 7}}
    every.held_below = held_below(every.scoped(STORED.offsets), start.offsets)
    assert every.held_below == {"orders": {0: 5}}

    share = table_batch(
        every, BATCH, {"orders": {0: 3}, "payments": {0: 4, 1: 7}}, "q1", [orders, every]
    )
    assert share.commit.app_id == "shop.all.q1" and share.commit.tables == ("orders", "all")
    assert share.start == {"orders": {0: 5}, "payments": {0: 4, 1: 7}}  # from what it holds
    assert share.held_below == {"orders": {0: 5}}
    first = table_batch(orders, BATCH, START, "q1", [orders, every])
    assert first.commit.end_offsets == {"orders": {0: 8}}
    assert first.commit.topic_ids == {"orders": "id-o"} and first.commit.app_id == "shop.orders.q1"
