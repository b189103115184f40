"""JSON Schema in Confluent's framing (``decoding.value.format: json_schema``): records made by
confluent-kafka's own ``JSONSerializer`` (magic byte 0 + schema id + JSON text, or the id in a
header), the columns from the registry subject's JSON Schema versions. The mapping of JSON
Schema to columns, the decoder against the real development registry, and one pipeline end to
end on a real broker and Delta table."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient, header_schema_id_serializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from kafka_delta.config import FormatConfig
from kafka_delta.decoding.json_decoder import JsonDecoder
from kafka_delta.decoding.json_types import json_schema_to_arrow
from kafka_delta.decoding.schema_registry import Registry
from kafka_delta.decoding.spec import (
    FieldSpec,
    RegistrySettings,
    SchemaChangedError,
    SchemaFileError,
)
from kafka_delta.pipeline import Pipeline
from kafka_delta_dev.produce import produce_values
from support import assert_exactly_once

TS = pa.timestamp("us", tz="UTC")

# What a Confluent estate's JSON Schema looks like: $defs and $ref, nullable unions, formats.
ORDER_V1: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "event_time": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "amount": {"oneOf": [{"type": "null"}, {"type": "number"}]},
        "customer": {"$ref": "#/$defs/Customer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "lines": {"type": "array", "items": {"$ref": "#/definitions/Line"}},
        "note": {"type": ["string", "null"]},
    },
    "required": ["id"],
    "$defs": {
        "Customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "since": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
            },
        }
    },
    "definitions": {
        "Line": {
            "type": "object",
            "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
        }
    },
}
# v2: a producer added an optional field
ORDER_V2 = {
    **ORDER_V1,
    "properties": {**ORDER_V1["properties"], "channel": {"type": ["string", "null"]}},
}
EXPECTED = pa.schema(
    [
        ("id", pa.int64()),
        ("event_time", TS),
        ("day", pa.date32()),
        ("amount", pa.float64()),
        ("customer", pa.struct([("name", pa.string()), ("since", pa.date32())])),
        ("tags", pa.list_(pa.string())),
        ("lines", pa.list_(pa.struct([("sku", pa.string()), ("qty", pa.int64())]))),
        ("note", pa.string()),
    ]
)


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": i,
        "event_time": f"2026-01-01T00:00:{i % 60:02d}Z",
        "day": f"2026-02-{i % 28 + 1:02d}",
        "amount": None if i % 3 == 0 else i + 0.5,
        "customer": {"name": f"c{i}", "since": "2020-05-06" if i % 2 else None},
        "tags": ["a", str(i)],
        "lines": [{"sku": "x", "qty": i}],
        "note": None,
        **extra,
    }


def serialize(
    url: str, topic: str, schema: dict[str, Any], records: list[dict], **conf: Any
) -> list[tuple[bytes, list]]:
    """(value, headers) made by confluent-kafka's JSONSerializer, auto-registering."""
    serializer = JSONSerializer(
        json.dumps(schema), SchemaRegistryClient({"url": url}), conf=conf or None
    )
    out = []
    for record in records:
        context = SerializationContext(topic, MessageField.VALUE, [])
        value = serializer(record, context)
        headers = [{"key": k, "value": v} for k, v in (context.headers or [])]
        out.append((value, headers))
    return out


def decoder(url: str, reader: pa.Schema, required: tuple[str, ...] = ()) -> JsonDecoder:
    field = FieldSpec(format="json_schema", framing="confluent", reader=reader, required=required)
    return JsonDecoder(field, "value", Registry(RegistrySettings(url=url)))


# --- the mapping --------------------------------------------------------------------------


def test_json_schema_maps_refs_nullable_unions_formats_nested_objects_and_arrays() -> None:
    schema, required = json_schema_to_arrow(json.dumps(ORDER_V1))
    assert schema == EXPECTED
    assert required == ["id"]
    # a $ref'd root, allOf of one schema, and a string enum without a type
    root = {
        "$ref": "#/definitions/Root",
        "definitions": {
            "Root": {
                "properties": {
                    "kind": {"enum": ["a", "b"]},
                    "when": {"allOf": [{"type": "string", "format": "date-time"}]},
                }
            }
        },
    }
    assert json_schema_to_arrow(root)[0] == pa.schema([("kind", pa.string()), ("when", TS)])


@pytest.mark.parametrize(
    ("prop", "reason"),
    [
        ({"type": ["string", "integer"]}, "does not map to one column type"),
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "2 schemas besides null"),
        ({"$ref": "other.json#/Thing"}, "outside the document"),
        ({"$ref": "#/$defs/Missing"}, "points to nothing"),
        ({"$ref": "#/$defs/Node"}, "recursive"),
        ({"type": "object"}, "without properties"),
    ],
)
def test_what_has_no_column_type_is_refused_naming_the_property(prop: dict, reason: str) -> None:
    doc = {
        "type": "object",
        "properties": {"bad": prop},
        "$defs": {
            "Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}},
        },
    }
    with pytest.raises(SchemaFileError, match=reason) as refused:
        json_schema_to_arrow(doc)
    assert "/bad" in str(refused.value)


def test_the_config_spells_it_json_schema_and_keeps_json_with_a_schema_file() -> None:
    assert FormatConfig(format="json_schema").effective_framing == "confluent"
    # the existing spellings keep working
    assert FormatConfig(format="json", schema_file="s.json").effective_framing == "none"
    assert FormatConfig(format="json").effective_framing == "confluent"
    with pytest.raises(ValueError, match="format json_schema reads its schema"):
        FormatConfig(format="json_schema", schema_file="s.json")


# --- the decoder, against the development registry ------------------------------------------


def test_serializer_records_decode_typed_with_the_id_inline_or_in_a_header(schema_registry):
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    inline = serialize(schema_registry.url, topic, ORDER_V1, [order(1), order(2)])
    headed = serialize(
        schema_registry.url,
        topic,
        ORDER_V1,
        [order(3)],
        **{"schema.id.serializer": header_schema_id_serializer},
    )
    assert inline[0][0][0] == 0 and headed[0][0][:1] == b"{"  # the header carries the GUID
    records = inline + headed
    table, errors = decoder(schema_registry.url, EXPECTED, ("id",)).decode(
        [v for v, _ in records], [h for _, h in records]
    )
    assert errors == [None, None, None]
    rows = table.to_pylist()
    assert rows[0]["event_time"] == datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert rows[1]["day"] == date(2026, 2, 3)
    assert rows[1]["amount"] == 2.5 and rows[0]["amount"] == 1.5
    assert rows[0]["customer"] == {"name": "c1", "since": date(2020, 5, 6)}
    assert rows[1]["customer"] == {"name": "c2", "since": None}
    assert rows[2]["lines"] == [{"sku": "x", "qty": 3}] and rows[2]["tags"] == ["a", "3"]


def test_bad_records_are_dead_letters_each_with_its_reason(schema_registry) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    good = serialize(schema_registry.url, topic, ORDER_V1, [order(1)])[0][0]
    frame = good[:5]
    values = [
        good,
        b'{"id": 2}',  # not framed
        b"\x00\x00\x0f\x42\x3f" + b'{"id": 3}',  # an id the registry does not have
        frame + b'{"id": 4, "day": "2026-13-40"}',  # not a date
        frame + b'{"day": "2026-01-01"}',  # the required id missing
        frame + b'{"id": "five"}',  # wrong type
        None,
    ]
    _, errors = decoder(schema_registry.url, EXPECTED, ("id",)).decode(values, [None] * 7)
    assert errors[0] is None
    assert "magic byte 0x7b" in errors[1]
    assert "unknown schema id 999999" in errors[2]
    assert "2026-13-40" in errors[3]
    assert "required field 'id'" in errors[4]
    assert "malformed JSON, or a field of the wrong type" in errors[5]
    assert errors[6] == "value is null"


def test_a_record_without_its_writer_schemas_required_field_is_a_dead_letter(
    schema_registry,
) -> None:
    """The serializer does not validate (Java's does not by default): a record without a
    field its schema requires, or with null where the field's type takes no null, is a dead
    letter naming the field; null in a required field whose type takes null lands. Each
    record is held to the required fields of the schema it was written with."""
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    v1 = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "note": {"type": ["string", "null"]}},
        "required": ["id", "note"],
    }
    v2 = {**v1, "required": ["id"]}  # note no longer required
    records = serialize(
        schema_registry.url,
        topic,
        v1,
        [
            {"id": 1, "note": "a"},
            {"note": "b"},
            {"id": None, "note": "c"},
            {"id": 2, "note": None},
            {"id": 3},
        ],
        validate=False,
    )
    records += serialize(schema_registry.url, topic, v2, [{"id": 4}, {"note": "d"}], validate=False)
    reader = json_schema_to_arrow(v1)[0]

    table, errors = decoder(schema_registry.url, reader).decode(
        [v for v, _ in records], [h for _, h in records]
    )

    assert [errors[i] for i in (0, 3, 5)] == [None, None, None]
    assert "required field 'id'" in errors[1] and "missing" in errors[1], errors[1]
    assert "required field 'id'" in errors[2] and "is null" in errors[2], errors[2]
    assert "required field 'note'" in errors[4] and "missing" in errors[4], errors[4]
    assert "required field 'id'" in errors[6] and "missing" in errors[6], errors[6]
    v1_id = int.from_bytes(records[0][0][1:5], "big")
    assert f"of schema {v1_id}" in errors[1]
    rows = table.to_pylist()
    assert [(rows[i]["id"], rows[i]["note"]) for i in (0, 3, 5)] == [(1, "a"), (2, None), (4, None)]


def test_a_writer_version_with_a_field_the_reader_lacks_stops_for_a_restart(
    schema_registry,
) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    serialize(schema_registry.url, topic, ORDER_V1, [order(1)])
    newer = serialize(schema_registry.url, topic, ORDER_V2, [order(2, channel="web")])
    with pytest.raises(SchemaChangedError) as changed:
        decoder(schema_registry.url, EXPECTED).decode([newer[0][0]], [None])
    assert changed.value.fields == ("channel",)


# --- end to end -----------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.broker
def test_json_schema_records_land_typed_exactly_once_and_a_new_version_adds_its_column(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, sink_engine
) -> None:
    (topic,) = new_topics(1, partitions=2)
    cfg = make_config([topic], engine=sink_engine).with_overrides(
        decoding={
            "value": {"format": "json_schema"},
            "schema_registry": {"url": schema_registry.url},
        }
    )
    v1 = serialize(schema_registry.url, topic, ORDER_V1, [order(i) for i in range(20)])
    produce_values(kafka_bootstrap, topic, [(i % 2, v) for i, (v, _) in enumerate(v1)])
    Pipeline(spark, cfg).run()
    table = DeltaTable(cfg.delta.table).to_pyarrow_table()
    assert "channel" not in table.column_names
    assert table.schema.field("customer").type == EXPECTED.field("customer").type

    v2 = serialize(
        schema_registry.url, topic, ORDER_V2, [order(i, channel="web") for i in range(20, 30)]
    )
    produce_values(kafka_bootstrap, topic, [(i % 2, v) for i, (v, _) in enumerate(v2)])
    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 30)
    rows = {r["id"]: r for r in DeltaTable(cfg.delta.table).to_pyarrow_table().to_pylist()}
    assert {rows[i]["channel"] for i in range(20)} == {None}
    assert {rows[i]["channel"] for i in range(20, 30)} == {"web"}
    assert rows[7]["event_time"] == datetime(2026, 1, 1, 0, 0, 7, tzinfo=UTC)
    assert rows[7]["day"] == date(2026, 2, 8)
    assert rows[7]["customer"] == {"name": "c7", "since": date(2020, 5, 6)}
    assert rows[25]["lines"] == [{"sku": "x", "qty": 25}]
