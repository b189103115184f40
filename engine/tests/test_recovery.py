"""Operator actions lose nothing and every restart recovers (I8, I9), on both sinks: a Delta
RESTORE is read again, a run fenced mid-batch ends with one sentence and exit 3 and its restart
resumes from the table, a checkpoint ahead of the table without explanation stops, dead letters
of a range read again are neither dropped nor fenced, and a topic removed from the config keeps
its offsets through Delta log cleanup. Real broker, real tables, real Spark, real processes."""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import functions as F

import test_graceful_stop
from conftest import skip_without_connectors
from kafka_delta.cli import main
from kafka_delta.contract import DEAD_LETTER_COLUMN
from kafka_delta.delta.rs_offset_store import DeltaRsOffsetStore
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.offsets.model import BatchCommit, parse_user_metadata
from kafka_delta.offsets.stored import OffsetsExpiredError
from kafka_delta.offsets.topic_identity import TopicRecreatedError
from kafka_delta.pipeline import Pipeline
from kafka_delta.recovery.checkpoint import CheckpointMismatchError
from kafka_delta.runtime.connectors import DELTA_SESSION_CONFS, local_connector_jars
from kafka_delta_dev.orders import transform as default_transform
from kafka_delta_dev.produce import produce_events, produce_values
from kafka_delta_dev.pytest_plugin import JARS_DIR
from support import assert_exactly_once, assert_offsets_agree, recreate_topic, table_ids
from test_graceful_stop import PACKAGE, _kill_group, _slow_project, _start, _wait_for
from test_operations import _clean_up_the_log

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _pipeline_versions(table_uri: str, pipeline_id: str) -> list[int]:
    """Delta versions of the pipeline's commits, oldest first."""
    return sorted(
        int(c["version"])
        for c in DeltaTable(table_uri).history()
        if parse_user_metadata(c.get("userMetadata"), pipeline_id) is not None
    )


def _restore(spark, sink: str, table_uri: str, version: int) -> None:
    """The operator's RESTORE, with the sink's own engine."""
    if sink == "delta_spark":
        spark.sql(f"RESTORE TABLE delta.`{table_uri}` TO VERSION AS OF {version}")
    else:
        DeltaTable(table_uri).restore(version)


def _set_aside(checkpoint: str) -> list[Path]:
    return sorted(Path(checkpoint).parent.glob(f"{Path(checkpoint).name}.set-aside-*"))


def test_a_delta_restore_is_read_again_with_the_checkpoint_kept_or_deleted(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 300)
    cfg = make_config(topics, engine=sink_engine, max_records_per_trigger=100)
    Pipeline(spark, cfg).run()
    versions = _pipeline_versions(cfg.delta.table, cfg.pipeline_id)
    assert len(versions) == 3
    # The operator undoes the last batch: its 100 records must be read again, not skipped.
    _restore(spark, sink_engine["sink"], cfg.delta.table, versions[1])
    produce_events(kafka_bootstrap, topics, 50, first_id=300)

    Pipeline(spark, cfg).run()  # the checkpoint kept: it is ahead of the restored table

    assert_exactly_once(cfg, 350)
    assert_offsets_agree(cfg)
    assert len(_set_aside(cfg.checkpoint)) == 1

    # Restored again, to the first batch, with the checkpoint deleted this time.
    _restore(spark, sink_engine["sink"], cfg.delta.table, versions[0])
    shutil.rmtree(cfg.checkpoint)
    Pipeline(spark, cfg).run()
    assert_exactly_once(cfg, 350)
    assert_offsets_agree(cfg)


def _continuous(spark, cfg) -> tuple[Pipeline, threading.Thread, list[BaseException]]:
    """The pipeline running continuously (a batch a second) in a thread of this process."""
    pipeline = Pipeline(
        spark,
        cfg.with_overrides(**{"trigger.mode": "processing_time", "trigger.interval_seconds": 1}),
    )
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run()
        except BaseException as exc:  # the fenced run's end, checked by the test
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return pipeline, thread, failures


def _rows(cfg) -> int:
    try:
        return sum(table_ids(cfg).values())
    except TableNotFoundError:
        return 0


def _until(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.2)


@pytest.mark.parametrize("move", ["restore", "reset"])
def test_a_restore_or_reset_while_a_continuous_run_idles_fences_it_and_every_restart_recovers(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, move: str, tmp_path: Path
) -> None:
    """The operator's move lands while the run waits between batches; the batch the run plans
    after it is fenced (its start is not the table's); the checkpoint is then ahead of the table
    by a move made after the checkpoint's last commit, judged by Delta versions, not by when the
    batch was planned. The restart sets it aside and reads the records again, exactly once."""
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 200)
    cfg = make_config(topics, engine=sink_engine, max_records_per_trigger=100)
    pipeline, thread, failures = _continuous(spark, cfg)
    try:
        _until(lambda: _rows(cfg) == 200, "200 rows from the continuous run")
        versions = _pipeline_versions(cfg.delta.table, cfg.pipeline_id)
        if move == "restore":
            _restore(spark, sink_engine["sink"], cfg.delta.table, versions[0])
        else:
            config = tmp_path / "conf" / "reset.yaml"
            config.parent.mkdir()
            config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")), encoding="utf-8")
            # A reset the run's lease does not stop (a lease on another host, --no-run-check).
            argv = ["offsets", "reset", "--config", str(config), "--to-earliest"]
            assert main([*argv, "--allow-rewind", "--no-run-check", "--execute"]) == 0
        produce_events(kafka_bootstrap, topics, 40, first_id=200)  # the run plans a batch
        thread.join(120)
    finally:
        pipeline.request_stop()
        thread.join(60)
    assert failures and "does not start where the table ends" in str(failures[0])
    assert "restart the pipeline: it resumes from the table" in str(failures[0])

    for _ in range(2):  # every restart recovers, the first one by itself
        Pipeline(spark, cfg).run()
    expected = 240 if move == "restore" else 240 + 200  # a reset to earliest reads all again
    ids = table_ids(cfg)
    assert set(ids) == set(range(240))
    assert sum(ids.values()) == expected
    assert len(_set_aside(cfg.checkpoint)) == 1
    assert_offsets_agree(cfg)


def test_a_restore_to_before_the_pipelines_first_commit_reads_everything_again(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path: Path
) -> None:
    """The table existed (empty) before the pipeline; a RESTORE to that version leaves no
    stored offsets at all, and the kept checkpoint, which read everything, is set aside."""
    import pyarrow as pa

    topics = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, topics, 100)
    probe = make_config(topics).with_overrides(
        **{"delta.table": str(tmp_path / "probe"), "checkpoint": str(tmp_path / "probe-cp")}
    )
    Pipeline(spark, probe).run()
    cfg = make_config(topics, max_records_per_trigger=50)
    empty = pa.schema(DeltaTable(probe.delta.table).schema().to_arrow()).empty_table()
    write_deltalake(cfg.delta.table, empty)
    Pipeline(spark, cfg).run()
    DeltaTable(cfg.delta.table).restore(0)
    produce_events(kafka_bootstrap, topics, 20, first_id=100)

    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 120)
    assert_offsets_agree(cfg)
    assert len(_set_aside(cfg.checkpoint)) == 1


def test_a_checkpoint_ahead_of_the_table_without_restore_or_reset_stops_with_one_sentence(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    topics = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, topics, 60)
    cfg = make_config(topics)
    Pipeline(spark, cfg).run()
    # A foreign tool writes a commit of the pipeline with lower offsets and no reset record:
    # nothing says which records to read again.
    table = DeltaTable(cfg.delta.table)
    record = BatchCommit(cfg.pipeline_id, "elsewhere.x", 0, {topics[0]: {0: 20}}, seq=99)
    write_deltalake(
        cfg.delta.table,
        table.to_pyarrow_table().schema.empty_table(),
        mode="append",
        commit_properties=CommitProperties(
            custom_metadata={"userMetadata": record.user_metadata()}
        ),
    )
    version = DeltaTable(cfg.delta.table).version()

    with pytest.raises(CheckpointMismatchError, match="is ahead of table's stored offsets"):
        Pipeline(spark, cfg).run()
    assert DeltaTable(cfg.delta.table).version() == version
    assert Path(cfg.checkpoint).is_dir() and not _set_aside(cfg.checkpoint)


def _strict(df):
    """The "fixed" transform: also rejects ids ending in 3, which the first one accepted."""
    out = default_transform(df)
    rejected = F.when(F.col("id") % 10 == 3, F.lit("rejected by the fixed transform"))
    return out.withColumn(DEAD_LETTER_COLUMN, F.coalesce(F.col(DEAD_LETTER_COLUMN), rejected))


def test_dead_letters_of_a_range_read_again_reach_the_dead_letter_table_once_and_fence_nothing(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine
) -> None:
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], 40)
    cfg = make_config([topic], engine=sink_engine, max_records_per_trigger=20)
    Pipeline(spark, cfg).run()
    before_the_bad_ones = _pipeline_versions(cfg.delta.table, cfg.pipeline_id)[-1]
    produce_events(kafka_bootstrap, [topic], 40, first_id=40)
    produce_values(kafka_bootstrap, topic, [(0, b"not json"), (1, b"{broken")])
    # One large batch: the dead-letter table's stored offsets end past everything.
    Pipeline(spark, cfg.with_overrides(**{"kafka.max_records_per_trigger": 1000})).run()
    dead = DeltaTable(cfg.dead_letter_table).to_pyarrow_table()
    assert sorted(dead["value"].to_pylist()) == [b"not json", b"{broken"]

    # Replay after a fix: the second run is undone and read again, in small batches, by a
    # transform that rejects records the old one accepted. The range lies below the offsets
    # the dead-letter table stores, and each small batch ends below them too.
    _restore(spark, sink_engine["sink"], cfg.delta.table, before_the_bad_ones)
    Pipeline(spark, cfg, transform=_strict).run()

    # Every record's position is in exactly one of the two tables, exactly once.
    main = DeltaTable(cfg.delta.table).to_pyarrow_table()
    dead = DeltaTable(cfg.dead_letter_table).to_pyarrow_table()
    held = [
        *zip(main["partition"].to_pylist(), main["offset"].to_pylist(), strict=True),
        *zip(dead["partition"].to_pylist(), dead["offset"].to_pylist(), strict=True),
    ]
    assert len(held) == len(set(held)), "a record is in the tables twice"
    latest = KafkaAdmin(cfg.kafka.client_config()).latest({topic: [0, 1]})[topic]
    assert set(held) == {(p, o) for p, end in latest.items() for o in range(end)}
    # The records the fixed transform rejects are dead letters now; the old bad ones still are.
    errors = dead["error"].to_pylist()
    assert errors.count("rejected by the fixed transform") == sum(
        1 for i in range(40, 80) if i % 10 == 3
    )
    assert len(errors) == 2 + errors.count("rejected by the fixed transform")


def test_a_removed_topic_keeps_its_offsets_through_log_cleanup_and_is_not_read_twice(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    kept, removed = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, [kept, removed], 200)
    both = make_config([kept, removed])
    Pipeline(spark, both).run()
    only_kept = both.with_overrides(**{"kafka.topics": [kept]})
    _clean_up_the_log(both.delta.table)
    shutil.rmtree(both.checkpoint)  # the config change comes with a new checkpoint
    produce_events(kafka_bootstrap, [kept], 60, first_id=200)
    Pipeline(spark, only_kept).run()  # its commit, made after cleanup, does not name the topic

    stored = DeltaRsOffsetStore(both.delta.table, both.pipeline_id).read(
        lambda: {removed: [0, 1], kept: [0, 1]}
    )
    assert stored is not None and sum(stored.offsets[removed].values()) == 100
    produce_events(kafka_bootstrap, [removed], 40, first_id=260)
    Pipeline(spark, both).run()  # re-added: resumes where it stopped

    assert_exactly_once(both, 300)
    assert_offsets_agree(both)


def test_a_restore_then_log_cleanup_then_a_lost_checkpoint_reads_the_undone_batch_again(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path, capsys
) -> None:
    """A RESTORE reverts no txn action and no commit copy: once log cleanup removed the
    RESTORE's commit, both still name the undone batch. The offsets come from the rows the
    table holds, and the undone batch is read again."""
    (topic,) = new_topics(1, partitions=2)
    cfg = make_config([topic], engine=sink_engine)
    for first in (0, 10, 20):  # versions 0, 1, 2: one batch each
        produce_events(kafka_bootstrap, [topic], 10, first_id=first)
        Pipeline(spark, cfg).run()
    _restore(spark, sink_engine["sink"], cfg.delta.table, 1)  # 20-29 undone
    _clean_up_the_log(cfg.delta.table)
    # `offsets show` says where the offsets now come from, and they end where the rows do.
    from kafka_delta.commands.offsets import show

    shown = show(cfg)["stored"]
    assert shown["source"] == "rows (log cleaned up)", shown
    assert sum(shown["offsets"][topic].values()) == 20, shown
    shutil.rmtree(cfg.checkpoint)
    produce_events(kafka_bootstrap, [topic], 10, first_id=30)

    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 40)
    _verify(cfg, tmp_path, capsys)


def _skip_then_clean_up(spark, kafka_bootstrap, cfg, topic: str, tmp_path: Path, capsys) -> None:
    """Ids 0-9 read; ids 10-19 skipped by the operator (`offsets reset --to-latest
    --allow-skip`, no run live); then Delta log cleanup takes every commit of the pipeline."""
    produce_events(kafka_bootstrap, [topic], 10)
    Pipeline(spark, cfg).run()
    produce_events(kafka_bootstrap, [topic], 10, first_id=10)
    path = tmp_path / "reset.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    skip = ["offsets", "reset", "--config", str(path), "--to-latest", "--allow-skip", "--execute"]
    assert main(skip) == 0, capsys.readouterr().out
    _clean_up_the_log(cfg.delta.table)


def test_a_skip_then_log_cleanup_then_a_lost_checkpoint_warns_that_the_skip_is_read_again(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path, capsys, caplog
) -> None:
    """Found by the operations harness (skip, clean_log, delete_checkpoint, run): once log
    cleanup removed the reset's commit, the offsets come from the rows, and the records the
    operator skipped lie past them. Nothing left tells them from a RESTORE's undone records, so
    they are read again (nothing is lost), and the run says so in a warning that names each
    partition, where its rows end and where its offset txn says it stood."""
    (topic,) = new_topics(1, partitions=2)
    cfg = make_config([topic], engine=sink_engine)
    _skip_then_clean_up(spark, kafka_bootstrap, cfg, topic, tmp_path, capsys)
    shutil.rmtree(cfg.checkpoint)
    from kafka_delta.commands.offsets import show

    stored = show(cfg)["stored"]
    assert stored["past_the_rows"] == {topic: {"0": 10, "1": 10}}, stored

    with caplog.at_level("INFO", logger="kafka_delta"):
        Pipeline(spark, cfg).run()

    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    again = [m for m in warned if m.startswith("this run reads again")]
    assert len(again) == 1, warned
    # Each partition: its rows end at 5 (ids 0-9 round-robin), its txn names 10.
    assert f"offsets {topic}[0] 5-9, {topic}[1] 5-9 of pipeline" in again[0], again
    assert "records an `offsets reset` skipped" in again[0], again
    resumed = [
        r.getMessage() for r in caplog.records if "resuming from the table" in r.getMessage()
    ]
    assert f"its offset txns name {topic}[0] 10 (the rows: 5)" in resumed[0], resumed
    ids = DeltaTable(cfg.delta.table).to_pyarrow_table(columns=["id"])["id"].to_pylist()
    assert sorted(ids) == list(range(20))


def test_a_skip_then_log_cleanup_with_the_checkpoint_kept_warns_that_the_skip_is_read_again(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path, capsys, caplog
) -> None:
    """The same with the checkpoint kept: it stands before the skip, and the reset's commit,
    which set such a checkpoint aside, is gone; Spark resumes from it and reads the skipped
    records. The run says which."""
    (topic,) = new_topics(1, partitions=1)
    cfg = make_config([topic])
    _skip_then_clean_up(spark, kafka_bootstrap, cfg, topic, tmp_path, capsys)
    produce_events(kafka_bootstrap, [topic], 5, first_id=20)

    with caplog.at_level("INFO", logger="kafka_delta"):
        Pipeline(spark, cfg).run()

    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(
        m.startswith(f"this run reads again the records at offsets {topic}[0] 10-19 ")
        for m in warned
    ), warned
    ids = DeltaTable(cfg.delta.table).to_pyarrow_table(columns=["id"])["id"].to_pylist()
    assert sorted(ids) == list(range(25))


def test_a_restore_then_log_cleanup_with_the_checkpoint_kept_sets_it_aside_and_reads_again(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine
) -> None:
    (topic,) = new_topics(1, partitions=2)
    cfg = make_config([topic], engine=sink_engine)
    for first in (0, 10, 20):
        produce_events(kafka_bootstrap, [topic], 10, first_id=first)
        Pipeline(spark, cfg).run()
    _restore(spark, sink_engine["sink"], cfg.delta.table, 1)
    _clean_up_the_log(cfg.delta.table)

    Pipeline(spark, cfg).run()  # the checkpoint read 20-29: it is ahead of the rows

    assert len(_set_aside(cfg.checkpoint)) == 1
    assert_exactly_once(cfg, 30)


def _verify(cfg, tmp_path: Path, capsys) -> int:
    path = tmp_path / "verify.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    capsys.readouterr()
    status = main(["offsets", "verify", "--against-kafka", "--config", str(path)])
    out = capsys.readouterr().out
    assert status == 0, out
    return status


def without_positions(df):
    """A transform that keeps no Kafka position in its rows."""
    return default_transform(df).drop("topic", "partition", "offset")


def test_a_transform_that_drops_the_positions_is_warned_of_once_at_the_first_batch(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path, caplog
) -> None:
    # Warned, not refused: exactly once does not rest on the rows' positions, and a table of
    # aggregates may rightly hold none; but verify cannot audit such rows, and after log
    # cleanup a lost checkpoint needs a reset (the test below).
    (topic,) = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, [topic], 20)
    cfg = make_config(
        [topic], transform=f"{__name__}:without_positions", max_records_per_trigger=10
    )
    caplog.set_level(logging.WARNING, logger="kafka_delta")

    summary = Pipeline(spark, cfg).run()

    told = [r.getMessage() for r in caplog.records if "no Kafka position" in r.getMessage()]
    assert told == [
        "the transform's rows lack topic, partition, offset: they carry no Kafka position, so "
        "`offsets verify` cannot audit them, and after Delta log cleanup a lost checkpoint "
        "resumes only with `offsets reset --to-offsets`; keep them in the transform's output "
        "unless the table is meant to hold none (aggregates)"
    ]
    assert summary.batches == 2 and summary.rows_written == 20  # written all the same

    # The sample transform keeps them: nothing to say.
    caplog.clear()
    keeps = make_config([topic]).with_overrides(
        **{"delta.table": str(tmp_path / "other"), "checkpoint": str(tmp_path / "other_cp")}
    )
    Pipeline(spark, keeps).run()
    assert not [r for r in caplog.records if "no Kafka position" in r.getMessage()]


def test_after_log_cleanup_a_table_without_positions_stops_and_a_reset_to_offsets_resumes(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path, capsys
) -> None:
    (topic,) = new_topics(1, partitions=1)
    cfg = make_config([topic], transform=f"{__name__}:without_positions")
    produce_events(kafka_bootstrap, [topic], 20)
    Pipeline(spark, cfg).run()
    _clean_up_the_log(cfg.delta.table)
    shutil.rmtree(cfg.checkpoint)
    version = DeltaTable(cfg.delta.table).version()

    with pytest.raises(OffsetsExpiredError, match="rows carry no Kafka position") as stop:
        Pipeline(spark, cfg).run()
    assert "offsets reset --to-offsets" in str(stop.value)
    assert DeltaTable(cfg.delta.table).version() == version

    path = tmp_path / "reset.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    argv = ["offsets", "reset", "--config", str(path), "--to-offsets", f"{topic}:0=20"]
    assert main([*argv, "--allow-rewind", "--allow-skip", "--execute"]) == 0
    produce_events(kafka_bootstrap, [topic], 5, first_id=20)
    Pipeline(spark, cfg).run()

    ids = DeltaTable(cfg.delta.table).to_pyarrow_table()["id"].to_pylist()
    assert sorted(ids) == list(range(25))


# Appended after tests/test_graceful_stop.py's slow transform: a read task, after its sleep,
# waits while the file HOLD_FILE exists, so the test decides when a running batch may commit.
HELD_TRANSFORM = """

def _held(batches):
    while _Path(_os.environ["HOLD_FILE"]).exists():
        _time.sleep(0.1)
    yield from batches


def transform(df):
    return _fast_transform(df.mapInArrow(_slow, df.schema).mapInArrow(_held, df.schema))
"""


def test_a_run_fenced_mid_batch_exits_3_in_one_sentence_and_both_checkpoints_restart_exactly(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path: Path, monkeypatch
) -> None:
    """Two real runs of one pipeline race on one table: the one whose batch another run
    overtakes is fenced (exit 3, one sentence, no stack trace); then both checkpoints are
    restarted and both finish with exit 0, every record once."""
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], 3000)
    root, config = _slow_project(tmp_path, kafka_bootstrap, topic)
    with (root / "src" / PACKAGE / "transform.py").open("a", encoding="utf-8") as out:
        out.write(HELD_TRANSFORM)
    conf = yaml.safe_load(config.read_text())
    conf["engine"] = sink_engine
    conf["trigger"] = {"mode": "available_now"}
    if sink_engine["sink"] == "delta_spark":
        conf.setdefault("spark", {}).setdefault("conf", {}).update(
            {"spark.jars": ",".join(local_connector_jars(JARS_DIR)), **DELTA_SESSION_CONFS}
        )
    config.write_text(yaml.safe_dump(conf))
    marks, log, hold = tmp_path / "marks", tmp_path / "slow.log", tmp_path / "hold"
    marks.mkdir()
    monkeypatch.setattr(test_graceful_stop, "SLOW_SECONDS", 3.0)
    monkeypatch.setenv("HOLD_FILE", str(hold))
    slow = _start(root, config, "python", marks, log)
    try:
        _wait_for(lambda: "batch=0 " in log.read_text(), slow, log, "batch 0")
        hold.touch()  # batch 1's read tasks are still asleep: they wait for the file to go
        # Meanwhile another checkpoint of the pipeline takes the table past batch 1.
        other = make_config([topic], engine=sink_engine).with_overrides(
            **{
                "pipeline_id": conf["pipeline_id"],
                "delta.table": conf["delta"]["table"],
                "dead_letters.table": conf["dead_letters"]["table"],
                "checkpoint": str(tmp_path / "other"),
            }
        )
        Pipeline(spark, other).run()
        hold.unlink()
        assert slow.wait(timeout=300) == 3, log.read_text()[-3000:]
    finally:
        hold.unlink(missing_ok=True)
        _kill_group(slow)
    output = log.read_text()
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "restart the pipeline" in errors[0], output[-3000:]
    assert "Traceback" not in output and "\tat " not in output, output[-3000:]

    # Both checkpoints restart: each finishes with exit 0, every record once.
    produce_events(kafka_bootstrap, [topic], 200, first_id=3000)
    slow = _start(root, config, "python", marks, log)
    try:
        assert slow.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        _kill_group(slow)
    assert len(_set_aside(conf["checkpoint"])) == 1
    produce_events(kafka_bootstrap, [topic], 100, first_id=3200)
    Pipeline(spark, other).run()
    assert_exactly_once(other, 3300)
    assert_offsets_agree(other)


def test_a_recreated_topic_stops_the_run_or_is_read_from_its_start_as_the_config_says(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    (topic,) = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, [topic], 10)
    cfg = make_config([topic])
    Pipeline(spark, cfg).run()
    # The new topic holds more records than the old one's stored offset: Kafka's own check
    # (an offset past the end) cannot see that its first 10 records would be skipped.
    recreate_topic(kafka_bootstrap, topic, 1)
    produce_events(kafka_bootstrap, [topic], 30, first_id=10)
    version = DeltaTable(cfg.delta.table).version()

    with pytest.raises(TopicRecreatedError, match="deleted and created again"):
        Pipeline(spark, cfg).run()
    assert DeltaTable(cfg.delta.table).version() == version

    allowed = cfg.with_overrides(**{"kafka.fail_on_data_loss": False})
    Pipeline(spark, allowed).run()
    assert_exactly_once(allowed, 40)
    assert_offsets_agree(allowed)


def test_verify_after_a_topic_was_recreated_fails_with_the_sentence_the_run_stops_with(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path, capsys
) -> None:
    (topic,) = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, [topic], 10)
    cfg = make_config([topic])
    Pipeline(spark, cfg).run()
    recreate_topic(kafka_bootstrap, topic, 1)
    produce_events(kafka_bootstrap, [topic], 30, first_id=10)
    with pytest.raises(TopicRecreatedError) as stopped:
        Pipeline(spark, cfg).run()

    path = tmp_path / "verify.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    capsys.readouterr()
    assert main(["offsets", "verify", "--config", str(path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert f"FAIL  topics: {stopped.value}" in out, out
    assert out[-1] == f"verify: FAILED: topics: {stopped.value}", out
    assert f"topic(s) {topic} (id " in str(stopped.value)

    # Told to read the new topic from its start, the run will: verify notes it, and holds.
    allowed = cfg.with_overrides(**{"kafka.fail_on_data_loss": False})
    path.write_text(yaml.safe_dump(allowed.model_dump(mode="json")))
    main(["offsets", "verify", "--config", str(path)])
    out = capsys.readouterr().out.strip().splitlines()
    assert (
        f"note  topics: {topic} were deleted and created again since the table stored their "
        "offsets; the next run reads them from their first record (kafka.fail_on_data_loss: "
        "false)"
    ) in out, out
    assert not [line for line in out if line.startswith("FAIL  topics")], out


def _generation(bootstrap: str, topic: str, first_id: int, bad: bytes) -> None:
    """Offsets 0-2 good, 3 bad, 4-6 good (one partition)."""
    produce_events(bootstrap, [topic], 3, first_id=first_id)
    produce_values(bootstrap, topic, [(0, bad)])
    produce_events(bootstrap, [topic], 3, first_id=first_id + 3)


def test_a_recreated_topic_read_from_its_start_keeps_its_dead_letters_and_verifies(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path, capsys
) -> None:
    """A position is (topic id, partition, offset): the new topic's bad record at the offset
    of the old topic's is a dead letter of its own, and `verify --against-kafka` passes with
    one row per topic generation at each position the two share."""
    (topic,) = new_topics(1, partitions=1)
    cfg = make_config([topic], engine=sink_engine, fail_on_data_loss=False)
    _generation(kafka_bootstrap, topic, 0, b"old bad")
    Pipeline(spark, cfg).run()
    recreate_topic(kafka_bootstrap, topic, 1)
    _generation(kafka_bootstrap, topic, 100, b"new bad")

    Pipeline(spark, cfg).run()

    ids = DeltaTable(cfg.delta.table).to_pyarrow_table()["id"].to_pylist()
    assert sorted(ids) == [*range(6), *range(100, 106)]
    dead = DeltaTable(cfg.dead_letter_table).to_pyarrow_table()
    assert sorted(dead["value"].to_pylist()) == [b"new bad", b"old bad"]
    assert len(set(dead["topic_id"].to_pylist())) == 2
    _verify(cfg, tmp_path, capsys)


def test_verify_names_a_dead_letter_of_a_recreated_topic_that_is_missing(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path, capsys
) -> None:
    (topic,) = new_topics(1, partitions=1)
    cfg = make_config([topic], fail_on_data_loss=False)
    _generation(kafka_bootstrap, topic, 0, b"old bad")
    Pipeline(spark, cfg).run()
    recreate_topic(kafka_bootstrap, topic, 1)
    _generation(kafka_bootstrap, topic, 100, b"new bad")
    Pipeline(spark, cfg).run()
    DeltaTable(cfg.dead_letter_table).delete("value = X'6e657720626164'")  # b"new bad"

    path = tmp_path / "verify.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    capsys.readouterr()
    assert main(["offsets", "verify", "--against-kafka", "--config", str(path)]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (
        f"verify: FAILED: kafka: {topic}:0: 1 record(s) Kafka holds in the committed ranges are "
        "in neither the table nor the dead-letter table (offsets 3): lost"
    )


@pytest.mark.parametrize("way_out", ["reset", "fail_on_data_loss"])
def test_a_topic_recreated_after_log_cleanup_is_still_recognised_by_its_id(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path, capsys, way_out
) -> None:
    """Log cleanup removed every commit naming the topic's id; the new topic holds more records
    than the old one's stored offsets, so only the id tells them apart (found by scripts/ops:
    the new topic's first records were skipped). Either way out the sentence names lands the
    new topic whole, and `offsets verify --against-kafka` counts the old topic's rows as its
    first generation."""
    (topic,) = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, [topic], 10)
    cfg = make_config([topic], engine=sink_engine)
    Pipeline(spark, cfg).run()
    _clean_up_the_log(cfg.delta.table)
    shutil.rmtree(cfg.checkpoint)
    recreate_topic(kafka_bootstrap, topic, 1)
    produce_events(kafka_bootstrap, [topic], 30, first_id=10)
    version = DeltaTable(cfg.delta.table).version()

    with pytest.raises(TopicRecreatedError, match="deleted and created again") as stop:
        Pipeline(spark, cfg).run()
    assert DeltaTable(cfg.delta.table).version() == version

    if way_out == "reset":  # reset the topic to its first record, then start again
        assert "offsets reset --topic <topic> --to-earliest --allow-rewind --execute" in str(
            stop.value
        )
        path = tmp_path / "reset.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        argv = ["offsets", "reset", "--config", str(path), "--topic", topic, "--to-earliest"]
        assert main([*argv, "--allow-rewind", "--execute"]) == 0
    else:
        cfg = cfg.with_overrides(**{"kafka.fail_on_data_loss": False})
    Pipeline(spark, cfg).run()
    assert_exactly_once(cfg, 40)
    _verify(cfg, tmp_path, capsys)


def test_a_topic_whose_only_reads_a_restore_undid_is_read_again_when_re_added(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine
) -> None:
    """The offset txn of a partition survives the RESTORE that undid the batch that wrote it;
    a record that no longer names the partition must not let the txn speak for it."""
    kept, added = new_topics(2, partitions=1)
    produce_events(kafka_bootstrap, [kept], 10)
    only_kept = make_config([kept], engine=sink_engine)
    Pipeline(spark, only_kept).run()
    before = DeltaTable(only_kept.delta.table).version()
    produce_events(kafka_bootstrap, [added], 10, first_id=10)
    both = only_kept.with_overrides(**{"kafka.topics": [kept, added]})
    shutil.rmtree(both.checkpoint)
    Pipeline(spark, both).run()
    _restore(spark, sink_engine["sink"], both.delta.table, before)  # the added topic's reads
    shutil.rmtree(both.checkpoint)
    produce_events(kafka_bootstrap, [kept], 5, first_id=20)
    Pipeline(spark, only_kept).run()  # its commit does not name the added topic

    shutil.rmtree(both.checkpoint)
    Pipeline(spark, both).run()

    assert_exactly_once(both, 25)


def test_the_offsets_commands_read_a_cleaned_up_delta_spark_table_through_its_commit_copy(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path: Path, capsys
) -> None:
    """show, verify and reset read stored offsets with the pipeline's own reader: after log
    cleanup, a delta-spark table's offsets are in the copy of its last commit."""
    import json

    from test_offsets_cli import _cli

    engine = {"source": "embedded", "sink": "delta_spark"}
    skip_without_connectors(spark, engine)
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 100)
    cfg = make_config(topics, engine=engine)
    Pipeline(spark, cfg).run()
    _clean_up_the_log(cfg.delta.table)

    status, out, err = _cli(cfg, tmp_path, capsys, "show", "--json")
    assert status == 0, err
    stored = json.loads(out)["stored"]
    assert sum(stored["offsets"][topics[0]].values()) == 100, stored
    status, out, err = _cli(cfg, tmp_path, capsys, "reset", "--to-current", "--execute")
    assert status == 0, err + out
    status, out, err = _cli(cfg, tmp_path, capsys, "verify")
    assert status in (0, 1) and "no commit copy" not in err, err


def test_a_checkpoint_set_aside_twice_in_one_second_keeps_both(tmp_path: Path) -> None:
    """Two set-asides of one checkpoint within a second (a retried job fenced at once, found by
    the operations harness) must not collide on the ``.set-aside-<time>`` name: the second one
    takes a suffix, and no set-aside checkpoint is overwritten or merged into."""
    import datetime

    from kafka_delta.recovery.checkpoint import CheckpointLog
    from kafka_delta.recovery.verdict import set_aside

    checkpoint = tmp_path / "checkpoint"
    now = datetime.datetime.now(datetime.UTC)
    taken = []
    for s in range(5):  # every name this second and the next few would take, already taken
        stamp = (now + datetime.timedelta(seconds=s)).strftime("%Y%m%dT%H%M%SZ")
        earlier = tmp_path / f"checkpoint.set-aside-{stamp}"
        (earlier / "offsets").mkdir(parents=True)
        (earlier / "offsets" / "0").write_text("earlier")
        taken.append(earlier)
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text("this one")

    target = Path(set_aside(CheckpointLog(None, str(checkpoint)), "a test"))

    assert not checkpoint.exists()
    assert target.name.startswith("checkpoint.set-aside-") and target not in taken
    assert (target / "offsets" / "0").read_text() == "this one"
    assert all((t / "offsets" / "0").read_text() == "earlier" for t in taken)
    assert sorted(t.name for t in _set_aside(str(checkpoint))) == sorted(
        [*(t.name for t in taken), target.name]
    )


def test_a_checkpoint_in_a_bucket_is_set_aside_without_sparks_jvm(object_store, monkeypatch):
    """A checkpoint on object storage is renamed through pyarrow's file system of its scheme, as
    a Spark Connect client (no JVM of its own) must do it; the credentials are the
    environment's, as on a cluster."""
    from pyarrow import fs as pafs

    from kafka_delta.recovery.checkpoint import CheckpointLog
    from kafka_delta.recovery.verdict import set_aside

    for key, value in object_store.storage_options().items():
        monkeypatch.setenv(key, value)
    bucket = object_store.create_bucket(f"ckpt-{uuid.uuid4().hex[:8]}")
    location = f"{bucket}/orders-checkpoint"
    filesystem, root = pafs.FileSystem.from_uri(location)
    for name, text in {"offsets/0": "plan 0", "commits/0": "done 0", "metadata": "{}"}.items():
        with filesystem.open_output_stream(f"{root}/{name}") as out:
            out.write(text.encode())

    target = set_aside(CheckpointLog(None, location, lazy_spark=True), "a test")

    assert target.startswith(f"{location}.set-aside-")
    _, moved = pafs.FileSystem.from_uri(target)
    assert filesystem.get_file_info(f"{root}/offsets/0").type == pafs.FileType.NotFound
    with filesystem.open_input_stream(f"{moved}/offsets/0") as stream:
        assert stream.read() == b"plan 0"
