"""The decoder on its own (no Spark, no broker): framing, each format, the reasons records
become dead letters, schema versions, and the registry client's caching. End to end through
the pipeline: test_formats.py."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_delta.contract import KAFKA_ARROW_SCHEMA as ARROW_SCHEMA
from kafka_delta.decoding.avro_types import avro_to_arrow
from kafka_delta.decoding.decoder import Decoder
from kafka_delta.decoding.schema_registry import Registry, client_config
from kafka_delta.decoding.spec import (
    DecodeSpec,
    FieldSpec,
    RegistrySettings,
    RegistryUnavailableError,
    SchemaChangedError,
    SchemaFileError,
)
from kafka_delta.decoding.versions import TIMESTAMP, union_schemas
from kafka_delta.decoding.wire_format import Frame, parse
from kafka_delta_dev.produce import (
    order_event_avro,
    order_event_descriptor_set,
    order_event_message,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ORDER = pa.schema(
    [
        ("id", pa.int64()),
        ("event_type", pa.string()),
        ("amount", pa.float64()),
        ("event_time", TIMESTAMP),
    ]
)


def kafka(values: list[bytes | None], headers: list | None = None) -> pa.RecordBatch:
    n = len(values)
    header_type = ARROW_SCHEMA.field("headers").type
    return pa.RecordBatch.from_arrays(
        [
            pa.array([b"k"] * n),
            pa.array(values, pa.binary()),
            pa.array(["orders"] * n),
            pa.array([0] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([T0] * n, TIMESTAMP),
            pa.array([0] * n, pa.int32()),
            pa.array(headers, header_type) if headers else pa.nulls(n, header_type),
        ],
        schema=ARROW_SCHEMA,
    )


def decode(spec: DecodeSpec, values: list[bytes | None], **kw) -> list[dict]:
    # Through JSON, as the read tasks receive the spec.
    return Decoder(DecodeSpec.from_json(spec.to_json())).decode(kafka(values, **kw)).to_pylist()


# -- framing -------------------------------------------------------------------------------


def test_confluent_framing_reads_the_id_and_protobufs_message_indexes() -> None:
    assert parse(b"\x00\x00\x00\x00\x07rest", None, protobuf=False) == Frame(7, 5)
    assert parse(b"\x00\x00\x00\x00\x07\x00rest", None, protobuf=True) == Frame(7, 6, (0,))
    # Two indexes [1, 2]: count 2 then 1 and 2, zigzag-encoded (4, 2, 4).
    assert parse(b"\x00\x00\x00\x00\x07\x04\x02\x04rest", None, protobuf=True) == Frame(
        7, 8, (1, 2)
    )
    assert "wrong magic byte 0x7b" in str(parse(b'{"id": 1}', None, protobuf=False))
    assert "truncated" in str(parse(b"\x00\x00\x01", None, protobuf=False))
    guid = bytes(range(16))
    frame = parse(b"payload", b"\x01" + guid, protobuf=False)
    assert isinstance(frame, Frame) and frame.start == 0 and len(str(frame.schema)) == 36


# -- JSON ----------------------------------------------------------------------------------


def test_json_bad_lines_in_a_block_are_found_exactly_and_the_rest_stays_aligned() -> None:
    spec = DecodeSpec(FieldSpec("json", "none", ORDER, required=("id",)))
    good = [
        json.dumps(
            {"id": i, "event_type": "a", "amount": 1.5, "event_time": f"2026-01-01T00:00:{i:02d}Z"}
        ).encode()
        for i in range(20)
    ]
    values = [
        *good[:7],
        b"{not json",
        b'{"id": "seven"}',
        b'{"amount": 2}',
        None,
        b"",
        b"[1]",
        b"{}{}",
        *good[7:],
    ]
    rows = decode(spec, values)

    assert [r["id"] for r in rows if r["_error"] is None] == list(range(20))
    errors = {r["offset"]: r["_error"] for r in rows if r["_error"]}
    assert sorted(errors) == list(range(7, 14))
    assert errors[7].startswith("malformed JSON")
    assert "id" in errors[8]
    assert errors[9] == "required field 'id' is missing"
    assert errors[10] == "value is null" and errors[11] == "value is empty"
    assert errors[12] == "not a JSON object"
    # The original bytes ride along only on the rows that failed.
    assert [r["_raw_value"] for r in rows if r["_error"]] == values[7:14]
    assert all(r["_raw_value"] is None for r in rows if r["_error"] is None)
    assert rows[3]["event_time"] == T0 + timedelta(seconds=3)


def test_a_newline_inside_a_json_value_is_whitespace() -> None:
    spec = DecodeSpec(FieldSpec("json", "none", ORDER))
    rows = decode(spec, [b'{"id": 1,\n "amount":\r\n 2.5}', b'{"id": 2}'])
    assert [(r["id"], r["amount"], r["_error"]) for r in rows] == [(1, 2.5, None), (2, None, None)]


# -- Avro ----------------------------------------------------------------------------------


def test_unframed_avro_with_a_schema_file_decodes_and_flags_truncated_records() -> None:
    from fastavro import parse_schema, schemaless_writer

    schema = order_event_avro(1)
    values = []
    for i in range(3):
        out = io.BytesIO()
        schemaless_writer(
            out, parse_schema(schema), {"id": i, "event_type": "a", "amount": 1.0, "event_time": T0}
        )
        values.append(out.getvalue())
    spec = DecodeSpec(
        FieldSpec("avro", "none", avro_to_arrow(schema), writer_schema=json.dumps(schema))
    )

    rows = decode(spec, [*values, values[0][:-3]])

    assert [r["id"] for r in rows[:3]] == [0, 1, 2]
    assert rows[2]["event_time"] == T0
    assert rows[3]["_error"].startswith("truncated record")


def test_avro_writer_versions_new_fields_and_type_changes(schema_registry) -> None:
    client = SchemaRegistryClient({"url": schema_registry.url})
    context = SerializationContext("decoding-avro", MessageField.VALUE)
    v1, v2 = order_event_avro(1), order_event_avro(2)
    one = AvroSerializer(client, json.dumps(v1))(
        {"id": 1, "event_type": "a", "amount": 1.0, "event_time": T0}, context
    )
    two = AvroSerializer(client, json.dumps(v2))(
        {"id": 2, "event_type": "b", "amount": 2.0, "event_time": T0, "channel": "web"}, context
    )
    registry = RegistrySettings(schema_registry.url)
    wide = union_schemas([avro_to_arrow(v1), avro_to_arrow(v2)])

    rows = decode(DecodeSpec(FieldSpec("avro", "confluent", wide), registry=registry), [one, two])
    assert [(r["id"], r["channel"]) for r in rows] == [(1, None), (2, "web")]

    # A reader made before v2: the first v2 record stops the batch, naming the new field.
    narrow = DecodeSpec(FieldSpec("avro", "confluent", avro_to_arrow(v1)), registry=registry)
    with pytest.raises(SchemaChangedError, match=r"field\(s\) channel"):
        decode(narrow, [one, two])

    # A reader whose `amount` is text: no rule puts the writer's double there. Its records are
    # dead letters naming the schema id, the field and both types; the batch goes on.
    text = pa.schema([pa.field("amount", pa.string()) if f.name == "amount" else f for f in wide])
    (row,) = decode(DecodeSpec(FieldSpec("avro", "confluent", text), registry=registry), [one])
    assert row["id"] is None
    assert "schema id" in row["_error"] and "'amount' is double" in row["_error"], row["_error"]
    assert "string" in row["_error"]


def test_versions_union_adds_fields_keeps_the_first_type_and_takes_removed_fields() -> None:
    v1 = avro_to_arrow(order_event_avro(1))
    v2 = avro_to_arrow(order_event_avro(2))
    assert union_schemas([v1, v2]).names == [*v1.names, "channel"]
    # A change no rule covers keeps the column's first type (its records become dead letters).
    retyped = pa.schema([pa.field("id", pa.string(), nullable=False)])
    assert union_schemas([v1, retyped]).field("id").type == pa.int64()
    # A required field removed (or renamed) reads null in the new records: never a stop.
    renamed = pa.schema([pa.field("order_id", pa.int64(), nullable=False)])
    both = union_schemas([v1, renamed])
    assert both.field("id").nullable and both.field("order_id").nullable


# -- Protobuf ------------------------------------------------------------------------------


def test_protobuf_from_a_descriptor_set_file_without_framing() -> None:
    from kafka_delta.decoding.protobuf_types import protobuf_to_arrow

    descriptor_set = order_event_descriptor_set(1)
    message = order_event_message(1)
    reader = protobuf_to_arrow(descriptor_set, message.DESCRIPTOR.full_name)
    m = message(id=9, event_type="paid", amount=3.5)
    m.event_time.FromDatetime(datetime(2026, 1, 1, 0, 0, 9))
    import base64

    spec = DecodeSpec(
        FieldSpec(
            "protobuf",
            "none",
            reader,
            writer_schema=base64.b64encode(descriptor_set).decode(),
            message=message.DESCRIPTOR.full_name,
        )
    )
    rows = decode(spec, [m.SerializeToString(), b"\xff\xff"])
    assert (rows[0]["id"], rows[0]["event_type"], rows[0]["amount"]) == (9, "paid", 3.5)
    assert rows[0]["event_time"] == T0 + timedelta(seconds=9)
    assert rows[1]["_error"].startswith("bytes do not match")


def test_a_value_field_named_like_a_kafka_column_lands_as_value_name_beside_it() -> None:
    """Kafka's columns keep their names; a value's `timestamp`, `key`, `offset` or `_error`
    arrive as `value_timestamp`, `value_key`, ... (the rule of the name alone)."""
    clash = pa.schema(
        [
            ("id", pa.int64()),
            ("timestamp", pa.string()),
            ("key", pa.string()),
            ("offset", pa.int64()),
            ("_error", pa.string()),
        ]
    )
    spec = DecodeSpec(FieldSpec("json", "none", clash))
    value = b'{"id": 1, "timestamp": "noon", "key": "k1", "offset": 9, "_error": "x"}'
    (row,) = decode(spec, [value])
    own = ("value_timestamp", "value_key", "value_offset", "value__error")
    assert [row[k] for k in own] == ["noon", "k1", 9, "x"]
    assert (row["timestamp"], row["key"], row["offset"], row["_error"]) == (T0, b"k", 0, None)
    assert Decoder(spec).output_schema.names[:5] == [
        "id",
        "value_timestamp",
        "value_key",
        "value_offset",
        "value__error",
    ]
    # A value that has both `offset` and `value_offset`: the later field's name is taken.
    both = pa.schema([("offset", pa.int64()), ("value_offset", pa.int64())])
    assert Decoder(DecodeSpec(FieldSpec("json", "none", both))).output_schema.names[:2] == [
        "value_offset",
        "value_value_offset",
    ]


def test_names_that_differ_only_in_case_get_columns_of_their_own_as_spark_and_delta_compare() -> (
    None
):
    """Delta refuses `id` beside `Id` and `Offset` beside Kafka's `offset` (names compare
    without case): a field whose name is taken, ignoring case, by a Kafka column or an earlier
    field lands as `value_<name>`, inside records too, and its value stays its own."""
    inner = pa.struct([("a", pa.int64()), ("A", pa.string())])
    clash = pa.schema(
        [
            ("id", pa.int64()),
            ("Id", pa.int64()),
            ("Offset", pa.int64()),
            ("KEY", pa.string()),
            ("Timestamp", pa.string()),
            ("r", inner),
            ("rs", pa.list_(inner)),
        ]
    )
    spec = DecodeSpec(FieldSpec("json", "none", clash))
    value = (
        b'{"id": 1, "Id": 2, "Offset": 3, "KEY": "k", "Timestamp": "t", '
        b'"r": {"a": 4, "A": "x"}, "rs": [{"a": 5, "A": "y"}]}'
    )
    (row,) = decode(spec, [value])
    schema = Decoder(spec).output_schema
    assert schema.names[:7] == [
        "id",
        "value_Id",
        "value_Offset",
        "value_KEY",
        "value_Timestamp",
        "r",
        "rs",
    ]
    assert schema.field("r").type.names == ["a", "value_A"]
    assert (row["id"], row["value_Id"], row["value_Offset"], row["offset"]) == (1, 2, 3, 0)
    assert (row["value_KEY"], row["key"], row["value_Timestamp"]) == ("k", b"k", "t")
    assert row["r"] == {"a": 4, "value_A": "x"}
    assert row["rs"] == [{"a": 5, "value_A": "y"}]
    # What Delta checks: every name distinct without case, at every level.
    from deltalake import Schema

    Schema.from_arrow(pa.schema([f for f in schema if f.name != "headers"]))


def test_a_decoded_keys_fields_that_differ_only_in_case_are_named_by_the_same_rule() -> None:
    key = pa.schema([("Id", pa.int64()), ("id", pa.string())])
    spec = DecodeSpec(
        FieldSpec("json", "none", pa.schema([("n", pa.int64())])),
        key=FieldSpec("json", "none", key),
    )
    batch = kafka([b'{"n": 1}'])
    batch = batch.set_column(0, "key", pa.array([b'{"Id": 7, "id": "seven"}']))
    (row,) = Decoder(DecodeSpec.from_json(spec.to_json())).decode(batch).to_pylist()
    assert row["key"] == {"Id": 7, "value_id": "seven"} and row["_error"] is None


_KAFKA_NAMES = ("key", "topic", "partition", "offset", "timestamp", "timestampType", "headers")


def _cased(draw_base: str, flips: list[bool]) -> str:
    return "".join(c.upper() if f else c for c, f in zip(draw_base, flips, strict=False))


@st.composite
def _colliding_names(draw) -> list[str]:
    """Field names of a record that collide by case: with each other (`id`, `Id`, `ID`), with
    Kafka's columns (`Offset`) and with the rename itself (`value_id`)."""
    bases = draw(st.lists(st.sampled_from(["id", "ab", "value_id", *_KAFKA_NAMES]), max_size=8))
    names: list[str] = []
    for base in bases:
        name = _cased(base, draw(st.lists(st.booleans(), min_size=len(base), max_size=len(base))))
        if name not in names:  # a record's names are distinct as its format compares them
            names.append(name)
    return names


@settings(max_examples=200, deadline=None)
@given(names=_colliding_names(), cut=st.integers(0, 8))
def test_generated_names_colliding_by_case_get_distinct_columns_that_later_versions_keep(
    names: list[str], cut: int
) -> None:
    """Every column distinct without case (also inside a record), Delta takes the schema, and
    a version that adds fields (the reader schema grows at its end) renames no earlier one."""
    from deltalake import Schema

    def output(fields: list[str]) -> pa.Schema:
        struct = pa.struct([(n, pa.int64()) for n in fields])
        reader = pa.schema([*((n, pa.int64()) for n in fields), ("nested", struct)])
        return Decoder(DecodeSpec(FieldSpec("json", "none", reader))).output_schema

    full = output(names)
    lowered = [n.lower() for n in full.names]
    assert len(set(lowered)) == len(lowered), full.names
    nested = full.field(len(names)).type
    assert len({f.name.lower() for f in nested}) == nested.num_fields
    Schema.from_arrow(full)
    earlier = output(names[:cut])
    assert full.names[: min(cut, len(names))] == earlier.names[: min(cut, len(names))]


# -- the registry client -------------------------------------------------------------------


def test_a_failed_look_up_is_never_cached(schema_registry) -> None:
    registry = Registry(RegistrySettings(schema_registry.url))
    client = SchemaRegistryClient({"url": schema_registry.url})
    subject = f"never-cached-{datetime.now().timestamp()}"
    # An id nobody registered yet is unknown (a dead letter), and asked again next time.
    next_id = max([0, *(s.schema_id for s in _all(client))]) + 1
    assert registry.schema_by_id(next_id) is None
    schema_id = client.register_schema(subject, _avro_schema())
    assert schema_id == next_id
    assert registry.schema_by_id(schema_id) is not None

    # A registry that does not answer is not a dead letter: the batch must stop.
    with schema_registry.down():
        with pytest.raises(RegistryUnavailableError, match="unreachable"):
            settings = RegistrySettings(schema_registry.url, timeout_seconds=2)
            Registry(settings).schema_by_id(schema_id)
    assert Registry(RegistrySettings(schema_registry.url)).schema_by_id(schema_id) is not None


def _avro_schema():
    from confluent_kafka.schema_registry import Schema

    return Schema(
        json.dumps({"type": "record", "name": "N", "fields": [{"name": "x", "type": "long"}]}),
        "AVRO",
    )


def _all(client: SchemaRegistryClient) -> list:
    out = []
    for subject in client.get_subjects():
        for version in client.get_versions(subject):
            out.append(client.get_version(subject, version))
    return out


def test_credentials_come_from_the_environment_and_never_reach_the_spec() -> None:
    settings = RegistrySettings(
        "https://registry.example.com", auth="basic", user_env="SR_USER", password_env="SR_PASS"
    )
    spec = DecodeSpec(FieldSpec("avro", "confluent", ORDER), registry=settings)
    environ = {"SR_USER": "alice", "SR_PASS": "s3cret"}

    assert client_config(settings, environ)["basic.auth.user.info"] == "alice:s3cret"
    assert "s3cret" not in spec.to_json() and "alice" not in spec.to_json()
    with pytest.raises(SchemaFileError, match="SR_PASS, which is not set"):
        client_config(settings, {"SR_USER": "alice"})


def test_the_driver_reads_the_decoders_errors_out_of_sparks_exception_text() -> None:
    from kafka_delta.decoding.failures import registry_down, schema_changed
    from kafka_delta.runtime.run_loop import registry_backoff

    inner = SchemaChangedError(("channel", "region"), 7)
    wrapped = RuntimeError(
        f"Traceback ...\n  raise ...\nSchemaChangedError: {inner}\n\tat org.apache"
    )
    assert schema_changed(wrapped) == (("channel", "region"), 7)
    assert schema_changed(inner) == (("channel", "region"), 7)
    assert schema_changed(RuntimeError("something else")) is None
    down = RuntimeError("...\nRegistryUnavailableError: the Schema Registry at x is unreachable\n")
    assert registry_down(down) == "the Schema Registry at x is unreachable"
    assert registry_backoff(10) == [1.0, 2.0, 4.0]
    assert sum(registry_backoff(300)) <= 300 and max(registry_backoff(300)) == 60.0
