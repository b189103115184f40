"""``table maintain`` (commands/table.py) on real tables written by each sink: compaction, vacuum
and a checkpoint beside a pipeline that keeps committing (a real OS process on a processing-time
trigger), then a clean stop, an available-now finish and restarts with the checkpoint kept and
deleted; maintenance followed by Delta log cleanup; ``_kafka_delta/`` through a full vacuum at
retention 0; the retention floor; the dry run; a real commit conflict retried; bad input."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake

import test_graceful_stop
from kafka_delta.cli import main
from kafka_delta.commands import table as table_command
from kafka_delta.config import PipelineConfig, load_config
from kafka_delta.delta import maintenance
from kafka_delta.delta.maintenance import DeltaRsMaintainer
from kafka_delta.offsets.model import parse_user_metadata
from kafka_delta.pipeline import Pipeline
from kafka_delta.runtime.connectors import DELTA_SESSION_CONFS, local_connector_jars
from kafka_delta_dev.produce import produce_events, produce_values
from kafka_delta_dev.pytest_plugin import JARS_DIR
from support import assert_exactly_once, assert_offsets_agree
from test_graceful_stop import PACKAGE, _kill_group, _slow_project, _start, _wait_for
from test_operations import _clean_up_the_log

MAINTAIN = [sys.executable, "-m", PACKAGE, "table", "maintain"]
ZERO_RETENTION = {"delta.deletedFileRetentionDuration": "interval 0 hours"}
# delta-spark's VACUUM lists the table in as many Spark tasks as this says (10000 by default):
# minutes on local[2] under load for a folder of a few dozen files.
FEW_LISTING_TASKS = {"spark.sql.sources.parallelPartitionDiscovery.parallelism": "4"}


@pytest.fixture
def listing_in_few_tasks(spark):
    key, value = next(iter(FEW_LISTING_TASKS.items()))
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    yield
    if before is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, before)


def _live_files(uri: str) -> int:
    return len(DeltaTable(uri).file_uris())


def _on_disk(uri: str) -> set[str]:
    root = Path(uri)
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _config_file(cfg: PipelineConfig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")), encoding="utf-8")
    return path


def _maintain(capsys, config: Path, *args: str) -> tuple[int, str, str]:
    """The command in this process (the test session's Spark serves the delta-spark sink)."""
    capsys.readouterr()
    status = main(["table", "maintain", "--config", str(config), *args])
    out, err = capsys.readouterr()
    return status, out, err


def _allow_zero_retention(spark, sink: str, uri: str) -> None:
    """The table's owner lowers the floor to 0 hours, with the sink's own engine."""
    if sink == "delta_spark":
        spark.sql(
            f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES "
            "('delta.deletedFileRetentionDuration' = 'interval 0 hours')"
        )
    else:
        DeltaTable(uri).alter.set_table_properties(ZERO_RETENTION)


def _pipeline_versions(uri: str, pipeline_id: str) -> list[int]:
    return [
        int(c["version"])
        for c in DeltaTable(uri).history()
        if parse_user_metadata(c.get("userMetadata"), pipeline_id) is not None
    ]


def _age(paths: list[Path], days: float = 30) -> None:
    """Older than any retention would keep: only the folder rule can save them."""
    then = time.time() - days * 86400
    for path in paths:
        os.utime(path, (then, then))


@pytest.mark.spark
@pytest.mark.broker
def test_maintenance_beside_a_running_pipeline_compacts_and_every_restart_resumes_exactly(
    spark,
    kafka_bootstrap,
    new_topics,
    sink_engine,
    listing_in_few_tasks,
    tmp_path: Path,
    monkeypatch,
    capsys,
) -> None:
    (topic,) = new_topics(1, partitions=2)
    produce_values(kafka_bootstrap, topic, [(0, b"not json"), (1, b"{broken")])
    produce_events(kafka_bootstrap, [topic], 200)
    root, config = _slow_project(tmp_path, kafka_bootstrap, topic)
    conf = yaml.safe_load(config.read_text())
    conf["engine"] = sink_engine
    conf["kafka"]["max_records_per_trigger"] = 50
    if sink_engine["sink"] == "delta_spark":
        conf.setdefault("spark", {}).setdefault("conf", {}).update(
            {
                "spark.jars": ",".join(local_connector_jars(JARS_DIR)),
                **DELTA_SESSION_CONFS,
                **FEW_LISTING_TASKS,
            }
        )
    config.write_text(yaml.safe_dump(conf))
    cfg = load_config(config, environ={}).with_overrides(**{"trigger.mode": "available_now"})
    # The finish and the restarts read what is left in batches of any size.
    rest = cfg.with_overrides(**{"kafka.max_records_per_trigger": 10_000})
    table, dead = cfg.delta.table, cfg.dead_letter_table
    assert dead is not None

    # Many small batches: 4 of 50 records, a file per partition each.
    Pipeline(spark, cfg).run()
    for uri in (table, dead):
        _allow_zero_retention(spark, sink_engine["sink"], uri)
    produce_events(kafka_bootstrap, [topic], 400, first_id=200)

    monkeypatch.setattr(test_graceful_stop, "SLOW_SECONDS", 0.1)
    marks, log = tmp_path / "marks", tmp_path / "run.log"
    marks.mkdir()
    run = _start(root, config, "python", marks, log)
    try:
        batches = lambda: len(re.findall(r"^.*\bbatch=\d+ ", log.read_text(), re.M))  # noqa: E731
        _wait_for(lambda: batches() >= 2, run, log, "two batches of the continuous run")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_DELTA_", "PYTHON"))}
        env.update(PYTHONPATH=str(root / "src"), PYSPARK_PYTHON=sys.executable)
        files_before = _live_files(table)
        # Lite vacuum at retention 0 (the table allows it): files the compaction just removed
        # go at once. Run again until one run of the command had pipeline commits land while
        # it worked (a batch takes about as long as the command).
        overlapped, outputs = [], []
        for _ in range(6):
            version_before = DeltaTable(table).version()
            maintained = subprocess.run(
                [
                    *MAINTAIN,
                    "--config",
                    str(config),
                    "--retention-hours",
                    "0",
                    "--log-level",
                    "INFO",
                ],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert maintained.returncode == 0, maintained.stdout + maintained.stderr
            outputs.append(maintained.stdout)
            if not overlapped:
                files_after = _live_files(table)
            version_after = DeltaTable(table).version()
            overlapped = [
                v
                for v in _pipeline_versions(table, cfg.pipeline_id)
                if version_before < v <= version_after
            ]
            if overlapped:
                break
        done = batches()
        produce_events(kafka_bootstrap, [topic], 100, first_id=600)
        _wait_for(lambda: batches() >= done + 2, run, log, "two batches after maintenance")
        os.kill(run.pid, signal.SIGTERM)  # kill <pid> of the driver `python -m` started
        assert run.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        _kill_group(run)
    with capsys.disabled():  # the figures, for whoever runs this with -s
        print(f"\n{sink_engine['sink']}: live files {files_before} -> {files_after}")
    assert files_after < files_before, outputs[0]
    assert f"table {table}: compact:" in outputs[0]
    assert f"table {dead}: compact:" in outputs[0]  # the dead-letter table too
    # The pipeline committed while the command worked, and went on committing after it.
    assert overlapped, outputs
    assert max(_pipeline_versions(table, cfg.pipeline_id)) > version_after
    operations = {str(c.get("operation")).upper() for c in DeltaTable(table).history()}
    assert "OPTIMIZE" in operations, operations

    Pipeline(spark, rest).run()  # the available-now finish
    assert_exactly_once(cfg, 700)
    capsys.readouterr()
    assert main(["offsets", "verify", "--config", str(config), "--ids", "id"]) == 0, (
        capsys.readouterr().out
    )

    # A full vacuum at retention 0 deletes what no commit names, never _kafka_delta/ (the
    # delta-rs sink's leases); the delta-spark sink keeps its side files beside the checkpoint.
    side_root = (
        Path(f"{cfg.checkpoint}.kafka_delta")
        if sink_engine["sink"] == "delta_spark"
        else Path(table) / "_kafka_delta"
    )
    side = sorted(p for p in side_root.rglob("*") if p.is_file())
    sentinel = Path(table) / "_kafka_delta" / cfg.pipeline_id / "sentinel.json"
    sentinel.parent.mkdir(parents=True, exist_ok=True)
    sentinel.write_text("{}")
    orphan = Path(table) / "part-orphan-of-a-crashed-batch.parquet"
    orphan.write_bytes(b"PAR1")
    _age([*side, sentinel, orphan])
    status, out, err = _maintain(
        capsys, config, "--only", "vacuum", "--full", "--retention-hours", "0"
    )
    assert status == 0, out + err
    assert not orphan.exists(), out
    assert sentinel.exists() and all(p.exists() for p in side), out
    if sink_engine["sink"] == "delta_spark":
        assert [p for p in side if p.parent.parent.name == "commits"], side  # the copies

    produce_events(kafka_bootstrap, [topic], 100, first_id=700)
    Pipeline(spark, rest).run()  # the checkpoint kept
    assert_exactly_once(cfg, 800)
    shutil.rmtree(cfg.checkpoint)
    produce_events(kafka_bootstrap, [topic], 100, first_id=800)
    Pipeline(spark, rest).run()  # the checkpoint deleted: resumes from the table
    assert_exactly_once(cfg, 900)
    assert_offsets_agree(cfg)


@pytest.mark.spark
@pytest.mark.broker
def test_maintenance_then_log_cleanup_then_restarts_are_exact(
    spark,
    kafka_bootstrap,
    new_topics,
    make_config,
    sink_engine,
    listing_in_few_tasks,
    tmp_path: Path,
    capsys,
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 150)
    cfg = make_config(topics, engine=sink_engine, max_records_per_trigger=50)
    config = _config_file(cfg, tmp_path / "conf" / "maintain.yaml")
    Pipeline(spark, cfg).run()
    _allow_zero_retention(spark, sink_engine["sink"], cfg.delta.table)
    if sink_engine["sink"] == "delta_spark":
        # delta-spark checkpoints by itself, every delta.checkpointInterval commits, and gives
        # Spark no call to force one: here at every commit, so maintenance ends on one.
        spark.sql(
            f"ALTER TABLE delta.`{cfg.delta.table}` SET TBLPROPERTIES "
            "('delta.checkpointInterval' = '1')"
        )
    before = _live_files(cfg.delta.table)

    status, out, err = _maintain(capsys, config, "--retention-hours", "0")
    assert status == 0, out + err
    assert _live_files(cfg.delta.table) < before, out
    log = Path(cfg.delta.table) / "_delta_log"
    if sink_engine["sink"] == "delta_spark":
        assert "checkpoint: delta-spark's own" in out, out
        newest = max(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint.parquet"))
        assert newest == DeltaTable(cfg.delta.table).version(), out
    else:
        # The sink's engine wrote a Delta checkpoint.
        checkpointed = re.search(r"checkpoint: written at version (\d+)", out)
        assert checkpointed, out
        assert (log / f"{int(checkpointed.group(1)):020}.checkpoint.parquet").is_file(), out
    _clean_up_the_log(cfg.delta.table)
    produce_events(kafka_bootstrap, topics, 100, first_id=150)
    Pipeline(spark, cfg).run()  # the checkpoint kept
    assert_exactly_once(cfg, 250)

    status, out, err = _maintain(capsys, config, "--retention-hours", "0", "--full")
    assert status == 0, out + err
    _clean_up_the_log(cfg.delta.table)
    shutil.rmtree(cfg.checkpoint)
    produce_events(kafka_bootstrap, topics, 100, first_id=250)
    # The checkpoint deleted, the log cleaned: the rows say where to resume, with the offset
    # txns (delta-rs) or the commit copy beside the checkpoint (delta-spark) as hints.
    Pipeline(spark, cfg).run()
    assert_exactly_once(cfg, 350)
    assert_offsets_agree(cfg)


def _hand_written(spark, sink: str, uri: str, batches: range) -> None:
    """One small file per append, written by the sink's own engine."""
    for i in batches:
        if sink == "delta_spark":
            spark.range(i * 10, i * 10 + 10).coalesce(1).write.format("delta").mode("append").save(
                uri
            )
        else:
            write_deltalake(
                uri, pa.table({"id": pa.array(range(i * 10, i * 10 + 10))}), mode="append"
            )


def _offline_config(tmp_path: Path, uri: str, engine: dict[str, str] | str = "embedded") -> Path:
    """A config whose table is ``uri``; maintenance never talks to Kafka."""
    cfg = PipelineConfig.model_validate(
        {
            "pipeline_id": "maintained",
            "engine": engine,
            "kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["t"], "consumer_group": "g"},
            "delta": {"table": uri},
            "dead_letters": {"enabled": False},
            "checkpoint": str(tmp_path / "checkpoint"),
        }
    )
    return _config_file(cfg, tmp_path / "conf" / "offline.yaml")


@pytest.mark.spark
def test_dry_run_writes_nothing_and_predicts_what_the_steps_then_do(
    spark, sink_engine, listing_in_few_tasks, tmp_path: Path, capsys
) -> None:
    sink, uri = sink_engine["sink"], str(tmp_path / "table")
    _hand_written(spark, sink, uri, range(4))
    _allow_zero_retention(spark, sink, uri)
    config = _offline_config(tmp_path, uri, sink_engine)
    assert _maintain(capsys, config, "--only", "compact")[0] == 0  # 4 removed files to vacuum
    _hand_written(spark, sink, uri, range(4, 7))
    orphan = Path(uri) / "part-orphan.parquet"
    orphan.write_bytes(b"PAR1")
    _age([orphan])
    version, files = DeltaTable(uri).version(), _on_disk(uri)

    status, out, err = _maintain(
        capsys, config, "--dry-run", "--retention-hours", "0", "--full", "--log-level", "INFO"
    )

    assert status == 0, out + err
    assert DeltaTable(uri).version() == version and _on_disk(uri) == files, out
    assert "dry run: nothing was written" in out
    assert f"checkpoint: would write a checkpoint at version {version}" in out
    small = re.search(r"compact: would rewrite (\d+) files \((\d+) bytes\)", out)
    deleted = re.search(r"vacuum: would delete (\d+) files", out)
    assert small and deleted, out
    assert int(small.group(1)) == 4  # the compacted file and the three appended since
    listed = [line.strip() for line in out.splitlines() if line.startswith("    ")]
    assert len(listed) == int(deleted.group(1)) == 5  # 4 removed by the compaction, 1 orphan
    assert any(p.endswith("part-orphan.parquet") for p in listed), listed

    # What the dry run said is what the steps then do.
    status, out, _ = _maintain(capsys, config, "--only", "compact")
    assert f"compact: {small.group(1)} files ({small.group(2)} bytes) rewritten into 1" in out
    status, out, _ = _maintain(
        capsys, config, "--only", "vacuum", "--retention-hours", "0", "--full"
    )
    assert status == 0 and "vacuum: 9 files deleted (full, retention 0 h)" in out, out
    assert not orphan.exists()


def test_a_retention_below_the_tables_floor_is_refused_in_one_sentence_and_deletes_nothing(
    tmp_path: Path, capsys
) -> None:
    uri = str(tmp_path / "table")
    for i in range(3):
        write_deltalake(uri, pa.table({"id": [i]}), mode="append")
    DeltaTable(uri).optimize.compact()
    config = _offline_config(tmp_path, uri)
    version, files = DeltaTable(uri).version(), _on_disk(uri)

    status, out, err = _maintain(capsys, config, "--retention-hours", "0")

    assert status == 2 and out == "", out
    assert err.count("\n") == 1 and err.startswith("error: vacuum retention 0 h is below"), err
    assert "delta.deletedFileRetentionDuration of 168 h" in err and "RESTORE" in err
    assert DeltaTable(uri).version() == version and _on_disk(uri) == files

    # The floor is the table's own property, whatever it is.
    DeltaTable(uri).alter.set_table_properties(
        {"delta.deletedFileRetentionDuration": "interval 1 day"}
    )
    status, _, err = _maintain(capsys, config, "--retention-hours", "23.5", "--only", "vacuum")
    assert status == 2 and "of 24 h" in err and "--retention-hours 24 or more" in err, err
    status, out, err = _maintain(capsys, config, "--retention-hours", "24", "--only", "vacuum")
    assert status == 0 and "vacuum: 0 files deleted (lite, retention 24 h)" in out, out + err


def test_bad_input_gets_one_sentence_and_exit_2(tmp_path: Path, capsys) -> None:
    uri = str(tmp_path / "table")
    write_deltalake(uri, pa.table({"id": [1]}))
    a_file = tmp_path / "a-file"
    a_file.write_text("not a table")
    cases = [
        (_offline_config(tmp_path / "missing", str(tmp_path / "nothing")), [], "no Delta table"),
        (_offline_config(tmp_path / "file", str(a_file)), [], "is a file, not a Delta table"),
        (_offline_config(tmp_path / "ok", uri), ["--only", "compact,vaccum"], "unknown step"),
        (_offline_config(tmp_path / "ok", uri), ["--retention-hours", "-1"], "negative"),
        (_offline_config(tmp_path / "ok", uri), ["--only", "vacuum", "--no-vacuum"], "nothing"),
    ]
    for config, args, sentence in cases:
        status, out, err = _maintain(capsys, config, *args)
        assert status == 2 and out == "", (args, out, err)
        assert err.count("\n") == 1 and err.startswith("error: ") and sentence in err, err
        assert "Traceback" not in err


def test_a_compaction_that_loses_a_commit_race_is_retried_on_a_fresh_snapshot(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """A real conflict: the first attempt compacts a snapshot taken before another writer
    deleted rows from the files it rewrites (delta-rs refuses that commit); the retry opens the
    table afresh and compacts what is there."""
    uri = str(tmp_path / "table")
    for i in range(4):
        write_deltalake(uri, pa.table({"id": [i]}), mode="append")
    stale = DeltaTable(uri)
    DeltaTable(uri).delete("id < 2")

    class FirstOpenIsStale(DeltaRsMaintainer):
        opened = 0

        def _open(self, uri: str) -> DeltaTable:
            FirstOpenIsStale.opened += 1
            return stale if FirstOpenIsStale.opened == 1 else super()._open(uri)

    monkeypatch.setattr(maintenance, "RETRY_PAUSE_S", 0.0)
    caplog.set_level("WARNING", logger=maintenance.__name__)
    removed, _, added = maintenance.with_retries(
        "compaction", lambda _: FirstOpenIsStale({}).compact(uri)
    )

    assert FirstOpenIsStale.opened == 2
    assert "lost a commit race (attempt 1 of 5)" in caplog.text
    assert (removed, added) == (2, 1)
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [2, 3]


def test_steps_are_chosen_with_only_and_skipped_with_no_flags(tmp_path: Path, capsys) -> None:
    assert table_command.parse_steps("checkpoint,compact", set()) == ("compact", "checkpoint")
    assert table_command.parse_steps(None, {"compact"}) == ("vacuum", "checkpoint")
    uri = str(tmp_path / "table")
    for i in range(3):
        write_deltalake(uri, pa.table({"id": [i]}), mode="append")
    config = _offline_config(tmp_path, uri)

    status, out, err = _maintain(capsys, config, "--no-compact", "--no-vacuum")

    assert status == 0, err
    assert out.splitlines() == [f"table {uri}: checkpoint: written at version 2"]
    assert (Path(uri) / "_delta_log" / f"{2:020}.checkpoint.parquet").is_file()
    assert _live_files(uri) == 3


@pytest.mark.spark
@pytest.mark.broker
def test_the_checkpoint_step_deletes_the_log_entries_past_the_logs_retention(
    tmp_path: Path, capsys
) -> None:
    """The delta-rs sink's batch commits leave expired-log cleanup to maintenance (its listing
    of _delta_log grew with every version): the checkpoint step applies
    delta.logRetentionDuration (30 days), so the log stays bounded however long a run goes."""
    uri = str(tmp_path / "table")
    for i in range(4):
        write_deltalake(uri, pa.table({"id": [i]}), mode="append")
    log = Path(uri) / "_delta_log"
    # Past the retention: every commit the checkpoint (at version 3) covers.
    _age([log / f"{v:020}.json" for v in (0, 1, 2)], days=40)
    config = _offline_config(tmp_path, uri)

    status, out, err = _maintain(capsys, config, "--only", "checkpoint")

    assert status == 0, err
    assert out.splitlines() == [f"table {uri}: checkpoint: written at version 3"]
    assert [p.name for p in log.glob("*.json")] == [f"{3:020}.json"]
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2, 3]


def test_delta_interval_properties_read_as_hours() -> None:
    hours = table_command.parse_interval_hours
    assert hours("interval 7 days") == hours("interval 1 week") == 168
    assert hours("interval 1 day 12 hours") == 36
    assert hours("INTERVAL 90 minutes") == 1.5
    assert table_command.retention_floor_hours({}) == 168
    with pytest.raises(ValueError):
        hours("7 fortnights")


def test_the_bundles_maintenance_job_passes_arguments_the_table_command_takes() -> None:
    import yaml

    from kafka_delta.commands.table import parser
    from support import PROJECT

    bundle = yaml.safe_load((PROJECT / "databricks.yml").read_text(encoding="utf-8"))
    (task,) = bundle["resources"]["jobs"]["orders_stream_maintenance"]["tasks"]
    params = task["python_wheel_task"]["parameters"]

    args = parser("orders-stream table").parse_args(params[1:])

    assert params[0] == "table" and args.command == "maintain" and not args.dry_run
