"""Protobuf as Confluent's own serializer writes it (issue: formats): the message each record's
frame names (not only the file's first), schema references resolved through the registry, and
the type mapping of kafka_delta.decoding.protobuf_types (well-known types, maps, oneofs,
recursion). The decoder on Arrow batches against the development registry, no Spark; one run
through the pipeline at the end. Generated schemas: test_protobuf_generated.py."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from kafka_delta.config import DecodingConfig
from kafka_delta.contract import KAFKA_ARROW_SCHEMA
from kafka_delta.decoding.decoder import Decoder
from kafka_delta.decoding.protobuf_types import default_message, protobuf_file
from kafka_delta.decoding.resolve import decode_spec
from kafka_delta.decoding.spec import DecodeSpec
from kafka_delta.decoding.versions import TIMESTAMP

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WELL_KNOWN = (
    "google/protobuf/timestamp.proto",
    "google/protobuf/duration.proto",
    "google/protobuf/wrappers.proto",
    "google/protobuf/struct.proto",
    "google/protobuf/any.proto",
    "google/protobuf/empty.proto",
)


# -- helpers shared with test_protobuf_generated.py ------------------------------------------


def file_proto(text: str) -> descriptor_pb2.FileDescriptorProto:
    """A FileDescriptorProto from its text format (what protoc would build from a .proto)."""
    return text_format.Parse(text, descriptor_pb2.FileDescriptorProto())


def message_classes(*files: descriptor_pb2.FileDescriptorProto) -> descriptor_pool.DescriptorPool:
    """A pool of its own holding the well-known files and ``files`` (imports first), as a
    producer's generated code would have them."""
    from google.protobuf import (  # noqa: F401 (they put their files in the default pool)
        any_pb2,
        duration_pb2,
        empty_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )

    pool = descriptor_pool.DescriptorPool()
    for name in WELL_KNOWN:
        proto = descriptor_pb2.FileDescriptorProto()
        descriptor_pool.Default().FindFileByName(name).CopyToProto(proto)
        pool.Add(proto)
    for f in files:
        pool.Add(f)
    return pool


def message_class(pool: descriptor_pool.DescriptorPool, name: str) -> Any:
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def serialize(registry_url: str, topic: str, messages: list[Any], **conf: Any) -> list[bytes]:
    """Confluent-framed Protobuf by confluent-kafka's own serializer (auto-registering the file
    under ``<topic>-value`` and its imports as references)."""
    serializer = ProtobufSerializer(
        type(messages[0]),
        SchemaRegistryClient({"url": registry_url}),
        {"use.deprecated.format": False, **conf},
    )
    context = SerializationContext(topic, MessageField.VALUE)
    return [serializer(m, context) for m in messages]


def kafka_batch(values: list[bytes | None]) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([b"k"] * n),
            pa.array(values, pa.binary()),
            pa.array(["t"] * n),
            pa.array([0] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([T0] * n, TIMESTAMP),
            pa.array([0] * n, pa.int32()),
            pa.nulls(n, KAFKA_ARROW_SCHEMA.field("headers").type),
        ],
        schema=KAFKA_ARROW_SCHEMA,
    )


def registry_spec(registry_url: str, topic: str, message: str | None = None) -> DecodeSpec:
    """The driver's spec for ``topic`` (resolve.decode_spec, as the pipeline builds it)."""
    decoding = DecodingConfig.model_validate(
        {
            "value": {"format": "protobuf", **({"message": message} if message else {})},
            "schema_registry": {"url": registry_url},
        }
    )
    spec = decode_spec(None, decoding, [topic])  # type: ignore[arg-type] (no DDL: no Spark)
    assert spec is not None
    return DecodeSpec.from_json(spec.to_json())  # as the read tasks receive it


def decode(spec: DecodeSpec, values: list[bytes | None]) -> list[dict[str, Any]]:
    return Decoder(spec).decode(kafka_batch(values)).to_pylist()


def topic_name() -> str:
    return f"pb-{uuid.uuid4().hex[:12]}"


# -- which message -------------------------------------------------------------------------

HELPER_FIRST = """
name: "helper_first.proto" package: "hf" syntax: "proto3"
message_type { name: "Address"
  field { name: "city" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL } }
message_type { name: "Person"
  field { name: "id" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL }
  field { name: "home" number: 2 type: TYPE_MESSAGE type_name: ".hf.Address"
          label: LABEL_OPTIONAL } }
"""

TWO_ROOTS = """
name: "two_roots.proto" package: "tr" syntax: "proto3"
message_type { name: "Ping"
  field { name: "seq" number: 1 type: TYPE_INT32 label: LABEL_OPTIONAL } }
message_type { name: "Order"
  field { name: "id" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL }
  field { name: "amount" number: 2 type: TYPE_DOUBLE label: LABEL_OPTIONAL }
  nested_type { name: "Line"
    field { name: "sku" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
    field { name: "qty" number: 2 type: TYPE_INT32 label: LABEL_OPTIONAL } } }
"""


def test_the_produced_message_is_found_when_it_is_not_the_files_first(schema_registry) -> None:
    # The issue's case: Confluent's serializer frames Person with message index [1]; the file's
    # first message is a helper Person uses. The table takes Person, no `message:` needed.
    pool = message_classes(file_proto(HELPER_FIRST))
    person, address = message_class(pool, "hf.Person"), message_class(pool, "hf.Address")
    topic = topic_name()
    values = serialize(
        schema_registry.url,
        topic,
        [person(id=i, home=address(city=f"c{i}")) for i in range(3)],
    )
    assert values[0][5:7] == b"\x02\x02"  # one index, 1 (zigzag varints)

    spec = registry_spec(schema_registry.url, topic)
    assert spec.value.reader.names == ["id", "home"]
    rows = decode(spec, values)
    assert [(r["id"], r["home"], r["_error"]) for r in rows] == [
        (i, {"city": f"c{i}"}, None) for i in range(3)
    ]


def test_a_file_of_independent_messages_takes_the_first_and_message_overrides(
    schema_registry,
) -> None:
    pool = message_classes(file_proto(TWO_ROOTS))
    order, ping = message_class(pool, "tr.Order"), message_class(pool, "tr.Ping")
    line = message_class(pool, "tr.Order.Line")
    topic = topic_name()
    orders = serialize(schema_registry.url, topic, [order(id=1, amount=2.5)])
    pings = serialize(schema_registry.url, topic, [ping(seq=7)])
    lines = serialize(schema_registry.url, topic, [line(sku="a", qty=2)])
    assert (pings[0][5], orders[0][5:7], lines[0][5:8]) == (0, b"\x02\x02", b"\x04\x02\x00")

    # Without `message:` the table takes the first message no other uses (Confluent's [0]);
    # records of another message are dead letters that say which `message:` takes them.
    rows = decode(registry_spec(schema_registry.url, topic), [*pings, *orders, *lines])
    assert rows[0]["seq"] == 7 and rows[0]["_error"] is None
    assert "carries message tr.Order" in rows[1]["_error"]
    assert "set decoding.value.message to tr.Order" in rows[1]["_error"]
    assert "carries message tr.Order.Line" in rows[2]["_error"]

    # `message:` overrides, nested messages included; never two messages' fields in one table.
    spec = registry_spec(schema_registry.url, topic, "tr.Order")
    assert spec.value.reader.names == ["id", "amount"]
    rows = decode(spec, [*pings, *orders, *lines])
    assert (rows[1]["id"], rows[1]["amount"], rows[1]["_error"]) == (1, 2.5, None)
    assert "carries message tr.Ping" in rows[0]["_error"]
    spec = registry_spec(schema_registry.url, topic, "tr.Order.Line")
    rows = decode(spec, lines)
    assert (rows[0]["sku"], rows[0]["qty"], rows[0]["_error"]) == ("a", 2, None)


def test_records_of_another_message_than_the_default_restart_with_their_columns(
    schema_registry,
) -> None:
    """Without `message:`, the file's default (Ping) is a guess: a batch whose frames all name
    another message (Order, the file's second) raises MessageSeenError for it, and the spec
    resolved with what was seen takes Order's columns; from then on Ping is the other message,
    a dead letter that says which `message:` takes it, never a stop."""
    from kafka_delta.decoding.failures import message_seen
    from kafka_delta.decoding.spec import MessageSeenError

    pool = message_classes(file_proto(TWO_ROOTS))
    order, ping = message_class(pool, "tr.Order"), message_class(pool, "tr.Ping")
    topic = topic_name()
    orders = serialize(schema_registry.url, topic, [order(id=i, amount=i / 2) for i in range(3)])
    pings = serialize(schema_registry.url, topic, [ping(seq=7)])

    with pytest.raises(MessageSeenError) as seen:
        decode(registry_spec(schema_registry.url, topic), orders)
    assert message_seen(seen.value) == "tr.Order"
    wrapped = RuntimeError(f"Traceback ...\nkafka_delta.MessageSeenError: {seen.value}\n")
    assert message_seen(wrapped) == "tr.Order"  # as Spark reports a read task's failure

    decoding = DecodingConfig.model_validate(
        {"value": {"format": "protobuf"}, "schema_registry": {"url": schema_registry.url}}
    )
    spec = decode_spec(None, decoding, [topic], message_seen="tr.Order")  # type: ignore[arg-type]
    assert spec is not None and spec.value.reader.names == ["id", "amount"]
    # A run after: the existing table's columns name the message (the file's default too).
    for columns, message in (
        (["key", "topic", "offset", "id", "amount"], ["id", "amount"]),
        (["key", "seq"], ["seq"]),
    ):
        found = decode_spec(None, decoding, [topic], table_columns=columns)  # type: ignore[arg-type]
        assert found is not None and found.value.reader.names == message
        assert found.value.message is not None  # pinned: other messages are dead letters
    rows = decode(DecodeSpec.from_json(spec.to_json()), [*orders, *pings])
    assert [(r["id"], r["amount"], r["_error"]) for r in rows[:3]] == [
        (i, i / 2, None) for i in range(3)
    ]
    assert "carries message tr.Ping" in rows[3]["_error"]
    assert "set decoding.value.message to tr.Ping" in rows[3]["_error"]


def test_the_default_message_rule() -> None:
    def default(text: str) -> str:
        proto = file_proto(text)
        return default_message(protobuf_file(_b64(proto))).full_name

    assert default(HELPER_FIRST) == "hf.Person"
    assert default(TWO_ROOTS) == "tr.Ping"
    mutual = """name: "m.proto" package: "m" syntax: "proto3"
      message_type { name: "A" field { name: "b" number: 1 type: TYPE_MESSAGE type_name: ".m.B"
        label: LABEL_OPTIONAL } }
      message_type { name: "B" field { name: "a" number: 1 type: TYPE_MESSAGE type_name: ".m.A"
        label: LABEL_OPTIONAL } }"""
    assert default(mutual) == "m.A"  # used by each other: the first


def _b64(proto: descriptor_pb2.FileDescriptorProto) -> str:
    import base64

    return base64.b64encode(proto.SerializeToString()).decode()


# -- references ----------------------------------------------------------------------------

COMMON = """
name: "shop/common.proto" package: "shop.common" syntax: "proto3"
message_type { name: "Money"
  field { name: "units" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL }
  field { name: "currency" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL } }
enum_type { name: "Channel" value { name: "WEB" number: 0 } value { name: "APP" number: 1 } }
"""
MIDDLE = """
name: "shop/line.proto" package: "shop.line" syntax: "proto3"
dependency: "shop/common.proto"
message_type { name: "Line"
  field { name: "sku" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "price" number: 2 type: TYPE_MESSAGE type_name: ".shop.common.Money"
          label: LABEL_OPTIONAL } }
"""
ORDER = """
name: "shop/order.proto" package: "shop" syntax: "proto3"
dependency: "shop/line.proto" dependency: "shop/common.proto"
dependency: "google/protobuf/timestamp.proto"
message_type { name: "Order"
  field { name: "id" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL }
  field { name: "lines" number: 2 type: TYPE_MESSAGE type_name: ".shop.line.Line"
          label: LABEL_REPEATED }
  field { name: "channel" number: 3 type: TYPE_ENUM type_name: ".shop.common.Channel"
          label: LABEL_OPTIONAL }
  field { name: "at" number: 4 type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp"
          label: LABEL_OPTIONAL } }
"""


def test_imports_resolve_through_the_registrys_references(schema_registry) -> None:
    pool = message_classes(file_proto(COMMON), file_proto(MIDDLE), file_proto(ORDER))
    order = message_class(pool, "shop.Order")
    line, money = message_class(pool, "shop.line.Line"), message_class(pool, "shop.common.Money")
    topic = topic_name()
    m = order(id=5, lines=[line(sku="x", price=money(units=3, currency="EUR"))], channel=1)
    m.at.FromDatetime(datetime(2026, 1, 1, 0, 0, 5))
    values = serialize(schema_registry.url, topic, [m, order(id=6)])

    # The serializer registered each imported file as its own subject, named by the file.
    client = SchemaRegistryClient({"url": schema_registry.url})
    latest = client.get_latest_version(f"{topic}-value")
    assert {r.name for r in latest.schema.references} == {"shop/line.proto", "shop/common.proto"}

    spec = registry_spec(schema_registry.url, topic)
    rows = decode(spec, values)
    assert rows[0]["_error"] is None, rows[0]["_error"]
    assert rows[0]["lines"] == [{"sku": "x", "price": {"units": 3, "currency": "EUR"}}]
    assert (rows[0]["channel"], rows[0]["at"]) == ("APP", T0 + timedelta(seconds=5))
    assert (rows[1]["id"], rows[1]["lines"], rows[1]["channel"], rows[1]["at"]) == (
        6,
        [],
        "WEB",
        None,
    )


# -- the type mapping ----------------------------------------------------------------------

TYPES = """
name: "types.proto" package: "ty" syntax: "proto3"
dependency: "google/protobuf/timestamp.proto" dependency: "google/protobuf/duration.proto"
dependency: "google/protobuf/wrappers.proto" dependency: "google/protobuf/struct.proto"
dependency: "google/protobuf/any.proto" dependency: "google/protobuf/empty.proto"
message_type { name: "All"
  field { name: "i32" number: 1 type: TYPE_SINT32 label: LABEL_OPTIONAL }
  field { name: "u32" number: 2 type: TYPE_FIXED32 label: LABEL_OPTIONAL }
  field { name: "u64" number: 3 type: TYPE_UINT64 label: LABEL_OPTIONAL }
  field { name: "f" number: 4 type: TYPE_FLOAT label: LABEL_OPTIONAL }
  field { name: "raw" number: 5 type: TYPE_BYTES label: LABEL_OPTIONAL }
  field { name: "kind" number: 6 type: TYPE_ENUM type_name: ".ty.Kind" label: LABEL_OPTIONAL }
  field { name: "maybe" number: 7 type: TYPE_INT32 label: LABEL_OPTIONAL oneof_index: 1
          proto3_optional: true }
  field { name: "text" number: 8 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 0 }
  field { name: "count" number: 9 type: TYPE_INT64 label: LABEL_OPTIONAL oneof_index: 0 }
  field { name: "tags" number: 10 type: TYPE_STRING label: LABEL_REPEATED }
  field { name: "scores" number: 11 type: TYPE_MESSAGE type_name: ".ty.All.ScoresEntry"
          label: LABEL_REPEATED }
  field { name: "by_id" number: 12 type: TYPE_MESSAGE type_name: ".ty.All.ByIdEntry"
          label: LABEL_REPEATED }
  field { name: "at" number: 13 type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp"
          label: LABEL_OPTIONAL }
  field { name: "took" number: 14 type: TYPE_MESSAGE type_name: ".google.protobuf.Duration"
          label: LABEL_OPTIONAL }
  field { name: "w_int" number: 15 type: TYPE_MESSAGE type_name: ".google.protobuf.Int32Value"
          label: LABEL_OPTIONAL }
  field { name: "w_u64" number: 16 type: TYPE_MESSAGE type_name: ".google.protobuf.UInt64Value"
          label: LABEL_OPTIONAL }
  field { name: "w_str" number: 17 type: TYPE_MESSAGE type_name: ".google.protobuf.StringValue"
          label: LABEL_OPTIONAL }
  field { name: "w_bytes" number: 18 type: TYPE_MESSAGE
          type_name: ".google.protobuf.BytesValue" label: LABEL_OPTIONAL }
  field { name: "doc" number: 19 type: TYPE_MESSAGE type_name: ".google.protobuf.Struct"
          label: LABEL_OPTIONAL }
  field { name: "val" number: 20 type: TYPE_MESSAGE type_name: ".google.protobuf.Value"
          label: LABEL_OPTIONAL }
  field { name: "items" number: 21 type: TYPE_MESSAGE type_name: ".google.protobuf.ListValue"
          label: LABEL_OPTIONAL }
  field { name: "any" number: 22 type: TYPE_MESSAGE type_name: ".google.protobuf.Any"
          label: LABEL_OPTIONAL }
  field { name: "nothing" number: 23 type: TYPE_MESSAGE type_name: ".google.protobuf.Empty"
          label: LABEL_OPTIONAL }
  field { name: "stamps" number: 24 type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp"
          label: LABEL_REPEATED }
  field { name: "tree" number: 25 type: TYPE_MESSAGE type_name: ".ty.Node" label: LABEL_OPTIONAL }
  field { name: "w_many" number: 26 type: TYPE_MESSAGE
          type_name: ".google.protobuf.DoubleValue" label: LABEL_REPEATED }
  nested_type { name: "ScoresEntry" options { map_entry: true }
    field { name: "key" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
    field { name: "value" number: 2 type: TYPE_DOUBLE label: LABEL_OPTIONAL } }
  nested_type { name: "ByIdEntry" options { map_entry: true }
    field { name: "key" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL }
    field { name: "value" number: 2 type: TYPE_MESSAGE type_name: ".ty.Node"
            label: LABEL_OPTIONAL } }
  oneof_decl { name: "choice" } oneof_decl { name: "_maybe" } }
message_type { name: "Node"
  field { name: "label" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "children" number: 2 type: TYPE_MESSAGE type_name: ".ty.Node"
          label: LABEL_REPEATED }
  field { name: "when" number: 3 type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp"
          label: LABEL_OPTIONAL } }
enum_type { name: "Kind" value { name: "NONE" number: 0 } value { name: "BIG" number: 5 } }
"""


def test_each_protobuf_type_lands_as_its_documented_column(schema_registry) -> None:
    from google.protobuf import timestamp_pb2

    pool = message_classes(file_proto(TYPES))
    full = message_class(pool, "ty.All")
    topic = topic_name()
    m = full(i32=-3, u32=4_000_000_000, u64=2**64 - 1, f=1.5, raw=b"\x00\xff", kind=5)
    m.text = "t"
    m.tags.extend(["a", "b"])
    m.scores["x"] = 0.25
    m.by_id[7].label = "seven"
    m.by_id[7].children.add(label="leaf")
    m.at.FromDatetime(datetime(2026, 1, 1, 0, 0, 1, 2))
    m.at.nanos += 999  # below a microsecond: dropped
    m.took.seconds, m.took.nanos = -2, -500_999
    m.w_int.value = 0  # set to its default: 0, not null
    m.w_u64.value = 2**64 - 2
    m.w_str.value = "wrapped"
    m.w_bytes.value = b"b"
    m.doc.update({"k": [1, "two", None, {"n": True}]})
    m.val.string_value = "v"
    m.items.extend([1, "x"])
    m.any.Pack(timestamp_pb2.Timestamp(seconds=1))
    m.nothing.SetInParent()
    m.stamps.add(seconds=60)
    m.tree.label = "root"
    m.tree.children.add(label="kid").children.add(label="grandkid")
    m.w_many.add(value=2.5)
    unknown_any = full(count=9, kind=3)  # oneof's other member; an enum number unknown
    unknown_any.any.type_url, unknown_any.any.value = "type.example.com/x.Y", b"\x08\x01"
    values = serialize(schema_registry.url, topic, [m, unknown_any, full()])

    spec = registry_spec(schema_registry.url, topic)
    reader = spec.value.reader
    node_struct = pa.struct(
        [("label", pa.string()), ("children", pa.list_(pa.string())), ("when", TIMESTAMP)]
    )
    assert {f.name: f.type for f in reader} == {
        "i32": pa.int32(),
        "u32": pa.int64(),
        "u64": pa.decimal128(20, 0),
        "f": pa.float32(),
        "raw": pa.binary(),
        "kind": pa.string(),
        "maybe": pa.int32(),
        "text": pa.string(),
        "count": pa.int64(),
        "tags": pa.list_(pa.string()),
        "scores": pa.map_(pa.string(), pa.float64()),
        "by_id": pa.map_(pa.int64(), node_struct),
        "at": TIMESTAMP,
        "took": pa.int64(),
        "w_int": pa.int32(),
        "w_u64": pa.decimal128(20, 0),
        "w_str": pa.string(),
        "w_bytes": pa.binary(),
        "doc": pa.string(),
        "val": pa.string(),
        "items": pa.string(),
        "any": pa.string(),
        "nothing": pa.bool_(),
        "stamps": pa.list_(TIMESTAMP),
        "tree": node_struct,
        "w_many": pa.list_(pa.float64()),
    }
    one, two, empty = decode(spec, values)
    assert (one["_error"], two["_error"], empty["_error"]) == (None, None, None)
    assert (one["i32"], one["u32"], one["u64"], one["f"], one["raw"]) == (
        -3,
        4_000_000_000,
        Decimal(2**64 - 1),
        1.5,
        b"\x00\xff",
    )
    assert (one["kind"], two["kind"], empty["kind"]) == ("BIG", "3", "NONE")
    assert (one["maybe"], empty["maybe"]) == (None, None)  # proto3 optional, unset
    assert (one["text"], one["count"], two["text"], two["count"]) == ("t", None, None, 9)
    assert (one["tags"], one["scores"]) == (["a", "b"], [("x", 0.25)])
    # A message that contains itself: the field that recurses is JSON (proto field names).
    assert one["by_id"] == [(7, {"label": "seven", "children": ['{"label":"leaf"}'], "when": None})]
    assert one["at"] == T0 + timedelta(seconds=1, microseconds=2)
    assert one["took"] == -2_000_500  # microseconds, truncated toward zero
    assert (one["w_int"], one["w_u64"], one["w_str"], one["w_bytes"]) == (
        0,
        Decimal(2**64 - 2),
        "wrapped",
        b"b",
    )
    assert (empty["w_int"], empty["w_str"], empty["took"], empty["at"]) == (None,) * 4
    assert json.loads(one["doc"]) == {"k": [1, "two", None, {"n": True}]}
    assert (json.loads(one["val"]), json.loads(one["items"])) == ("v", [1, "x"])
    assert json.loads(one["any"]) == {
        "@type": "type.googleapis.com/google.protobuf.Timestamp",
        "value": "1970-01-01T00:00:01Z",
    }
    assert json.loads(two["any"]) == {"@type": "type.example.com/x.Y", "value": "CAE="}
    assert (one["nothing"], empty["nothing"], empty["doc"], empty["any"]) == (
        True,
        None,
        None,
        None,
    )
    assert one["stamps"] == [datetime(1970, 1, 1, 0, 1, tzinfo=UTC)]
    assert one["tree"] == {
        "label": "root",
        "children": ['{"label":"kid","children":[{"label":"grandkid"}]}'],
        "when": None,
    }
    assert (one["w_many"], empty["tags"], empty["scores"], empty["tree"]) == ([2.5], [], [], None)


def test_the_common_path_stays_inline_and_fast(schema_registry) -> None:
    # One message, index [0], scalar fields: the decoder's inline path (no frame parse, plain
    # attribute reads). Guards against a per-record cost creeping into it.
    import time

    text = """name: "fast.proto" package: "fast" syntax: "proto3"
      message_type { name: "E"
        field { name: "id" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL }
        field { name: "name" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL }
        field { name: "x" number: 3 type: TYPE_DOUBLE label: LABEL_OPTIONAL }
        field { name: "n" number: 4 type: TYPE_INT32 label: LABEL_OPTIONAL proto3_optional: true
                oneof_index: 0 }
        oneof_decl { name: "_n" } }"""
    e = message_class(message_classes(file_proto(text)), "fast.E")
    topic = topic_name()
    values = serialize(
        schema_registry.url, topic, [e(id=i, name=f"n{i}", x=i / 2, n=i) for i in range(20_000)]
    )
    decoder = Decoder(registry_spec(schema_registry.url, topic))
    batch = kafka_batch(values)
    decoder.decode(batch)  # the writer, once
    start = time.perf_counter()
    out = decoder.decode(batch)
    took = time.perf_counter() - start
    assert out.column("_error").null_count == 20_000
    assert out.column("n").to_pylist()[:3] == [0, 1, 2]
    assert took < 1.0, f"20,000 records took {took:.2f} s"


# -- end to end ----------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.broker
def test_the_issues_second_message_lands_through_the_pipeline(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, sink_engine
) -> None:
    from deltalake import DeltaTable

    from kafka_delta.pipeline import Pipeline
    from kafka_delta_dev.produce import produce_values

    pool = message_classes(file_proto(HELPER_FIRST))
    person, address = message_class(pool, "hf.Person"), message_class(pool, "hf.Address")
    (topic,) = new_topics(1, partitions=2)
    values = serialize(
        schema_registry.url, topic, [person(id=i, home=address(city=f"c{i}")) for i in range(20)]
    )
    produce_values(kafka_bootstrap, topic, [(i % 2, v) for i, v in enumerate(values)])
    cfg = make_config([topic], engine=sink_engine, transform=None).with_overrides(
        decoding={"value": {"format": "protobuf"}, "schema_registry": {"url": schema_registry.url}}
    )

    Pipeline(spark, cfg).run()

    rows = DeltaTable(cfg.delta.table).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["home"]["city"]) for r in rows) == [(i, f"c{i}") for i in range(20)]


@pytest.mark.spark
@pytest.mark.broker
def test_a_topic_of_the_files_second_message_lands_and_another_message_is_a_dead_letter(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, sink_engine
) -> None:
    """The probes' case: a file of independent messages (Ping first), a topic of Order only,
    no `message:`. The frames say Order: the table takes Order's columns. Pings produced later
    beside more Orders, in every partition, are dead letters naming the `message:` that would
    take them: the next run reads the table's message from its columns. Never a stop."""
    from deltalake import DeltaTable

    from kafka_delta.pipeline import Pipeline
    from kafka_delta_dev.produce import produce_values

    pool = message_classes(file_proto(TWO_ROOTS))
    order, ping = message_class(pool, "tr.Order"), message_class(pool, "tr.Ping")
    (topic,) = new_topics(1, partitions=2)
    orders = serialize(schema_registry.url, topic, [order(id=i, amount=i / 2) for i in range(20)])
    produce_values(kafka_bootstrap, topic, [(i % 2, v) for i, v in enumerate(orders)])
    cfg = make_config([topic], engine=sink_engine, transform=None).with_overrides(
        decoding={"value": {"format": "protobuf"}, "schema_registry": {"url": schema_registry.url}}
    )

    Pipeline(spark, cfg).run()

    table = DeltaTable(cfg.delta.table).to_pyarrow_table()
    assert "seq" not in table.column_names
    assert sorted((r["id"], r["amount"]) for r in table.to_pylist()) == [
        (i, i / 2) for i in range(20)
    ]

    pings = serialize(schema_registry.url, topic, [ping(seq=i) for i in range(2)])
    more = serialize(schema_registry.url, topic, [order(id=i, amount=1.0) for i in range(20, 22)])
    produce_values(
        kafka_bootstrap, topic, [(0, pings[0]), (0, more[0]), (1, pings[1]), (1, more[1])]
    )
    Pipeline(spark, cfg).run()

    ids = sorted(r["id"] for r in DeltaTable(cfg.delta.table).to_pyarrow_table().to_pylist())
    assert ids == list(range(22))
    assert cfg.dead_letter_table is not None
    letters = DeltaTable(cfg.dead_letter_table).to_pyarrow_table().to_pylist()
    assert sorted(r["value"] for r in letters) == sorted(pings)
    assert all("set decoding.value.message to tr.Ping" in r["error"] for r in letters), letters
