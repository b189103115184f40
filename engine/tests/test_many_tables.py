"""One stream into several Delta tables, exactly once per table (I13): routing by topic, by
record (a column expression) and by a transform that returns one DataFrame per table; each
table's commits carry their own txnAppId and the offsets of what it received; a crash between
two tables' commits of one batch and a lost checkpoint after the tables stopped at different
batches leave every table exact; the consumer group holds, per partition, the minimum over the
tables that read it; tombstones are each table's own; a table added to a pipeline that already
ran joins where the pipeline stands, one removed no longer holds the group back, one deleted
stops the run. Each test runs on both sinks (the delta-spark variant skips where its jars are
missing). Real broker, real tables, real Spark."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable
from pyspark.sql import functions as F

from kafka_delta.cli import main
from kafka_delta.config import ConfigError, PipelineConfig, load_config
from kafka_delta.decoding.failures import reported
from kafka_delta.delta.rs_offset_store import DeltaRsOffsetStore
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.offsets.model import parse_user_metadata
from kafka_delta.pipeline import Pipeline
from kafka_delta.progress.metrics import PrometheusMetrics
from kafka_delta.recovery.checkpoint import CheckpointMismatchError
from kafka_delta_dev.debezium import produce_records
from kafka_delta_dev.faults import armed
from kafka_delta_dev.orders import transform as orders_transform
from kafka_delta_dev.produce import EVENT_TYPES, produce_events, produce_values
from support import REPO, assert_exactly_once, assert_offsets_agree, forget_last_spark_commit

pytestmark = [pytest.mark.spark, pytest.mark.broker]

PAID = EVENT_TYPES.index("paid")


def _tables(
    make_config,
    topics: list[str],
    tables: dict[str, dict],
    engine: dict[str, str] | None = None,
    decoding: dict | None = None,
    **kafka,
) -> PipelineConfig:
    """A config of ``tables:`` (no ``delta:``) on fresh paths, against the test broker, on
    ``engine`` (default: the embedded one)."""
    base = make_config(topics, engine=engine or "embedded", **kafka)
    data = base.model_dump()
    del data["delta"]
    if decoding is not None:
        data["decoding"] = decoding
    root = Path(base.delta.table).parent
    data["tables"] = {name: {"path": str(root / name), **spec} for name, spec in tables.items()}
    return PipelineConfig.model_validate(data)


def _ids(view: PipelineConfig) -> Counter[int]:
    return Counter(DeltaTable(view.delta.table).to_pyarrow_table()["id"].to_pylist())


def _exact(view: PipelineConfig, expected: set[int]) -> None:
    ids = _ids(view)
    assert set(ids) == expected, sorted(set(ids) ^ expected)[:10]
    assert max(ids.values()) == 1, [i for i, n in ids.items() if n > 1][:10]


def _stored(view: PipelineConfig):
    return DeltaRsOffsetStore(view.delta.table, view.pipeline_id).read()


def _group_is_the_minimum(cfg: PipelineConfig) -> None:
    """The group's committed offset of each partition is the least any table reading it
    stores, and Kafka's latest: nothing is left to read for any table."""
    admin = KafkaAdmin(cfg.kafka.client_config())
    partitions = admin.partitions(cfg.kafka.topics)
    least: dict[str, dict[int, int]] = {}
    for view in cfg.table_configs():
        stored = _stored(view)
        assert stored is not None
        assert set(stored.offsets) <= set(view.kafka.topics)  # what that table received
        for t, parts in stored.offsets.items():
            for p, o in parts.items():
                least.setdefault(t, {})[p] = min(o, least.get(t, {}).get(p, o))
    assert admin.committed(cfg.kafka.consumer_group, partitions) == least
    assert least == admin.latest(partitions)


def _cli(config: Path, capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main([*args[:2], "--config", str(config), *args[2:]])
    out, err = capsys.readouterr()
    return status, out + err


def test_a_crash_between_the_tables_in_the_pipelines_first_batch_loses_nothing_on_restart(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine
) -> None:
    """The first batch ever, the first table committed, the run dies: on the kept checkpoint the
    other table is not new to the pipeline (it was there from the start) and its first batch is
    the one the first run planned, from Kafka's earliest. Both tables read both topics (record
    routing): scripts/chaos --fan-out lost 349 records here when the second table joined where
    the first one stood."""
    topics = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, topics, 120)
    cfg = _tables(
        make_config,
        topics,
        {"even": {"route": "id % 2 = 0"}, "odd": {"route": "id % 2 = 1"}},
        engine=sink_engine,
    )
    even, odd = cfg.table_configs()
    with armed("between_tables"), pytest.raises(Exception, match="between_tables"):
        Pipeline(spark, cfg).run()
    _exact(even, set(range(0, 120, 2)))

    Pipeline(spark, cfg).run()  # the same checkpoint: batch 0 again, the first table replays it
    _exact(even, set(range(0, 120, 2)))
    _exact(odd, set(range(1, 120, 2)))
    _group_is_the_minimum(cfg)


def test_topic_routing_lands_each_topic_in_its_table_once_through_a_crash_between_tables(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path, capsys, caplog
) -> None:
    orders, payments = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, [orders], 200)
    produce_events(kafka_bootstrap, [payments], 100, first_id=1000)
    cfg = _tables(
        make_config,
        [orders, payments],
        {"orders": {"topics": [orders]}, "payments": {"topics": [payments]}},
        engine=sink_engine,
    )
    first, second = cfg.table_configs()
    metrics = PrometheusMetrics(cfg.pipeline_id, textfile=tmp_path / "metrics.prom")
    with caplog.at_level(logging.INFO, logger="kafka_delta.pipeline"):
        Pipeline(spark, cfg, listeners=[metrics]).run()
    _exact(first, set(range(200)))
    _exact(second, set(range(1000, 1100)))
    _group_is_the_minimum(cfg)
    # Each table's share is in the batch line and in the metrics.
    assert "tables=2 orders:rows=200,dead=0,v=0 payments:rows=100,dead=0,v=0" in caplog.text
    prom = (tmp_path / "metrics.prom").read_text()
    for table, rows in (("orders", 200), ("payments", 100)):
        labels = f'pipeline="{cfg.pipeline_id}",table="{table}"'
        assert f"kafka_delta_table_rows_written_total{{{labels}}} {rows:.1f}" in prom, prom
    # Each table's commits carry the txnAppId of the pipeline and that table.
    for view in (first, second):
        records = [
            parse_user_metadata(c.get("userMetadata"), cfg.pipeline_id)
            for c in DeltaTable(view.delta.table).history()
        ]
        app_ids = {r.app_id for r in records if r is not None}
        own = f"{cfg.pipeline_id}.{view.table_name}."
        assert app_ids and all(a.startswith(own) for a in app_ids), app_ids

    # The run dies between the two tables' commits of a batch: the first table has it.
    produce_events(kafka_bootstrap, [orders], 100, first_id=200)
    produce_events(kafka_bootstrap, [payments], 50, first_id=1100)
    with armed("between_tables"), pytest.raises(Exception, match="between_tables"):
        Pipeline(spark, cfg).run()
    _exact(first, set(range(300)))
    _exact(second, set(range(1000, 1100)))

    Pipeline(spark, cfg).run()  # the same checkpoint: the first table replays, the other writes
    _exact(first, set(range(300)))
    _exact(second, set(range(1000, 1150)))
    _group_is_the_minimum(cfg)
    # On the checkpoint it had: each table judged it by its own txnAppId, none set it aside.
    assert not list(Path(cfg.checkpoint).parent.glob("*.set-aside-*"))

    # The commands, per table.
    conf = tmp_path / "conf" / "tables.yaml"
    conf.parent.mkdir()
    conf.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    status, out = _cli(conf, capsys, "offsets", "show")
    assert status == 0 and "table orders: pipeline" in out and "table payments: pipeline" in out
    status, out = _cli(conf, capsys, "offsets", "verify", "--against-kafka")
    assert status == 0 and "verify: OK: 2 tables" in out, out
    status, out = _cli(conf, capsys, "offsets", "show", "--json")
    assert status == 0 and set(json.loads(out)["tables"]) == {"orders", "payments"}
    status, out = _cli(conf, capsys, "offsets", "show", "--csv")  # the group's: every topic
    assert status == 0 and {line.split(",")[0] for line in out.split()} == {orders, payments}
    status, out = _cli(conf, capsys, "offsets", "reset", "--to-current", "--execute")
    assert status == 0 and "table orders:" in out and "table payments:" in out, out
    status, out = _cli(conf, capsys, "table", "maintain", "--only", "compact")
    assert status == 0 and "table orders:" in out and "table payments:" in out, out
    status, out = _cli(conf, capsys, "table", "maintain", "--table", "orders", "--only", "compact")
    assert status == 0 and "table payments:" not in out, out

    # One row of one table removed: verify names it, on that table.
    DeltaTable(first.delta.table).delete("id = 7")
    status, out = _cli(conf, capsys, "offsets", "verify", "--table", "orders", "--against-kafka")
    assert status == 1 and "lost" in out, out

    # A reset of one table moves it alone; the group holds the least of the tables'.
    produce_events(kafka_bootstrap, [payments], 20, first_id=2000)
    before = _stored(first).offsets
    status, out = _cli(
        conf,
        capsys,
        "offsets",
        "reset",
        "--table",
        "payments",
        "--to-latest",
        "--execute",
        "--allow-skip",
    )
    assert status == 0, out
    assert _stored(first).offsets == before
    admin = KafkaAdmin(cfg.kafka.client_config())
    latest = admin.latest(admin.partitions([payments]))
    assert _stored(second).offsets == latest
    _group_is_the_minimum(cfg)


def test_record_routing_after_a_lost_checkpoint_with_the_tables_at_different_batches(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path, capsys
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 400)
    produce_values(kafka_bootstrap, topics[0], [(0, b"not json")])
    cfg = _tables(
        make_config,
        topics,
        {"all": {}, "paid": {"route": "event_type = 'paid'"}},
        engine=sink_engine,
        max_records_per_trigger=100,
    )
    every, paid = cfg.table_configs()
    # Batch 0 reaches both tables; batch 1 only the first, then the run dies.
    with armed("between_tables", after=1), pytest.raises(Exception, match="between_tables"):
        Pipeline(spark, cfg).run()
    assert _stored(every).offsets != _stored(paid).offsets  # stopped at different batches

    shutil.rmtree(cfg.checkpoint)  # the checkpoint is lost
    produce_events(kafka_bootstrap, topics, 100, first_id=400)
    Pipeline(spark, cfg).run()

    _exact(every, set(range(500)))
    _exact(paid, {i for i in range(500) if i % len(EVENT_TYPES) == PAID})
    _group_is_the_minimum(cfg)
    # The record no route can judge is a dead letter of each table that reads its topic.
    for view in (every, paid):
        dead = DeltaTable(view.dead_letter_table).to_pyarrow_table()
        assert dead.num_rows == 1

    # One table moved on alone: the group stays at what both hold (the other's offsets).
    conf = tmp_path / "conf" / "tables.yaml"
    conf.parent.mkdir()
    conf.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    produce_events(kafka_bootstrap, topics, 20, first_id=500)
    reset = ["offsets", "reset", "--table", "all", "--to-latest", "--execute", "--allow-skip"]
    status, out = _cli(conf, capsys, *reset)
    assert status == 0, out
    admin = KafkaAdmin(cfg.kafka.client_config())
    partitions = admin.partitions(topics)
    assert _stored(every).offsets == admin.latest(partitions) != _stored(paid).offsets
    assert admin.committed(cfg.kafka.consumer_group, partitions) == _stored(paid).offsets


def _bronze_and_silver(df):
    """Two outputs from one read: every record as it came, and the paid orders typed."""
    events = orders_transform(df)
    return {
        "bronze": df.select("topic", "partition", "offset", F.col("value").cast("string")),
        "silver": events.where((F.col("event_type") == "paid") | F.col("_error").isNotNull()),
    }


def test_a_transform_returning_one_dataframe_per_table_fills_each_once(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 200)
    cfg = _tables(
        make_config,
        topics,
        {"bronze": {}, "silver": {"mode": "upsert", "merge_keys": ["id"]}},
        engine=sink_engine,
        max_records_per_trigger=120,
    )
    bronze, silver = cfg.table_configs()
    Pipeline(spark, cfg, transform=_bronze_and_silver).run()
    produce_events(kafka_bootstrap, topics, 100, first_id=200)
    Pipeline(spark, cfg, transform=_bronze_and_silver).run()

    rows = DeltaTable(bronze.delta.table).to_pyarrow_table()
    positions = set(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True))
    assert rows.num_rows == len(positions) == 300
    _exact(silver, {i for i in range(300) if i % len(EVENT_TYPES) == PAID})
    _group_is_the_minimum(cfg)


def test_tables_config_is_validated_and_read_from_a_file(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    data = {
        "pipeline_id": "shop",
        "kafka": {
            "bootstrap_servers": "127.0.0.1:9",
            "topics": ["orders", "payments"],
            "consumer_group": "shop",
        },
        "tables": {
            "orders": {"path": "data/orders", "topics": ["orders"]},
            "payments": {
                "path": "data/payments",
                "topics": ["payments"],
                "mode": "upsert",
                "merge_keys": ["id"],
                "dead_letters": {"table": "data/bad"},
            },
        },
        "checkpoint": "data/checkpoint",
    }
    (conf / "local.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(conf / "local.yaml")
    orders, payments = cfg.table_configs()
    assert orders.delta.table == str(tmp_path / "data" / "orders") == cfg.delta.table
    assert orders.kafka.topics == ("orders",) and orders.table_name == "orders"
    assert payments.delta.mode == "upsert" and payments.delta.merge_keys == ("id",)
    assert payments.dead_letter_table == str(tmp_path / "data" / "bad")
    assert orders.dead_letter_table == str(tmp_path / "data" / "orders_dead_letters")

    bad = [
        ({"payments": {"path": "data/x", "topics": ["payments"]}}, "which no table reads"),
        ({"a": {"path": "data/x", "topics": ["nope"]}, "b": {"path": "data/y"}}, "does not list"),
        ({"a": {"path": "data/x"}, "b": {"path": "data/x"}}, "location of its own"),
        ({"a": {"path": "data/x", "mode": "upsert"}}, "merge_keys"),
        ({"a b": {"path": "data/x"}}, "not a table name"),
    ]
    for tables, message in bad:
        (conf / "bad.yaml").write_text(yaml.safe_dump({**data, "tables": tables}))
        with pytest.raises(ConfigError, match=message):
            load_config(conf / "bad.yaml")


def test_the_run_command_refuses_table(tmp_path: Path, capsys) -> None:
    """The run command reads the topics once for every table: ``--table`` (which the offsets
    and table commands take) is refused in one sentence before anything starts."""
    conf = tmp_path / "local.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                "pipeline_id": "shop",
                "kafka": {
                    "bootstrap_servers": "127.0.0.1:9",
                    "topics": ["o"],
                    "consumer_group": "g",
                },
                "tables": {"a": {"path": "data/a"}, "b": {"path": "data/b"}},
                "checkpoint": "cp",
            }
        )
    )
    status, out = _cli(conf, capsys, "--table", "a")
    assert status == 2 and "the run command writes every table" in out, out
    assert not (tmp_path / "cp").exists()


# main before `tables:` existed: the engine that wrote the tables users have today.
OLD_MAIN = "c0cce047c21385317195c80946b7671794999d0e"
ENGINE_SRC = "template/{{cookiecutter.project_slug}}/src"

# One run of that engine, in a process of its own (argv: the config as JSON, the engine's
# folder); it exits at once after the run (deltalake may abort at interpreter exit).
OLD_RUN = """
import json, os, sys
import kafka_delta
assert kafka_delta.__file__.startswith(sys.argv[2]), kafka_delta.__file__
from kafka_delta.config import PipelineConfig
from kafka_delta.pipeline import Pipeline
from kafka_delta_dev.local_spark import local_session
spark = local_session("old-main")
spark.sparkContext.setLogLevel("ERROR")
Pipeline(spark, PipelineConfig.model_validate(json.loads(sys.argv[1]))).run()
sys.stdout.flush()
os._exit(0)
"""


def _old_engine(where: Path) -> Path:
    """The engine and its dev package as they were at :data:`OLD_MAIN` (git archive)."""
    archive = subprocess.run(
        [
            "git",
            "-C",
            str(REPO),
            "archive",
            OLD_MAIN,
            f"{ENGINE_SRC}/kafka_delta",
            f"{ENGINE_SRC}/kafka_delta_dev",
        ],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return where / ENGINE_SRC


def test_a_table_written_before_tables_existed_runs_on_unchanged(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path
) -> None:
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{OLD_MAIN}^{{commit}}"], capture_output=True
    )
    if found.returncode != 0:
        pytest.skip(
            f"this clone lacks commit {OLD_MAIN[:12]} (a shallow clone): the table is written by "
            "the engine as it was there"
        )
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 300)
    cfg = make_config(topics, max_records_per_trigger=100)
    old = _old_engine(tmp_path / "old")
    # The keys the old engine's config had: what the user's config file held then.
    data = cfg.model_dump(mode="json", exclude_defaults=True)
    data.pop("tables", None)
    result = subprocess.run(
        [sys.executable, "-c", OLD_RUN, json.dumps(data), str(old)],
        env={**os.environ, "PYTHONPATH": str(old), "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert_exactly_once(cfg, 300)

    # This engine, the same config, table and checkpoint: the old checkpoint's last batch,
    # which Spark had not recorded, is still the table's (same txnAppId): a replay.
    forget_last_spark_commit(cfg)
    produce_events(kafka_bootstrap, topics, 100, first_id=300)
    Pipeline(spark, cfg).run()
    assert_exactly_once(cfg, 400)
    assert_offsets_agree(cfg)
    # It went on with that checkpoint (not set aside as one the table moved past).
    assert not list(Path(cfg.checkpoint).parent.glob("*.set-aside-*"))


def test_tombstones_are_each_tables_own(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path
) -> None:
    """One topic read by two upsert tables: a tombstone deletes its key in the table whose
    ``tombstones`` is ``delete``, and is a dead letter ("value is null", with its key) in the
    one whose setting is ``dead_letter``, as a pipeline of that table alone writes it."""
    (topic,) = new_topics(1, partitions=1)
    (tmp_path / "value.ddl").write_text("id BIGINT, name STRING")
    (tmp_path / "key.ddl").write_text("id BIGINT")

    def key(i: int) -> bytes:
        return json.dumps({"id": i}).encode()

    rows = [(0, key(i), json.dumps({"id": i, "name": f"n{i}"}).encode()) for i in range(4)]
    produce_records(kafka_bootstrap, topic, [*rows, (0, key(1), None)])  # then id 1's tombstone
    upsert = {"mode": "upsert", "merge_keys": ["id"]}
    cfg = _tables(
        make_config,
        [topic],
        {"live": {**upsert, "tombstones": "delete"}, "kept": upsert},
        engine=sink_engine,
        transform=None,
        decoding={
            "value": {"format": "json", "schema_file": str(tmp_path / "value.ddl")},
            "key": {"format": "json", "schema_file": str(tmp_path / "key.ddl")},
        },
    )
    live, kept = cfg.table_configs()
    Pipeline(spark, cfg).run()

    assert sorted(_ids(live)) == [0, 2, 3]
    assert sorted(_ids(kept)) == [0, 1, 2, 3]
    (dead,) = DeltaTable(kept.dead_letter_table).to_pyarrow_table().to_pylist()
    assert (dead["error"], dead["key"], dead["value"]) == ("value is null", key(1), None)
    assert not Path(live.dead_letter_table).exists()


def test_a_table_added_joins_where_the_pipeline_stands_one_removed_or_deleted_is_told_apart(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, caplog
) -> None:
    """A table added to a pipeline that already ran (on its checkpoint, through a crash before
    its first commit, or after the checkpoint was lost) receives records from where the
    pipeline stands, says so, and is filled with the earlier ones once it and the checkpoint are
    deleted; a table removed from the config no longer holds the group back and, listed again,
    catches up; a table deleted stops the run with that sentence."""
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 200)
    single = make_config(topics, engine=sink_engine)  # today's pipeline of one table
    Pipeline(spark, single).run()
    root = Path(single.delta.table).parent

    def adding(**tables: str) -> PipelineConfig:
        """The same pipeline and checkpoint, its table first under tables:, then ``tables``
        (name: the event type it takes)."""
        data = single.model_dump()
        del data["delta"]
        data["tables"] = {"all": {"path": single.delta.table}} | {
            name: {"path": str(root / name), "route": f"event_type = '{kind}'"}
            for name, kind in tables.items()
        }
        return PipelineConfig.model_validate(data)

    def kind(ids: range, event: str) -> set[int]:
        return {i for i in ids if EVENT_TYPES[i % len(EVENT_TYPES)] == event}

    # Added on the checkpoint the pipeline has; the run dies before its first commit.
    produce_events(kafka_bootstrap, topics, 100, first_id=200)
    cfg = adding(paid="paid")
    every, paid = cfg.table_configs()
    with armed("between_tables"), pytest.raises(Exception, match="between_tables"):
        Pipeline(spark, cfg).run()
    with caplog.at_level(logging.INFO, logger="kafka_delta.pipeline"):
        Pipeline(spark, cfg).run()
    assert "table paid is new to pipeline" in caplog.text
    _exact(every, set(range(300)))
    _exact(paid, kind(range(200, 300), "paid"))
    _group_is_the_minimum(cfg)

    # Added after the checkpoint was lost: it joins where the other tables stand.
    shutil.rmtree(cfg.checkpoint)
    produce_events(kafka_bootstrap, topics, 100, first_id=300)
    cfg = adding(paid="paid", shipped="shipped")
    every, paid, shipped = cfg.table_configs()
    Pipeline(spark, cfg).run()
    _exact(every, set(range(400)))
    _exact(paid, kind(range(200, 400), "paid"))
    _exact(shipped, kind(range(300, 400), "shipped"))

    # The earlier records, into that table alone: delete it and the checkpoint; the new
    # checkpoint reads from the start for it, and the other tables pass over what they hold.
    shutil.rmtree(shipped.delta.table)
    shutil.rmtree(cfg.checkpoint)
    Pipeline(spark, cfg).run()
    _exact(every, set(range(400)))
    _exact(paid, kind(range(200, 400), "paid"))
    _exact(shipped, kind(range(400), "shipped"))
    _group_is_the_minimum(cfg)

    # Removed from the config: its table stays as it is, and the group follows the others.
    produce_events(kafka_bootstrap, topics, 40, first_id=400)
    cfg = adding(paid="paid")
    Pipeline(spark, cfg).run()
    _exact(every, set(range(440)))
    _group_is_the_minimum(cfg)
    _exact(shipped, kind(range(400), "shipped"))
    # Listed again: it catches up from where it stopped; the others pass over what they hold.
    cfg = adding(paid="paid", shipped="shipped")
    Pipeline(spark, cfg).run()
    _exact(every, set(range(440)))
    _exact(paid, kind(range(200, 440), "paid"))
    _exact(shipped, kind(range(440), "shipped"))

    # Deleted: named by the other table's commits, it holds nothing: the run stops.
    shutil.rmtree(paid.delta.table)
    with pytest.raises(CheckpointMismatchError, match=r"paid holds no offsets .* deleted or") as e:
        Pipeline(spark, cfg).run()
    # What the sentence says to do, done: the checkpoint deleted, the deleted table is read
    # again from Kafka's earliest offsets, and the others pass over what they hold.
    assert "re-read it from Kafka's earliest offsets (the other tables pass over what" in str(
        e.value
    )
    shutil.rmtree(cfg.checkpoint)
    Pipeline(spark, cfg).run()
    _exact(every, set(range(440)))
    _exact(paid, kind(range(440), "paid"))
    _exact(shipped, kind(range(440), "shipped"))


def test_a_table_deleted_after_a_run_died_past_the_commits_stops_the_run_not_joins(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path, capsys
) -> None:
    """Found by the operations harness on two tables (a crash after the Delta commits, then a
    table deleted): the newest commit of the other table is of a batch the checkpoint did not
    finish, and such a commit may name a table that never committed (one added by the run that
    died), so it does not count. The commit before it names the deleted table: the table was
    there, so the run stops with the deleted-table sentence rather than let it join where the
    pipeline stands (its earlier records would never come back). Following the sentence fills
    it again."""
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 100)
    cfg = _tables(make_config, topics, {"all": {}, "even": {"route": "id % 2 = 0"}},
                  engine=sink_engine)  # fmt: skip
    every, even = cfg.table_configs()
    Pipeline(spark, cfg).run()
    produce_events(kafka_bootstrap, topics, 40, first_id=100)
    with armed("after_delta_commit"), pytest.raises(Exception, match="after_delta_commit"):
        Pipeline(spark, cfg).run()  # both tables committed the batch; Spark's log did not
    shutil.rmtree(even.delta.table)

    with pytest.raises(CheckpointMismatchError, match=r"even holds no offsets .* deleted or") as e:
        Pipeline(spark, cfg).run()

    assert "re-read it from Kafka's earliest offsets" in str(e.value)
    shutil.rmtree(cfg.checkpoint)
    # A reset of the whole pipeline meanwhile (the harness's was of a recreated topic) moves
    # the tables that exist and says the deleted one has nothing to move; it used to stop at it
    # with an error, the others' resets committed.
    path = tmp_path / "tables.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    status, out = _cli(path, capsys, "offsets", "reset", "--to-latest", "--allow-skip", "--execute")
    assert status == 0, out
    assert f"table even:\nno Delta table at {even.delta.table}: no offsets to reset" in out, out
    Pipeline(spark, cfg).run()
    _exact(every, set(range(140)))
    _exact(even, set(range(0, 140, 2)))
    _group_is_the_minimum(cfg)


def test_two_runs_racing_on_two_checkpoints_send_each_dead_letter_once_to_the_shared_table(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path, caplog
) -> None:
    """Found by the operations harness (``produce_bad(15, 90) race``, both runs on two
    checkpoints, two tables sharing one dead-letter table): the dead letters of a batch are
    committed before the tables' commits, so the main tables' fence comes too late for them, and
    their own rule, by position, read the table and then committed on whatever it had become. A
    run that read the positions before another run sent the same dead letters sent them again
    (40 doubled, every time, on delta-rs). Here the other run commits the whole batch right
    after this one read the dead-letter table (it did not exist yet: the other run creates it):
    this one finds the table changed, reads it again, sends nothing, and is fenced at its own
    table's commit. Each bad record is in the dead-letter table once (without the fence all 12
    were there twice, on either sink); the loser's checkpoint then runs on, exactly."""
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 40)
    shared = str(tmp_path / "dead-letters")
    cfg = _tables(
        make_config,
        topics,
        {"all": {}, "even": {"route": "id % 2 = 0"}},
        engine=sink_engine,
    ).with_overrides(**{"dead_letters.table": shared})
    every, even = cfg.table_configs()
    assert every.dead_letter_table == even.dead_letter_table == shared
    Pipeline(spark, cfg).run()
    bad = [(n % 2, f'{{"broken": {n}, "id": '.encode()) for n in range(12)]
    produce_values(kafka_bootstrap, topics[0], bad)
    produce_events(kafka_bootstrap, topics, 10, first_id=40)

    other = cfg.with_overrides(checkpoint=str(tmp_path / "other-checkpoint"))
    loser = Pipeline(spark, other)
    queue = loser.tables[0].dead_letters  # "all": the first table to send the batch's
    read_positions = queue._held
    raced: list[bool] = []

    def read_then_lose_the_race(*args):
        found = read_positions(*args)
        if not raced:
            # Between this run's reading of the dead-letter table and its commit there, the
            # other checkpoint's run commits the same batch, dead letters and tables.
            raced.append(True)
            Pipeline(spark, cfg).run()
        return found

    queue._held = read_then_lose_the_race
    with caplog.at_level(logging.INFO, "kafka_delta.dead_letters"):
        with pytest.raises(Exception) as fenced:  # Spark's, carrying the engine's sentence
            loser.run()
    assert raced
    assert reported(fenced.value, "FencingError") is not None, fenced.value
    letters = DeltaTable(shared).to_pyarrow_table()["value"].to_pylist()
    assert sorted(letters) == sorted(v for _, v in bad), Counter(letters).most_common(3)
    assert "changed while its dead letters were sent" in caplog.text

    Pipeline(spark, other).run()  # behind the tables: set aside, resumes from them
    assert sorted(DeltaTable(shared).to_pyarrow_table()["value"].to_pylist()) == sorted(
        v for _, v in bad
    )
    _exact(every, set(range(50)))
    _exact(even, set(range(0, 50, 2)))
