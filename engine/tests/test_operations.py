"""Exactly once through the ordinary operations of a running pipeline (I8), on both sinks:
topics added, removed and re-added; a retried checkpoint whose batch 0 never committed; two
checkpoints racing for one commit; Delta log cleanup. Real broker, real tables, real Spark;
tables are checked with delta-rs directly."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from conftest import skip_without_connectors
from kafka_delta.engine_factory import build_engine
from kafka_delta.offsets.fencing import FencingError
from kafka_delta.offsets.model import BatchCommit
from kafka_delta.pipeline import Pipeline
from kafka_delta_dev.produce import produce_events, produce_values
from support import assert_exactly_once, assert_offsets_agree

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def test_a_topic_added_removed_and_re_added_on_one_checkpoint_lands_every_record_once(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine
) -> None:
    first, added = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, [first], 100)
    Pipeline(spark, make_config([first], engine=sink_engine)).run()
    # The new topic already holds records: they must land from its first one, not its end.
    produce_events(kafka_bootstrap, [added], 100, first_id=100)
    both = make_config([first, added], engine=sink_engine)
    Pipeline(spark, both).run()
    assert_exactly_once(both, 200)

    # Removed, written to meanwhile, re-added: it resumes at the offsets the table stores.
    produce_events(kafka_bootstrap, [added], 60, first_id=200)
    Pipeline(spark, make_config([first], engine=sink_engine)).run()
    produce_events(kafka_bootstrap, [first, added], 40, first_id=260)
    Pipeline(spark, both).run()

    assert_exactly_once(both, 300)
    assert_offsets_agree(both)


def test_a_new_checkpoint_reads_a_topic_added_since_from_its_earliest_even_when_starting_latest(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    first, added = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, [first], 50)
    cfg = make_config([first])
    Pipeline(spark, cfg).run()
    produce_events(kafka_bootstrap, [added], 70, first_id=50)

    # starting_offsets only applies to the pipeline's very first start: once the table stores
    # offsets, a partition they do not name is new and starts at its earliest offset.
    shutil.rmtree(cfg.checkpoint)
    both = make_config([first, added], starting_offsets="latest")
    Pipeline(spark, both).run()

    assert_exactly_once(both, 120)
    assert_offsets_agree(both)


def test_a_first_run_at_latest_or_at_offsets_of_its_own_says_what_it_skips_and_lands_the_rest(
    spark, kafka_bootstrap, new_topics, make_config, caplog, tmp_path: Path
) -> None:
    at_latest, at_offsets = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, [at_latest], 40)  # 20 records in each partition
    produce_events(kafka_bootstrap, [at_offsets], 40, first_id=40)
    latest = make_config([at_latest], starting_offsets="latest")
    chosen = make_config(
        [at_offsets], starting_offsets={at_offsets: {0: 10, 1: -1}}, max_records_per_trigger=15
    ).with_overrides(
        **{"delta.table": str(tmp_path / "chosen"), "checkpoint": str(tmp_path / "chosen_cp")}
    )

    caplog.set_level(logging.INFO)
    assert Pipeline(spark, latest).run().rows_written == 0
    Pipeline(spark, chosen).run()

    lines = [r.getMessage() for r in caplog.records if "new checkpoint" in r.getMessage()]
    assert "starting at latest offsets, which skips the 40 record(s)" in lines[0]
    # offset 10 of partition 0 and the end of partition 1: 10 + 20 records skipped.
    assert "which skips the 30 record(s) Kafka holds" in lines[1]
    produce_events(kafka_bootstrap, [at_latest], 10, first_id=1000)
    produce_events(kafka_bootstrap, [at_offsets], 10, first_id=2000)
    Pipeline(spark, latest).run()
    Pipeline(spark, chosen).run()
    latest_ids = sorted(DeltaTable(latest.delta.table).to_pyarrow_table()["id"].to_pylist())
    chosen_ids = DeltaTable(chosen.delta.table).to_pyarrow_table()["id"].to_pylist()
    assert latest_ids == list(range(1000, 1010))
    # Partition 0 from offset 10 (ids 60..78, even), then everything new.
    assert sorted(chosen_ids) == [*range(60, 80, 2), *range(2000, 2010)]
    assert_offsets_agree(latest)
    assert_offsets_agree(chosen)


def _fails_in_batch(df):
    raise RuntimeError("transform failed inside batch 0")


def test_a_retried_checkpoint_whose_batch_zero_never_committed_is_set_aside_and_resumes(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path: Path
) -> None:
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], 150)
    # Records the transform cannot parse: a losing run must not send them anywhere either.
    produce_values(kafka_bootstrap, topic, [(0, b"not json"), (1, b"{broken")])
    produce_events(kafka_bootstrap, [topic], 150, first_id=150)
    retried = make_config([topic], engine=sink_engine)
    # Batch 0 of the first checkpoint is planned (Spark persisted its range), then fails.
    with pytest.raises(Exception, match="transform failed inside batch 0"):
        Pipeline(spark, retried, transform=_fails_in_batch).run()
    # Meanwhile more records arrive and another checkpoint of the pipeline writes everything.
    produce_events(kafka_bootstrap, [topic], 50, first_id=300)
    other = retried.with_overrides(checkpoint=str(tmp_path / "second-checkpoint"))
    Pipeline(spark, other).run()
    assert_exactly_once(other, 350)

    # The job is retried on its first checkpoint: its batch 0 was planned over a range the
    # table has moved past. The checkpoint is set aside, and the run resumes from the table
    # (I9): it neither rewinds nor duplicates, and is not fenced on every restart.
    Pipeline(spark, retried).run()

    assert DeltaTable(other.dead_letter_table).to_pyarrow_table().num_rows == 2
    assert len(list(Path(retried.checkpoint).parent.glob("checkpoint.set-aside-*"))) == 1
    assert_exactly_once(other, 350)
    produce_events(kafka_bootstrap, [topic], 50, first_id=350)
    Pipeline(spark, other).run()
    assert_exactly_once(other, 400)
    assert_offsets_agree(other)


def test_dead_letters_a_run_sent_before_dying_are_not_sent_again_by_another_checkpoint(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path: Path
) -> None:
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], 100)
    produce_values(kafka_bootstrap, topic, [(0, b"not json"), (1, b"{broken")])
    cfg = make_config([topic], engine=sink_engine)
    stopped = Pipeline(spark, cfg)

    commit_batch = stopped.engine.sink.commit_batch

    def dies_before_the_main_commit(*args, **kwargs):
        if not DeltaTable.is_deltatable(cfg.dead_letter_table):
            # delta-spark writes a batch as clean first: its write job meets the dead letters
            # and commits nothing (DeadLettersFound); the batch is then split, dead letters first.
            return commit_batch(*args, **kwargs)
        raise RuntimeError("the process died before the main commit")

    # Dead letters are committed first (a crash between the two commits loses none)...
    stopped.engine.sink.commit_batch = dies_before_the_main_commit
    with pytest.raises(Exception, match="died before the main commit"):
        stopped.run()
    assert DeltaTable(cfg.dead_letter_table).to_pyarrow_table().num_rows == 2

    # ...so another checkpoint re-reading the range must not send them again.
    Pipeline(spark, cfg.with_overrides(checkpoint=str(tmp_path / "other"))).run()

    assert_exactly_once(cfg, 100)
    dead = DeltaTable(cfg.dead_letter_table).to_pyarrow_table()
    assert sorted(dead["value"].to_pylist()) == [b"not json", b"{broken"]


def _rows(spark, *ids: int):
    return spark.createDataFrame([(i,) for i in ids], "id long")


def test_two_checkpoints_racing_for_one_commit_cannot_both_commit(
    spark, make_config, sink_engine, monkeypatch
) -> None:
    cfg = make_config(["o"], engine=sink_engine)
    mine, theirs = build_engine(spark, cfg).sink, build_engine(spark, cfg).sink
    mine.commit_batch(_rows(spark, 1), BatchCommit(cfg.pipeline_id, "p.c1", 0, {"o": {0: 1}}))
    racing = BatchCommit(cfg.pipeline_id, "p.c2", 0, {"o": {0: 3}})
    winner = BatchCommit(cfg.pipeline_id, "p.c1", 1, {"o": {0: 3}})
    module = __import__(type(mine).__module__, fromlist=["check_contiguous"])
    real_check = module.check_contiguous
    raced = []

    def check_then_lose_the_race(stored, start, commit, first_reads=None):
        real_check(stored, start, commit, first_reads)
        if commit is racing and not raced:
            # Between this run's check and its commit, another checkpoint commits the range.
            raced.append(mine.commit_batch(_rows(spark, 2, 3), winner, start={"o": {0: 1}}))

    monkeypatch.setattr(module, "check_contiguous", check_then_lose_the_race)

    with pytest.raises(FencingError):
        theirs.commit_batch(_rows(spark, 2, 3), racing, start={"o": {0: 1}})

    assert raced and raced[0].written
    ids = DeltaTable(cfg.delta.table).to_pyarrow_table()["id"].to_pylist()
    assert sorted(ids) == [1, 2, 3]


def _clean_up_the_log(table_uri: str) -> int:
    """What Delta's log cleanup leaves after the retention period: other writers committed,
    a Delta checkpoint was written, and every JSON commit it covers is deleted."""
    table = DeltaTable(table_uri)
    schema = pa.schema(table.schema().to_arrow())
    for _ in range(3):  # other writers: empty appends with no pipeline metadata
        write_deltalake(table_uri, schema.empty_table(), mode="append")
    table = DeltaTable(table_uri)
    table.create_checkpoint()
    checkpointed = table.version()
    log = Path(table_uri) / "_delta_log"
    for commit in log.glob("*.json"):
        if int(commit.stem) < checkpointed:
            commit.unlink()
            Path(log / f".{commit.name}.crc").unlink(missing_ok=True)
            (log / f"{commit.stem}.crc").unlink(missing_ok=True)
    return checkpointed


def test_delta_log_cleanup_loses_no_offsets_with_the_checkpoint_kept_or_deleted(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine
) -> None:
    topics = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, topics, 300)
    cfg = make_config(topics, engine=sink_engine, max_records_per_trigger=120)
    Pipeline(spark, cfg).run()
    _clean_up_the_log(cfg.delta.table)
    assert not any(
        "kafka_delta" in str(c.get("userMetadata")) for c in DeltaTable(cfg.delta.table).history()
    )
    produce_events(kafka_bootstrap, topics, 100, first_id=300)

    Pipeline(spark, cfg).run()  # the checkpoint kept
    assert_exactly_once(cfg, 400)
    _clean_up_the_log(cfg.delta.table)
    shutil.rmtree(cfg.checkpoint)
    produce_events(kafka_bootstrap, topics, 100, first_id=400)
    # The checkpoint deleted: resumes from where the table's rows end.
    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 500)
    assert_offsets_agree(cfg)


def _copies(cfg) -> Path:
    """Where the delta-spark sink keeps the copies of the pipeline's commits on cfg's table."""
    from kafka_delta.delta.side_folder import table_key

    side = Path(f"{cfg.checkpoint}.kafka_delta")
    return side / cfg.pipeline_id / "commits" / table_key(cfg.delta.table)


def test_delta_spark_keeps_a_copy_of_its_commit_written_after_a_crash_and_kept_by_vacuum(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    """delta-spark's offsets survive log cleanup through a copy of the commit record beside the
    checkpoint (never in the table): one lost to a crash between the commit and the copy is
    written again at start-up, while the log still holds the commit; VACUUM cannot reach it,
    and deleting the checkpoint leaves it."""
    engine = {"source": "embedded", "sink": "delta_spark"}
    skip_without_connectors(spark, engine)
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 100)
    cfg = make_config(topics, engine=engine)
    Pipeline(spark, cfg).run()
    copies = _copies(cfg)
    newest = max(int(p.stem) for p in copies.glob("*.json"))
    shutil.rmtree(copies)  # as if the run had died between its commit and the copy

    produce_events(kafka_bootstrap, topics, 50, first_id=100)
    Pipeline(spark, cfg).run()  # start-up writes the missing copy, then the new commits'
    kept = {int(p.stem) for p in copies.glob("*.json")}
    assert newest in kept and max(kept) > newest

    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    spark.sql(f"VACUUM delta.`{cfg.delta.table}` RETAIN 0 HOURS")
    DeltaTable(cfg.delta.table).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    _clean_up_the_log(cfg.delta.table)
    shutil.rmtree(cfg.checkpoint)
    assert max(int(p.stem) for p in copies.glob("*.json")) == max(kept)
    assert not (Path(cfg.delta.table) / "_kafka_delta").exists()
    produce_events(kafka_bootstrap, topics, 50, first_id=150)
    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 200)
    assert_offsets_agree(cfg)


def test_a_cleaned_up_table_whose_commit_copy_was_lost_resumes_from_its_rows(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    """A table first written by the delta-rs sink (offset txns at commit 1), then by the
    delta-spark sink (fence at commit 2, no offset txns), whose copy of commit 2 was lost to a
    crash before log cleanup: neither the stale offset txns (that would read commit 2's 50
    records twice) nor anything else but the rows says where the table ends."""
    engine = {"source": "embedded", "sink": "delta_spark"}
    skip_without_connectors(spark, engine)
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 100)
    Pipeline(spark, make_config(topics, engine={"source": "embedded", "sink": "delta_rs"})).run()
    produce_events(kafka_bootstrap, topics, 50, first_id=100)
    cfg = make_config(topics, engine=engine)
    Pipeline(spark, cfg).run()
    shutil.rmtree(_copies(cfg))
    _clean_up_the_log(cfg.delta.table)
    shutil.rmtree(cfg.checkpoint)
    produce_events(kafka_bootstrap, topics, 30, first_id=150)

    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 180)
