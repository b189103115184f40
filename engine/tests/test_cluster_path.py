"""The cluster engine's driver logic, run where Spark's kafka connector cannot be had: through
the stand-in of Spark's kafka source (kafka_delta_dev.spark_kafka_standin, whose docstring says
what of Spark's source it reproduces and what it cannot prove), and through Spark's own source
wherever its jars are on the classpath (the same tests, the ``spark_kafka`` parameter).

What this file proves for Spark's source, each against the real broker and real tables:

- its planning as the stand-in reproduces it (initial offsets persisted in ``sources/0/0``,
  ``maxOffsetsPerTrigger``, the ranges of a batch), unit by unit;
- a first run at its initial offsets, at ``latest`` or at offsets of its own, is never fenced
  and says what it skips;
- a new checkpoint's ``startingOffsets`` built from the stored offsets, a topic added since
  included from its earliest offset;
- a topic added to a running checkpoint, and one dropped from it (Spark's source takes a
  dropped partition for data loss: the pipeline starts a new checkpoint from the table);
- a recreated topic: Spark's source reads no topic ids; the driver compares the stored ids
  with Kafka's before the query starts (and in every batch), and stops in one sentence, or,
  with ``fail_on_data_loss: false``, reads the new topic from its start;
- dead letters of records the decoder rejects (decoding runs through ``mapInArrow`` here);
- ``offsets show`` and ``offsets verify --against-kafka`` on a table the path wrote;
- the Databricks bundle's entry point and arguments, run to the end.

The engine contract (exactly once, replay after a crash, a deleted checkpoint, upsert) runs on
the stand-in in test_engine_contract.py; a graceful stop on it in test_graceful_stop.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from conftest import STANDIN, skip_without_connectors
from kafka_delta.cli import main
from kafka_delta.pipeline import Pipeline
from kafka_delta.recovery.checkpoint import CheckpointLog
from kafka_delta_dev.produce import ensure_topics, produce_events, produce_values
from kafka_delta_dev.spark_kafka_standin import OffsetRange, rate_limit, split_ranges
from support import PROJECT, assert_exactly_once, assert_offsets_agree, table_ids

pytestmark = [pytest.mark.spark, pytest.mark.broker]


@pytest.fixture(params=["standin", "spark_kafka"])
def spark_kafka(request, spark) -> dict[str, str]:
    """Spark's kafka source with the delta-rs sink: the stand-in, and the real one where its
    jars are on the classpath."""
    engine = {
        "source": STANDIN if request.param == "standin" else "spark_kafka",
        "sink": "delta_rs",
    }
    skip_without_connectors(spark, engine)
    return engine


# -- the planning the stand-in reproduces, unit by unit ---------------------------------------


def test_max_offsets_per_trigger_is_shared_as_sparks_rate_limit_shares_it() -> None:
    # KafkaMicroBatchStream.rateLimit: in proportion to what each partition has; a share below
    # one record is rounded up (never starved), the others down; never past the latest.
    start = {("a", 0): 0, ("b", 0): 0}
    until = {("a", 0): 100, ("b", 0): 1, ("c", 0): 50}

    limited = rate_limit(10, start, until, lambda new: {tp: 40 for tp in new})

    # sizes: a 100, b 1, c 10 (new: from its earliest, 40) of 111; shares 9.0, 0.09, 0.9
    assert limited == {("a", 0): 9, ("b", 0): 1, ("c", 0): 41}
    assert rate_limit(1000, start, until, lambda new: {tp: 0 for tp in new}) == until


def test_a_batchs_ranges_are_split_as_sparks_range_calculator_splits_them() -> None:
    ranges = [OffsetRange("a", 0, 0, 100), OffsetRange("b", 0, 0, 10), OffsetRange("c", 0, 5, 5)]

    split = [(r.topic, r.start, r.end) for r in split_ranges(ranges, 4)]

    # b is too small to split (rounds to one part), so a takes the other 3 of 4 parts; the
    # empty range of c is dropped.
    assert split == [("a", 0, 33), ("a", 33, 66), ("a", 66, 100), ("b", 0, 10)]
    assert len(split_ranges(ranges, 2)) == 2  # enough ranges already: nothing split


# -- first runs ---------------------------------------------------------------------------------


def test_a_first_run_starts_at_the_initial_offsets_it_persisted_and_is_never_fenced(
    spark, kafka_bootstrap, new_topics, make_config, spark_kafka, caplog, tmp_path: Path
) -> None:
    earliest, latest = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, [earliest], 40)
    produce_events(kafka_bootstrap, [latest], 40, first_id=40)
    from_earliest = make_config([earliest], engine=spark_kafka, max_records_per_trigger=15)
    from_latest = make_config(
        [latest], engine=spark_kafka, starting_offsets="latest"
    ).with_overrides(
        **{"delta.table": str(tmp_path / "latest"), "checkpoint": str(tmp_path / "latest_cp")}
    )

    caplog.set_level("INFO")
    assert Pipeline(spark, from_earliest).run().batches >= 3
    assert Pipeline(spark, from_latest).run().rows_written == 0

    # Spark's kafka source keeps batch 0's start in sources/0/0: a zero byte, v1, the JSON.
    persisted = (Path(from_earliest.checkpoint) / "sources" / "0" / "0").read_bytes()
    assert persisted.startswith(b"\x00v1\n")
    assert json.loads(persisted[4:]) == {earliest: {"0": 0, "1": 0}}
    assert CheckpointLog(None, from_latest.checkpoint).initial_offsets() == {latest: {0: 20, 1: 20}}
    started = [r.getMessage() for r in caplog.records if "new checkpoint" in r.getMessage()]
    assert "starting at latest offsets, which skips the 40 record(s)" in started[1]
    produce_events(kafka_bootstrap, [latest], 10, first_id=1000)
    Pipeline(spark, from_latest).run()
    assert_exactly_once(from_earliest, 40)
    assert sorted(table_ids(from_latest)) == list(range(1000, 1010))
    assert_offsets_agree(from_latest)


def test_a_new_checkpoint_starts_from_the_table_and_a_topic_added_since_from_its_earliest(
    spark, kafka_bootstrap, new_topics, make_config, spark_kafka
) -> None:
    first, added = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, [first], 60)
    cfg = make_config([first], engine=spark_kafka)
    Pipeline(spark, cfg).run()
    produce_events(kafka_bootstrap, [first], 20, first_id=60)
    produce_events(kafka_bootstrap, [added], 30, first_id=80)

    shutil.rmtree(cfg.checkpoint)
    both = make_config([first, added], engine=spark_kafka, starting_offsets="latest")
    Pipeline(spark, both).run()

    # startingOffsets: the stored offsets of `first`, -2 (earliest) for every `added` partition.
    initial = CheckpointLog(None, both.checkpoint).initial_offsets()
    assert initial == {first: {0: 30, 1: 30}, added: {0: 0, 1: 0}}
    assert_exactly_once(both, 110)
    assert_offsets_agree(both)


def test_a_topic_added_to_a_checkpoint_starts_at_its_earliest_and_a_dropped_one_sets_it_aside(
    spark, kafka_bootstrap, new_topics, make_config, spark_kafka, caplog
) -> None:
    first, added = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, [first], 40)
    Pipeline(spark, make_config([first], engine=spark_kafka)).run()
    produce_events(kafka_bootstrap, [added], 40, first_id=40)

    both = make_config([first, added], engine=spark_kafka)
    Pipeline(spark, both).run()  # the same checkpoint: `added` is new to its plan
    assert_exactly_once(both, 80)

    # Dropped: Spark's source would take its partitions for data loss ("... are gone") on every
    # restart; the run starts a new checkpoint from the table instead.
    produce_events(kafka_bootstrap, [first, added], 20, first_id=80)
    caplog.set_level("WARNING")
    only_first = make_config([first], engine=spark_kafka)
    dropped = Pipeline(spark, only_first)
    dropped.run()
    assert dropped.set_aside_as is not None
    assert any("cannot follow that on a checkpoint" in r.getMessage() for r in caplog.records)
    # Added back: it resumes where the table stores it stopped; nothing read twice.
    Pipeline(spark, both).run()
    assert_exactly_once(both, 100)
    assert_offsets_agree(both)


# -- faults -------------------------------------------------------------------------------------


def test_a_recreated_topic_is_caught_by_its_id_before_the_query_starts(
    spark, kafka_bootstrap, new_topics, make_config, spark_kafka
) -> None:
    (topic,) = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, [topic], 50)
    cfg = make_config([topic], engine=spark_kafka)
    Pipeline(spark, cfg).run()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result()
    ensure_topics(kafka_bootstrap, [topic], 1)
    produce_events(kafka_bootstrap, [topic], 70, first_id=1000)  # past the stored offset 50
    version = DeltaTable(cfg.delta.table).version()

    # Spark's source reads no topic ids (and 70 > 50 hides the re-creation from its own
    # data-loss check): the driver compares the ids the table stored with Kafka's.
    with pytest.raises(Exception, match=rf"{topic} \(id \S+ then \S+\) were deleted and created"):
        Pipeline(spark, cfg).run()
    assert DeltaTable(cfg.delta.table).version() == version

    skipping = cfg.with_overrides(**{"kafka.fail_on_data_loss": False})
    recovering = Pipeline(spark, skipping)
    recovering.run()
    assert recovering.set_aside_as is not None  # its plan was the old topic's
    assert sorted(table_ids(cfg))[-70:] == list(range(1000, 1070))
    assert_offsets_agree(skipping)


def test_records_the_decoder_rejects_are_dead_letters_once(
    spark, kafka_bootstrap, new_topics, make_config, spark_kafka
) -> None:
    (topic,) = new_topics(1, partitions=1)
    event = {"event_type": "paid", "amount": 1.5, "event_time": "2026-01-01T00:00:00Z"}
    values = [json.dumps({**event, "id": i}).encode() for i in range(6)]
    values[2:2] = [b"{not json", b'{"id": "seven"}']
    produce_values(kafka_bootstrap, topic, [(0, v) for v in values])
    schema = str(PROJECT / "schemas" / "order_event.ddl")
    cfg = make_config([topic], engine=spark_kafka, max_records_per_trigger=3).with_overrides(
        decoding={"value": {"format": "json", "schema_file": schema}}
    )

    Pipeline(spark, cfg).run()
    shutil.rmtree(cfg.checkpoint)  # read again from the table: no dead letter twice
    Pipeline(spark, cfg).run()

    assert sorted(table_ids(cfg)) == list(range(6))
    assert cfg.dead_letter_table is not None
    letters = DeltaTable(cfg.dead_letter_table).to_pyarrow_table().to_pylist()
    assert sorted((r["offset"], r["value"]) for r in letters) == [
        (2, b"{not json"),
        (3, b'{"id": "seven"}'),
    ]


# -- the commands and the bundle's entry point --------------------------------------------------


def test_offsets_show_and_verify_against_kafka_pass_on_a_table_the_path_wrote(
    spark, kafka_bootstrap, new_topics, make_config, spark_kafka, tmp_path: Path, capsys
) -> None:
    topics = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, topics, 200)
    cfg = make_config(topics, engine=spark_kafka, max_records_per_trigger=70)
    Pipeline(spark, cfg).run()
    path = tmp_path / "conf" / "run.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")), encoding="utf-8")

    assert main(["offsets", "show", "--json", "--config", str(path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    verified = main(["offsets", "verify", "--against-kafka", "--config", str(path)])

    assert shown["stored"]["offsets"] == {t: {"0": 50, "1": 50} for t in topics}
    assert verified == 0, capsys.readouterr()


def test_the_bundles_entry_point_with_its_arguments_runs_to_the_end(
    spark, kafka_bootstrap, new_topics, spark_kafka, tmp_path: Path, monkeypatch
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 120)
    bundle = yaml.safe_load((PROJECT / "databricks.yml").read_text(encoding="utf-8"))
    (task,) = bundle["resources"]["jobs"]["orders_stream"]["tasks"]
    # conf/databricks.yaml on this machine: the source under test and the delta-rs sink (no
    # delta-spark jars here), the test's topics; everything else as the bundle deploys it.
    conf = yaml.safe_load((PROJECT / "conf" / "databricks.yaml").read_text(encoding="utf-8"))
    conf["engine"] = spark_kafka
    conf["kafka"]["topics"] = topics
    config = tmp_path / "conf" / "databricks.yaml"  # the bundle syncs conf/ and schemas/
    config.parent.mkdir()
    config.write_text(yaml.safe_dump(conf), encoding="utf-8")
    shutil.copytree(PROJECT / "schemas", tmp_path / "schemas")
    values = {
        "${workspace.file_path}/conf/databricks.yaml": str(config),
        "${var.kafka_bootstrap_servers}": kafka_bootstrap,
        "${var.table}": str(tmp_path / "table"),
        "${var.checkpoint}": str(tmp_path / "checkpoint"),
        "${var.consumer_group}": "bundle-test",
        "${var.trigger}": "available-now",
    }
    argv = [values.get(p, p) for p in task["python_wheel_task"]["parameters"]]
    assert not [a for a in argv if "${" in a], argv
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "17.3")  # as on a job cluster

    from orders_stream.main import main as entry_point  # the wheel task's console script

    monkeypatch.setattr("sys.argv", ["orders-stream", *argv])
    entry_point()  # on Databricks it returns on success (kafka_delta.runtime.process_exit)

    table = DeltaTable(str(tmp_path / "table")).to_pyarrow_table()
    assert sorted(table["id"].to_pylist()) == list(range(120))
