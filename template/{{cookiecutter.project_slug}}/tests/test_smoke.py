"""End to end, as this project runs: the development broker (or KAFKA_BOOTSTRAP_SERVERS), this
project's config and transform, a run killed with SIGKILL in the middle of the stream (the
whole process group: Python driver and Spark's JVM), then a restart. Every record must be in
the table exactly once, and the consumer group must show no lag: the promise of the template,
checked on your code. Reads the table with delta-rs and Kafka with confluent-kafka directly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from kafka_delta import load_config
from kafka_delta_dev.produce import produce_events
from kafka_delta_dev.pytest_plugin import connector_conf

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = "{{ cookiecutter.package_name }}"
RECORDS = 3000

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _config(tmp_path: Path, bootstrap: str, topics: list[str]) -> Path:
    """conf/local.yaml with the test's broker, topics and paths (small batches: several of them,
    so the kill lands between two)."""
    conf = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text(encoding="utf-8"))
    conf["kafka"].update(
        bootstrap_servers=bootstrap,
        topics=topics,
        consumer_group=f"smoke-{tmp_path.name}",
        max_records_per_trigger=400,
    )
    schema_file = conf["decoding"]["value"].get("schema_file")
    if schema_file:
        conf["decoding"]["value"]["schema_file"] = str(PROJECT / schema_file)
    conf["delta"]["table"] = str(tmp_path / "table")
    conf["dead_letters"]["table"] = str(tmp_path / "dead_letters")
    conf["checkpoint"] = str(tmp_path / "checkpoint")
    conf["progress"]["path"] = str(tmp_path / "progress.jsonl")
    conf["trigger"]["interval_seconds"] = 1
    # The cluster engine's connector jars, where this machine has them (else a skip, saying so).
    engine = load_config(PROJECT / "conf" / "local.yaml").engine
    conf["spark"]["conf"].update(connector_conf(engine.source, engine.sink))
    path = tmp_path / "conf" / "smoke.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(conf), encoding="utf-8")
    return path


def _run(config: Path, trigger: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "PYSPARK_PYTHON": sys.executable}
    return subprocess.Popen(
        [sys.executable, "-m", PACKAGE, "--config", str(config), "--trigger", trigger],
        cwd=PROJECT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the kill takes Spark's JVM too
    )


def _rows(table: Path) -> int:
    try:
        return DeltaTable(str(table)).to_pyarrow_table(columns=["id"]).num_rows
    except TableNotFoundError:
        return 0


def _group_lag(bootstrap: str, group: str, topics: list[str]) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=10)
    partitions = [TopicPartition(t, p) for t in topics for p in metadata.topics[t].partitions]
    latest = admin.list_offsets({tp: OffsetSpec.latest() for tp in partitions})
    committed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, partitions)])
    position = {
        (tp.topic, tp.partition): tp.offset for tp in committed[group].result().topic_partitions
    }
    return sum(
        future.result().offset - max(position[(tp.topic, tp.partition)], 0)
        for tp, future in latest.items()
    )


def test_a_run_killed_mid_stream_and_restarted_lands_every_record_exactly_once(
    kafka_bootstrap: str, new_topics, tmp_path: Path
) -> None:
    topics = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, topics, RECORDS)
    config = _config(tmp_path, kafka_bootstrap, topics)
    table = tmp_path / "table"

    killed = _run(config, "processing-time", tmp_path / "killed.log")
    try:
        deadline = time.monotonic() + 180
        while _rows(table) == 0 and killed.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert killed.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert 0 < _rows(table) < RECORDS, "the kill must land in the middle of the stream"
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(60)

    restarted = _run(config, "available-now", tmp_path / "restarted.log")
    assert restarted.wait(300) == 0, (tmp_path / "restarted.log").read_text()[-3000:]

    ids = DeltaTable(str(table)).to_pyarrow_table(columns=["id"])["id"].to_pylist()
    assert sorted(ids) == list(range(RECORDS))
    assert _group_lag(kafka_bootstrap, f"smoke-{tmp_path.name}", topics) == 0
