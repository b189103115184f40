"""Logs a person can read: one sentence for an unreachable broker or a path that is a file, no
librdkafka warning or repetition a run does not need, a resume line that says where the run
starts, progress lines that count records read, rows written and dead letters apart, and
replays that say they wrote nothing."""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, Producer

from kafka_delta.cli import main
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.kafka.clients import admin_settings, consumer_settings
from kafka_delta.kafka.commit_back import OffsetCommitter
from kafka_delta.pipeline import Pipeline
from kafka_delta.progress.run_progress import records_read
from kafka_delta.sources.kafka_datasource import OffsetRange, _consumer
from kafka_delta_dev.broker import dev_broker
from kafka_delta_dev.produce import event, produce_values
from support import PACKAGE, PROJECT, forget_last_spark_commit, spark_jobs


def _nobody_listens() -> str:
    """A loopback address whose port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _project_config(tmp_path: Path, **changes: object) -> Path:
    """conf/local.yaml of this project with table and checkpoint under tmp_path."""
    conf = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text(encoding="utf-8"))
    conf["delta"]["table"] = str(tmp_path / "table")
    conf["dead_letters"]["table"] = str(tmp_path / "dead_letters")
    conf["checkpoint"] = str(tmp_path / "checkpoint")
    # The config moves out of the project: its schema file is named where it is.
    conf["decoding"]["value"]["schema_file"] = str(PROJECT / "schemas" / "order_event.ddl")
    for dotted, value in changes.items():
        node = conf
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[key]
        node[leaf] = value
    (tmp_path / "conf").mkdir(exist_ok=True)
    path = tmp_path / "conf" / "test.yaml"
    path.write_text(yaml.safe_dump(conf), encoding="utf-8")
    return path


# -- unreachable Kafka -------------------------------------------------------------------------


def test_an_unreachable_broker_stops_the_run_with_one_sentence_within_15_seconds(
    tmp_path: Path,
) -> None:
    address = _nobody_listens()
    config = _project_config(tmp_path)
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", PACKAGE, "--config", str(config), "--bootstrap-servers", address],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT,
        env={**os.environ, "PYTHONPATH": str(PROJECT / "src")},
    )
    took = time.monotonic() - started

    lines = (run.stdout + run.stderr).splitlines()
    assert run.returncode == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot reach Kafka at {address} ({address}: "), lines
    assert "kafka.bootstrap_servers" in lines[0]
    assert took < 15, took
    assert not (tmp_path / "table").exists() and not (tmp_path / "checkpoint").exists()


def test_librdkafka_logs_a_repeated_connection_failure_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = consumer_settings(
        {"bootstrap.servers": _nobody_listens(), "group.id": "g", "reconnect.backoff.ms": 10}
    )
    consumer = Consumer(settings)
    try:
        deadline = time.monotonic() + 3  # librdkafka retries every 10-15 ms here
        while time.monotonic() < deadline:
            consumer.poll(0.1)
    finally:
        consumer.close()

    refused = [r for r in caplog.records if "Connection refused" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in refused][:5]


# -- no client-config warning -----------------------------------------------------------------

MIXED_CLIENT_SETTINGS = {
    # consumer-only: would make the admin client (a producer handle) print CONFWARN
    "fetch.wait.max.ms": "100",
    "isolation.level": "read_committed",
    "session.timeout.ms": "6000",
    # producer-only: would make every consumer print CONFWARN
    "linger.ms": "5",
    "compression.type": "lz4",
    # global: every client takes it
    "socket.timeout.ms": "10000",
}


@pytest.mark.broker
def test_each_client_gets_only_its_own_settings_and_prints_no_confwarn(
    kafka_bootstrap: str,
    new_topics,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    (topic,) = new_topics(1, partitions=1)
    produce_values(kafka_bootstrap, topic, [(0, event(0, random.Random(0)))])
    conf = {"bootstrap.servers": kafka_bootstrap, **MIXED_CLIENT_SETTINGS}

    # The pipeline's clients: metadata (admin), commit-back (consumer), a read task's consumer.
    KafkaAdmin(conf).partitions([topic])
    committer = OffsetCommitter(conf, f"g-{topic}", timeout_s=10)
    committer.submit(0, {topic: {0: 1}})
    assert committer.close().succeeded == 1
    reader = _consumer(OffsetRange(topic, 0, 0, 1, tuple(conf.items()), 10_000))
    reader.poll(0.5)
    reader.close()
    # The same settings without the logger: librdkafka would print any CONFWARN to stderr.
    plain_admin = {k: v for k, v in admin_settings(conf).items() if k != "logger"}
    Producer(plain_admin).flush(0)
    plain_consumer = {k: v for k, v in consumer_settings(conf).items() if k != "logger"}
    Consumer({**plain_consumer, "group.id": "g"}).close()

    assert "CONFWARN" not in capfd.readouterr().err
    assert not [r.getMessage() for r in caplog.records if "CONFWARN" in r.getMessage()]
    assert admin_settings(conf).keys() >= {"linger.ms", "socket.timeout.ms"}
    assert "fetch.wait.max.ms" not in admin_settings(conf)
    assert "linger.ms" not in consumer_settings(conf)
    assert consumer_settings(conf)["fetch.wait.max.ms"] == "100"


def test_starting_the_development_broker_prints_no_connection_refused_lines(
    capfd: pytest.CaptureFixture[str],
) -> None:
    try:
        broker = dev_broker().start()
    except Exception as exc:  # no broker at all: the broker fixture skips the same way
        pytest.skip(f"no Kafka broker: {exc}")
    broker.stop()

    err = capfd.readouterr().err
    assert "Connection refused" not in err and "FAIL" not in err, err[-2000:]


# -- a path that is a file --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "override"),
    [
        ("delta.table", "delta.table"),
        ("dead_letters.table", "dead_letters.table"),
        ("checkpoint", "checkpoint"),
    ],
)
def test_a_path_that_is_a_plain_file_stops_the_run_with_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, override: str
) -> None:
    plain_file = tmp_path / "not-a-folder"
    plain_file.write_text("x")
    config = _project_config(
        tmp_path, **{override: str(plain_file), "kafka.bootstrap_servers": _nobody_listens()}
    )

    code = main(["--config", str(config)])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [
        f"error: {key} {plain_file} is a file, not a folder: "
        f"{'a Spark checkpoint' if key == 'checkpoint' else 'a Delta table'} is a folder; point "
        f"{key} at a folder (it is created if missing)"
    ]
    assert plain_file.read_text() == "x"
    assert not (tmp_path / "table").exists() and not (tmp_path / "checkpoint").exists()


def test_a_path_below_a_plain_file_stops_the_run_with_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain_file = tmp_path / "not-a-folder"
    plain_file.write_text("x")
    config = _project_config(tmp_path, **{"delta.table": str(plain_file / "orders")})

    assert main(["--config", str(config)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: delta.table {plain_file / 'orders'} cannot be created: {plain_file} is a file, "
        "not a folder"
    ]


# -- a folder of somebody else's files -------------------------------------------------------


@pytest.mark.parametrize("sink", ["delta_rs", "delta_spark"])
@pytest.mark.parametrize("key", ["delta.table", "dead_letters.table"])
def test_a_table_folder_holding_other_files_is_refused_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, sink: str
) -> None:
    # Before: the first run created a Delta table beside the CSV (the folder silently adopted).
    folder = tmp_path / "exports"
    folder.mkdir()
    (folder / "x.csv").write_text("id\n1\n")
    config = _project_config(
        tmp_path,
        **{
            key: str(folder),
            "engine": {"source": "embedded", "sink": sink},
            "kafka.bootstrap_servers": _nobody_listens(),
        },
    )

    assert main(["--config", str(config)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {key} {folder} is a folder that holds other files (x.csv) and no Delta table "
        f"(no _delta_log): point {key} at an empty or new folder, or at a Delta table; nothing "
        "was read or written"
    ]
    assert sorted(p.name for p in folder.iterdir()) == ["x.csv"]


def test_an_empty_folder_and_a_crashed_first_batch_are_not_refused(tmp_path: Path) -> None:
    from kafka_delta.config import load_config
    from kafka_delta.runtime.preflight import check_paths

    empty = tmp_path / "empty"
    empty.mkdir()
    crashed = tmp_path / "crashed"  # a first batch's data files and side folder, no commit
    (crashed / "_kafka_delta" / "p").mkdir(parents=True)
    (crashed / "part-00000-1b2c-c000.snappy.parquet").write_bytes(b"PAR1")
    (crashed / ".part-00000-1b2c-c000.snappy.parquet.crc").write_bytes(b"")
    (crashed / "day=2026-11-28").mkdir()
    for folder in (empty, crashed, tmp_path / "missing"):
        check_paths(load_config(_project_config(tmp_path, **{"delta.table": str(folder)})))


def test_a_bucket_folder_holding_other_objects_is_refused(tmp_path: Path, object_store) -> None:
    import urllib.request

    from kafka_delta.config import load_config
    from kafka_delta.runtime.preflight import PreflightError, check_paths

    bucket = object_store.create_bucket(f"b{os.getpid()}{time.time_ns() % 10**9}")
    location = f"{bucket}/exports"

    def put(key: str, body: bytes) -> None:  # moto's S3 API takes an unsigned request
        url = f"{object_store.endpoint}/{bucket.removeprefix('s3://')}/{key}"
        urllib.request.urlopen(urllib.request.Request(url, body, method="PUT"), timeout=10)

    put("exports/x.csv", b"id\n1\n")
    config = load_config(
        _project_config(
            tmp_path,
            **{"delta.table": location, "delta.storage_options": object_store.storage_options()},
        )
    )

    with pytest.raises(PreflightError, match=r"holds other files \(x\.csv\)"):
        check_paths(config)
    put("exports/_delta_log/00000000000000000000.json", b"{}")
    check_paths(config)  # a Delta table's folder


# -- resume, progress and replay lines --------------------------------------------------------

BAD = [b"not json", b'{"id": "seven"}', None]


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("kafka_delta")]


@pytest.mark.spark
@pytest.mark.broker
def test_the_log_says_where_a_run_starts_what_a_batch_read_and_wrote_and_what_a_replay_did(
    spark, kafka_bootstrap, new_topics, make_config, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    (topic,) = new_topics(1, partitions=1)
    rng = random.Random(1)
    values = [event(i, rng) for i in range(40)]
    # batch 0: 25 good records; batch 1: 3 bad ones and 15 good ones
    produce_values(kafka_bootstrap, topic, [(0, v) for v in values[:25] + BAD + values[25:]])
    cfg = make_config([topic], max_records_per_trigger=25)

    # A new checkpoint and an empty table.
    Pipeline(spark, cfg).run()
    first = _messages(caplog)
    assert (
        f"new checkpoint {cfg.checkpoint}: starting at earliest offsets; table "
        f"{cfg.delta.table} holds no offsets of pipeline 'test-pipeline'"
    ) in first
    progress = [m for m in first if m.startswith("batch=")]
    assert len(progress) == 2, first
    assert " records_read=25 rows_written=25 dead_letters=0 " in progress[0], progress
    assert " records_read=18 rows_written=15 dead_letters=3 " in progress[1], progress

    # The same checkpoint, batch 1 committed to Delta but not to Spark: a replay.
    forget_last_spark_commit(cfg)
    caplog.clear()
    summary = Pipeline(spark, cfg).run()
    second = _messages(caplog)
    assert any(
        m.startswith(f"resuming from checkpoint {cfg.checkpoint} (Spark's offset log decides ")
        and "stores offsets of pipeline 'test-pipeline' at Delta version" in m
        for m in second
    ), second
    # The table already holds batch 1: no task runs, so nothing is read from Kafka again.
    replayed = [m for m in second if m.startswith("replayed batch 1: nothing written")]
    assert len(replayed) == 1 and " records_read=0 " in replayed[0], second
    assert not [m for m in second if "dead-letter table" in m or "dead letter" in m], second
    assert not [m for m in second if m.startswith("batch=")], second
    assert summary.replayed_batches == 1
    assert summary.rows_written == 0 and summary.dead_letters == 0

    # A new checkpoint on a table that holds offsets.
    shutil.rmtree(cfg.checkpoint)
    caplog.clear()
    Pipeline(spark, cfg).run()
    assert any(
        m.startswith(f"new checkpoint {cfg.checkpoint}: resuming from the table; table ")
        and "stores offsets of pipeline 'test-pipeline' at Delta version" in m
        for m in _messages(caplog)
    ), _messages(caplog)


@pytest.mark.spark
def test_counting_the_records_read_adds_no_spark_job(spark) -> None:
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    batch = spark.range(0, 10_000, numPartitions=4).withColumn("value", F.col("id") * 2)

    _, plain = spark_jobs(spark, lambda: batch.toArrow())
    observation = Observation()
    observed = batch.observe(observation, F.count(F.lit(1)).alias("records"))
    _, counted = spark_jobs(spark, lambda: observed.toArrow())

    assert len(counted) == len(plain) >= 1
    assert records_read(observation) == 10_000
    assert records_read(Observation(), wait_s=0.1) is None  # never observed: unknown, bounded wait
