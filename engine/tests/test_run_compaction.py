"""The run's own compaction (``maintenance.compact_every_seconds``,
kafka_delta.runtime.compaction): a thread beside a low-latency stream compacts the run's tables
while batches commit, on each sink's own engine; every record still lands once, the offsets
stay the run's, and a table that cannot be compacted never stops the stream. What compaction
buys over 30 minutes at one commit a second is measured in the benchmark (row 16,
``--freshness-compact-every``), never here."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from kafka_delta.cli import main
from kafka_delta.config import PipelineConfig
from kafka_delta.delta import maintenance
from kafka_delta.delta.maintenance import DeltaRsMaintainer
from kafka_delta.pipeline import Pipeline
from kafka_delta.runtime.compaction import RunCompaction
from kafka_delta.runtime.run_loop import POLLING_DELAY
from kafka_delta_dev.produce import produce_events, produce_values
from support import RunInThread, assert_exactly_once, assert_offsets_agree, table_rows

LOW_LATENCY = {"mode": "processing_time", "interval_seconds": 0, "idle_poll_seconds": 0.05}


def _operations(uri: str) -> list[str]:
    return [str(c.get("operation")).upper() for c in DeltaTable(uri).history()]


def _added_by_batches(uri: str) -> int:
    """Data files the stream's commits added (``dataChange``: a compaction's adds are not),
    compacted or not since, counted in the log's commit files."""
    added = 0
    for commit in sorted((Path(uri) / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line).get("add")
            added += bool(action and action.get("dataChange", True))
    return added


@pytest.mark.spark
@pytest.mark.broker
def test_a_low_latency_run_compacts_its_tables_while_it_commits_and_lands_each_record_once(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, caplog, capsys
) -> None:
    (topic,) = new_topics(1, partitions=2)
    cfg = make_config([topic], engine=sink_engine, max_records_per_trigger=40)
    cfg = PipelineConfig.model_validate(
        {
            **cfg.model_dump(),
            "trigger": LOW_LATENCY,
            "maintenance": {"compact_every_seconds": 1},
        }
    )
    table, dead = cfg.delta.table, cfg.dead_letter_table
    assert dead is not None
    caplog.set_level(logging.INFO, logger="kafka_delta.runtime.compaction")
    pipeline = Pipeline(spark, cfg)
    run = RunInThread(pipeline).start()
    produced = 0
    try:
        # Waves of small batches (40 records, a file per partition each), with a bad record
        # in the first two: the dead-letter table gets two small files to compact too.
        for wave in range(8):
            if wave < 2:
                produce_values(kafka_bootstrap, topic, [(wave % 2, b"not json")])
            produce_events(kafka_bootstrap, [topic], 120, first_id=produced)
            produced += 120
            run.wait_until(lambda n=produced: table_rows(cfg) >= n, f"wave {wave} not committed")
            if wave == 5:
                # Later waves commit on top of compacted tables.
                run.wait_until(
                    lambda: (
                        "OPTIMIZE" in _operations(table)
                        and DeltaTable.is_deltatable(dead)
                        and "OPTIMIZE" in _operations(dead)
                    ),
                    "no compaction of both tables",
                    every=0.2,
                )
    finally:
        run.stop(180)
        spark.conf.unset(POLLING_DELAY)  # the session is shared with other tests
    assert not run.failures, run.failures
    assert not run.thread.is_alive()

    operations = _operations(table)  # newest first
    first_compaction = max(i for i, op in enumerate(operations) if op == "OPTIMIZE")
    after = [op for op in operations[:first_compaction] if op != "OPTIMIZE"]
    assert after, ("no batch committed after a compaction", operations)
    live = len(DeltaTable(table).file_uris())
    added = _added_by_batches(table)
    with capsys.disabled():  # the figures, for whoever runs this with -s
        print(
            f"\n{sink_engine['sink']}: {pipeline.summary.batches} batches added {added} files, "
            f"{live} live after {operations.count('OPTIMIZE')} compactions, {len(after)} "
            "commits after the first"
        )
    assert live < added / 2, (live, added)
    assert f"compacted {table}:" in caplog.text
    assert "failed" not in caplog.text, caplog.text
    assert_exactly_once(cfg, produced)
    assert len(DeltaTable(dead).to_pyarrow_table()) == 2  # each bad record once
    assert_offsets_agree(cfg)
    capsys.readouterr()
    assert main(["offsets", "verify", "--config", _config_file(cfg), "--ids", "id"]) == 0, (
        capsys.readouterr().out
    )


@pytest.mark.spark
def test_an_upsert_table_is_left_to_table_maintain_and_its_dead_letters_are_compacted(
    spark, kafka_bootstrap, new_topics, make_config, caplog
) -> None:
    """A batch's MERGE reads the table's files: a compaction that rewrote them in between would
    make the MERGE lose its commit (delta-spark's ConcurrentDeleteReadException), so the run
    compacts an upsert table's dead letters (appended only) and leaves the table to `table
    maintain`, saying so."""
    (topic,) = new_topics(1, partitions=1)
    cfg = make_config([topic], delta={"mode": "upsert", "merge_keys": ["id"]})
    caplog.set_level(logging.INFO, logger="kafka_delta.pipeline")
    compaction = Pipeline(
        spark, cfg.with_overrides(**{"maintenance.compact_every_seconds": 3600})
    ).run_loop._compaction()
    assert compaction is not None
    try:
        assert compaction.locations == [cfg.dead_letter_table]
    finally:
        compaction.close()
    assert f"table {cfg.delta.table} is not compacted by the run (an upsert table)" in caplog.text
    assert Pipeline(spark, cfg).run_loop._compaction() is None  # compact_every_seconds 0: never


@pytest.mark.spark
def test_the_runs_compaction_never_commits_with_the_txn_and_record_of_a_batchs_merge(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    """A batch's MERGE sets its txn and record as session confs (delta_txn_confs). Under Spark
    Connect the batch runs in the session the run was given, so the run's compaction runs in a
    session of its own: an OPTIMIZE in the batch's session during the MERGE committed with the
    batch's txn and record, a commit carrying the batch's offsets and fence but none of its
    rows."""
    from conftest import skip_without_connectors
    from kafka_delta.delta.spark_commit import delta_txn_confs
    from kafka_delta.offsets.model import BatchCommit

    engine = {"source": "embedded", "sink": "delta_spark"}
    skip_without_connectors(spark, engine)
    (topic,) = new_topics(1, partitions=1)
    cfg = make_config([topic], engine=engine)
    cfg = cfg.with_overrides(**{"maintenance.compact_every_seconds": 3600})
    for i in range(2):
        spark.createDataFrame([(i,)], "id long").write.format("delta").mode("append").save(
            cfg.delta.table
        )
    compaction = Pipeline(spark, cfg).run_loop._compaction()
    assert compaction is not None
    try:
        batch = BatchCommit(cfg.pipeline_id, f"{cfg.pipeline_id}.q", 5, {topic: {0: 9}}, seq=6)
        with delta_txn_confs(spark, batch):  # as during a batch's MERGE in this session
            compaction.compact_once()
    finally:
        compaction.close()
    (optimize,) = [c for c in DeltaTable(cfg.delta.table).history() if c["operation"] == "OPTIMIZE"]
    assert optimize.get("userMetadata") is None, optimize
    assert _operations(cfg.delta.table) == ["OPTIMIZE", "WRITE", "WRITE"]


def _config_file(cfg: PipelineConfig) -> str:
    import yaml

    path = Path(cfg.checkpoint).parent / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")), encoding="utf-8")
    return str(path)


def _small_files(uri: str, count: int) -> None:
    for i in range(count):
        write_deltalake(uri, pa.table({"id": [i]}), mode="append")


def test_a_table_that_cannot_be_compacted_is_logged_and_the_next_one_still_is(
    tmp_path: Path, caplog, monkeypatch
) -> None:
    """A data file that is not Parquet (a disk that lost it, a hand copied over it) fails that
    table's compaction: the round logs it in one line and goes on to the next table, a table
    not there yet is passed over, and the next round tries again."""
    monkeypatch.setattr(maintenance, "RETRY_PAUSE_S", 0.0)
    broken, fine, missing = (str(tmp_path / name) for name in ("broken", "fine", "missing"))
    _small_files(broken, 3)
    _small_files(fine, 3)
    damaged = Path(broken) / Path(DeltaTable(broken).file_uris()[0]).name
    damaged.write_bytes(b"not parquet")
    engine = DeltaRsMaintainer({})
    caplog.set_level(logging.INFO, logger="kafka_delta.runtime.compaction")
    compaction = RunCompaction(3600, [(broken, engine), (missing, engine), (fine, engine)])

    compaction.compact_once()

    assert f"the run's compaction of {broken} failed; the table is as it was" in caplog.text
    assert len(DeltaTable(broken).file_uris()) == 3
    assert DeltaTable(broken).version() == 2
    assert f"compacted {fine}: 3 files rewritten into 1" in caplog.text
    assert len(DeltaTable(fine).file_uris()) == 1
    assert sorted(DeltaTable(fine).to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2]
    assert not Path(missing).exists()
    assert (compaction.rounds, compaction.files_removed, compaction.files_added) == (1, 3, 1)


def test_the_interval_must_be_above_zero_and_a_closed_compaction_starts_no_round(
    tmp_path: Path,
) -> None:
    fine = str(tmp_path / "fine")
    _small_files(fine, 2)
    with pytest.raises(ValueError, match="above 0 seconds"):
        RunCompaction(0, [(fine, DeltaRsMaintainer({}))])
    compaction = RunCompaction(0.05, [(fine, DeltaRsMaintainer({}))]).start()
    compaction.close()
    rounds = compaction.rounds
    time.sleep(0.2)
    assert compaction.rounds == rounds
    with pytest.raises(ValueError, match="compact_every_seconds"):
        PipelineConfig.model_validate(
            {
                "pipeline_id": "p",
                "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"]},
                "delta": {"table": str(tmp_path / "t")},
                "checkpoint": str(tmp_path / "c"),
                "maintenance": {"compact_every_seconds": -1},
            }
        )
