"""Every Avro type has a column (issue: formats, the Avro part): records framed by
confluent-kafka's own AvroSerializer (auto-register) against the development registry, decoded
by the decoder on Arrow batches (no Spark); then the delta-rs file writer's rules (nested
nullable records, narrower columns); and one pipeline run end to end."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kafka_delta.contract import KAFKA_ARROW_SCHEMA
from kafka_delta.decoding.avro_types import DURATION, avro_to_arrow
from kafka_delta.decoding.decoder import Decoder
from kafka_delta.decoding.spec import DecodeSpec, FieldSpec, RegistrySettings
from kafka_delta.decoding.versions import union_schemas
from kafka_delta.delta.schema import SchemaMismatchError
from kafka_delta.sinks.delta_rs.file_writer import (
    FileTarget,
    TaskWriter,
    write_files,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
U = uuid.UUID("12345678-1234-5678-1234-567812345678")


def serialize(url: str, subject_topic: str, schema: dict, records: list[dict]) -> list[bytes]:
    serializer = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(schema))
    context = SerializationContext(subject_topic, MessageField.VALUE)
    return [serializer(r, context) for r in records]


def kafka(values: list[bytes | None]) -> pa.RecordBatch:
    n = len(values)
    columns = {f.name: pa.nulls(n, f.type) for f in KAFKA_ARROW_SCHEMA}
    columns["value"] = pa.array(values, pa.binary())
    columns["topic"] = pa.array(["t"] * n)
    columns["partition"] = pa.array([0] * n, pa.int32())
    columns["offset"] = pa.array(range(n), pa.int64())
    columns["timestamp"] = pa.array([T0] * n, columns["timestamp"].type)
    columns["timestampType"] = pa.array([0] * n, pa.int32())
    return pa.RecordBatch.from_pydict(columns, schema=KAFKA_ARROW_SCHEMA)


def decode(url: str, reader: pa.Schema, values: list[bytes], subjects=()) -> list[dict]:
    field = FieldSpec("avro", "confluent", reader, subjects=tuple(subjects))
    spec = DecodeSpec(field, registry=RegistrySettings(url))
    return Decoder(DecodeSpec.from_json(spec.to_json())).decode(kafka(values)).to_pylist()


UUID_TYPE = {"type": "string", "logicalType": "uuid"}
DURATION_TYPE = {"type": "fixed", "name": "Dur", "size": 12, "logicalType": "duration"}


def dec(precision: int, scale: int) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


EVERY_TYPE: dict[str, Any] = {
    "type": "record",
    "name": "Every",
    "namespace": "test.types",
    "fields": [
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "d", "type": dec(9, 2)},
        {
            "name": "df",
            "type": {
                "type": "fixed",
                "name": "Money",
                "size": 8,
                "logicalType": "decimal",
                "precision": 15,
                "scale": 3,
            },
        },
        {"name": "big", "type": dec(45, 1)},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "dur", "type": DURATION_TYPE},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "kind_again", "type": "Kind"},
        {"name": "raw", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {
            "name": "opt",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Inner",
                    "fields": [
                        {"name": "x", "type": "int"},
                        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
                    ],
                },
            ],
        },
        {"name": "multi", "type": ["null", "long", "double", "string", "Inner"]},
        {"name": "ids", "type": {"type": "array", "items": UUID_TYPE}},
        {"name": "tags", "type": {"type": "map", "values": ["null", "Kind"]}},
        {
            "name": "tree",
            "type": {
                "type": "record",
                "name": "Node",
                "fields": [
                    {"name": "v", "type": "int"},
                    {"name": "next", "type": ["null", "Node"]},
                ],
            },
        },
    ],
}


def every(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "u": str(U),
        "d": Decimal("12.34"),
        "df": Decimal("-1.500"),
        "big": Decimal("12345678901234567890123456789012345678901234.5"),
        "day": date(2024, 2, 29),
        "tm": time(1, 2, 3, 4000),
        "tu": time(1, 2, 3, 5),
        "ts_ms": T0,
        "ts_us": datetime(2026, 1, 1, 0, 0, 0, 7, tzinfo=UTC),
        "local": datetime(2026, 1, 1, 12, 0),
        "dur": (1).to_bytes(4, "little") + (2).to_bytes(4, "little") + (3000).to_bytes(4, "little"),
        "kind": "A",
        "kind_again": "B",
        "raw": b"\x00\x01\x02\x03",
        "opt": None,
        "multi": None,
        "ids": [str(U)],
        "tags": {"k": "A", "n": None},
        "tree": {"v": i, "next": {"v": i + 1, "next": None}},
        **extra,
    }


def test_every_avro_type_has_a_column_and_reads_back_what_was_written(schema_registry) -> None:
    """uuid used to kill the read task (ArrowTypeError: Expected bytes, got a 'UUID' object),
    and a multi-type union or a recursive record stopped the run."""
    reader = union_schemas([avro_to_arrow(EVERY_TYPE)])
    assert reader.field("u").type == pa.string()
    assert reader.field("big").type == pa.string()
    assert reader.field("dur").type == DURATION
    assert reader.field("multi").type.names == ["member0", "member1", "member2", "member3"]
    assert reader.field("tree").type.field("next").type == pa.string()
    records = [
        every(0),
        every(1, opt={"x": 3, "at": T0}, multi=7),
        every(2, multi=2.5),
        every(3, multi="text"),
        every(4, multi={"x": 9, "at": T0}),
    ]
    values = serialize(schema_registry.url, "avro-types-every", EVERY_TYPE, records)

    rows = decode(schema_registry.url, reader, values)

    assert [r["_error"] for r in rows] == [None] * 5
    first = rows[0]
    assert first["u"] == str(U)
    assert first["d"] == Decimal("12.34") and first["df"] == Decimal("-1.500")
    assert first["big"] == "12345678901234567890123456789012345678901234.5"
    assert first["day"] == date(2024, 2, 29)
    assert first["tm"] == 3_723_004 and first["tu"] == 3_723_000_005
    assert first["ts_ms"] == T0 and first["ts_us"] == datetime(2026, 1, 1, 0, 0, 0, 7, tzinfo=UTC)
    assert first["local"] == datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert first["dur"] == {"months": 1, "days": 2, "milliseconds": 3000}
    assert (first["kind"], first["kind_again"], first["raw"]) == ("A", "B", b"\x00\x01\x02\x03")
    assert first["opt"] is None and first["multi"] is None
    assert first["ids"] == [str(U)]
    assert dict(first["tags"]) == {"k": "A", "n": None}
    assert first["tree"] == {"v": 0, "next": '{"v":1,"next":null}'}
    assert rows[1]["opt"] == {"x": 3, "at": T0}
    members = [{k: v for k, v in r["multi"].items() if v is not None} for r in rows[1:]]
    assert members == [
        {"member0": 7},
        {"member1": 2.5},
        {"member2": "text"},
        {"member3": {"x": 9, "at": T0}},
    ]


PROMO_V1 = {
    "type": "record",
    "name": "Promo",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "n", "type": "int"},
        {"name": "f", "type": "float"},
        {"name": "gone", "type": "string"},
    ],
}
PROMO_V2 = {
    "type": "record",
    "name": "Promo",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "n", "type": "long"},
        {"name": "f", "type": "double"},
        {"name": "added", "type": "string", "default": "-"},
    ],
}


def test_promotions_widen_the_reader_and_removed_required_fields_read_null(
    schema_registry,
) -> None:
    """int -> long, float -> double and a required field removed: Confluent's BACKWARD
    accepts them; the run used to stop ('required field ... was removed')."""
    url = schema_registry.url
    v1 = serialize(url, "avro-types-promo", PROMO_V1, [{"id": 1, "n": 5, "f": 1.5, "gone": "g"}])
    wide = {"id": 2, "n": 2**40, "f": 0.1, "added": "a"}
    v2 = serialize(url, "avro-types-promo", PROMO_V2, [wide])
    reader = union_schemas([avro_to_arrow(PROMO_V1), avro_to_arrow(PROMO_V2)])
    assert reader.field("n").type == pa.int64() and reader.field("f").type == pa.float64()

    rows = decode(url, reader, [*v1, *v2])

    # v1 lacks `added`: it reads v2's default (Avro's resolution), `gone` (no default) null.
    assert [(r["id"], r["n"], r["f"], r["gone"], r["added"]) for r in rows] == [
        (1, 5, 1.5, "g", "-"),
        (2, 2**40, 0.1, None, "a"),
    ]
    # A reader pinned to the old, narrower column (a schema file): the long that fits lands,
    # the one that does not is a dead letter naming the field, the schema id and both types.
    narrow = pa.schema([*avro_to_arrow(PROMO_V1), pa.field("added", pa.string())])
    fits = serialize(url, "avro-types-promo", PROMO_V2, [{"id": 3, "n": 7, "f": 0.5, "added": "b"}])
    rows = decode(url, union_schemas([narrow]), [*fits, *v2])
    assert (rows[0]["id"], rows[0]["n"], rows[0]["_error"]) == (3, 7, None)
    assert rows[1]["id"] is None
    assert "'n'" in rows[1]["_error"] and "int64" in rows[1]["_error"], rows[1]["_error"]
    assert "int32" in rows[1]["_error"] and "schema id" in rows[1]["_error"]


def test_a_widened_union_lands_values_of_the_old_branch_and_sets_the_new_one_aside(
    schema_registry,
) -> None:
    url = schema_registry.url
    v1 = {"type": "record", "name": "W", "fields": [{"name": "x", "type": ["null", "long"]}]}
    v2 = {**v1, "fields": [{"name": "x", "type": ["null", "long", "string"]}]}
    reader = union_schemas([avro_to_arrow(v1), avro_to_arrow(v2)])
    assert reader.field("x").type == pa.int64()  # the column the table has
    values = serialize(url, "avro-types-widen", v2, [{"x": 4}, {"x": None}, {"x": "four"}])

    rows = decode(url, reader, values)

    assert [(r["x"], r["_error"]) for r in rows[:2]] == [(4, None), (None, None)]
    assert "'x'" in rows[2]["_error"] and "string" in rows[2]["_error"], rows[2]["_error"]


def test_a_union_member_is_the_branch_written_not_the_one_the_value_would_fit(
    schema_registry,
) -> None:
    """int and long (float and double) in one union: the member is the branch index in the
    bytes. A long of 600 or a double of 0.5 fits the int (float) branch too, so a decoder
    that picks the member from the value puts them in the wrong one."""
    url = schema_registry.url
    record = {
        "type": "record",
        "name": "Twins",
        "fields": [
            {"name": "i", "type": ["null", "int", "long"]},
            {"name": "f", "type": ["null", "float", "double"]},
            {"name": "a", "type": {"type": "array", "items": ["long", "int"]}},
            {"name": "m", "type": {"type": "map", "values": ["double", "float", "string"]}},
            {"name": "d", "type": ["long", "int"], "default": 7},
        ],
    }
    v1 = {**record, "fields": record["fields"][:4]}
    written = [
        {"i": ("long", 600), "f": ("double", 0.5), "a": [("int", 1), ("long", 2)], "m": {}},
        {"i": ("int", 600), "f": ("float", 0.5), "a": [], "m": {"k": ("float", 0.25)}},
        {"i": None, "f": None, "a": [("long", -(2**40))], "m": {"k": ("double", 0.25)}},
    ]
    values = serialize(url, "avro-types-twins", v1, written)
    reader = union_schemas([avro_to_arrow(v1), avro_to_arrow(record)])

    rows = decode(url, reader, values)

    assert [r["_error"] for r in rows] == [None] * 3
    assert [r["i"] for r in rows] == [
        {"member0": None, "member1": 600},
        {"member0": 600, "member1": None},
        None,
    ]
    assert [r["f"] for r in rows] == [
        {"member0": None, "member1": 0.5},
        {"member0": 0.5, "member1": None},
        None,
    ]
    assert rows[0]["a"] == [
        {"member0": None, "member1": 1},
        {"member0": 2, "member1": None},
    ]
    assert rows[2]["a"] == [{"member0": -(2**40), "member1": None}]
    assert rows[1]["m"] == [("k", {"member0": None, "member1": 0.25, "member2": None})]
    assert rows[2]["m"] == [("k", {"member0": 0.25, "member1": None, "member2": None})]
    # A default is of the union's first branch: 7 in the long, though an int holds it.
    assert [r["d"] for r in rows] == [{"member0": 7, "member1": None}] * 3

    # With a map branch (a map {"int": 3} looks like an int's wrapper) or a record branch.
    mixed = {
        "type": "record",
        "name": "Mixed",
        "fields": [
            {"name": "mp", "type": ["null", "int", "long", {"type": "map", "values": "int"}]},
            {
                "name": "rc",
                "type": [
                    "null",
                    "long",
                    {"type": "record", "name": "Rec", "fields": [{"name": "x", "type": "int"}]},
                    "int",
                ],
            },
        ],
    }
    written = [
        {"mp": ("long", 5), "rc": ("int", 6)},
        {"mp": {"int": 3}, "rc": ("Rec", {"x": 1})},
    ]
    values = serialize(url, "avro-types-twins-mixed", mixed, written)

    rows = decode(url, union_schemas([avro_to_arrow(mixed)]), values)

    assert [r["_error"] for r in rows] == [None, None]
    assert rows[0]["mp"] == {"member0": None, "member1": 5, "member2": None}
    assert rows[1]["mp"] == {"member0": None, "member1": None, "member2": [("int", 3)]}
    assert rows[0]["rc"] == {"member0": None, "member1": None, "member2": 6}
    assert rows[1]["rc"] == {"member0": None, "member1": {"x": 1}, "member2": None}


def test_an_avro_schema_reference_stops_the_start_up_naming_the_type(schema_registry) -> None:
    """What docs/limits.md says: Avro references (a named type registered under
    another subject) are not resolved; Protobuf imports are (test_protobuf_types.py::
    test_imports_resolve_through_the_registrys_references)."""
    from confluent_kafka.schema_registry import Schema, SchemaReference

    from kafka_delta.config import DecodingConfig
    from kafka_delta.decoding.resolve import decode_spec
    from kafka_delta.decoding.spec import SchemaFileError

    client = SchemaRegistryClient({"url": schema_registry.url})
    money = {
        "type": "record",
        "name": "Money",
        "namespace": "ref",
        "fields": [{"name": "cents", "type": "long"}],
    }
    client.register_schema("ref.Money", Schema(json.dumps(money), "AVRO"))
    order = {
        "type": "record",
        "name": "Order",
        "namespace": "ref",
        "fields": [{"name": "price", "type": "ref.Money"}],
    }
    reference = SchemaReference("ref.Money", "ref.Money", 1)
    client.register_schema("avro-ref-value", Schema(json.dumps(order), "AVRO", [reference]))
    decoding = DecodingConfig.model_validate(
        {"value": {"format": "avro"}, "schema_registry": {"url": schema_registry.url}}
    )

    with pytest.raises(SchemaFileError, match=r"unknown Avro type 'ref\.Money'"):
        decode_spec(None, decoding, ["avro-ref"])  # type: ignore[arg-type]


def test_another_subjects_schema_is_a_dead_letter_naming_its_id_and_subject(
    schema_registry,
) -> None:
    url = schema_registry.url
    mine = {"type": "record", "name": "Mine", "fields": [{"name": "id", "type": "long"}]}
    theirs = {"type": "record", "name": "Theirs", "fields": [{"name": "who", "type": "string"}]}
    good = serialize(url, "avro-types-mine", mine, [{"id": 1}])
    bad = serialize(url, "avro-types-theirs", theirs, [{"who": "x"}])
    reader = union_schemas([avro_to_arrow(mine)])

    rows = decode(url, reader, [*good, *bad], subjects=["avro-types-mine-value"])

    assert (rows[0]["id"], rows[0]["_error"]) == (1, None)
    schema_id = int.from_bytes(bad[0][1:5], "big")
    assert f"schema id {schema_id} is registered under avro-types-theirs-value" in rows[1]["_error"]
    # Any subject taken (record_name strategy): the new field restarts the query instead.
    from kafka_delta.decoding.spec import SchemaChangedError

    with pytest.raises(SchemaChangedError, match="who"):
        decode(url, reader, [*good, *bad])


# -- the delta-rs file writer ------------------------------------------------------------------


def test_a_null_optional_record_with_required_fields_is_written_by_the_delta_rs_writer(
    tmp_path,
) -> None:
    """["null", record] null in some records: the file writer crashed ("nulls in input cannot
    be viewed as non-nullable"); Debezium's before/after are such fields."""
    inner = pa.struct([pa.field("x", pa.int32(), nullable=False)])
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("before", inner)])
    # What Spark hands over: the child holds a null under the null parent.
    before = pa.StructArray.from_arrays(
        [pa.array([1, None], pa.int32())], names=["x"], mask=pa.array([False, True])
    )
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2]), before], names=["id", "before"])

    written = write_files([batch], FileTarget(str(tmp_path), schema))

    import pyarrow.parquet as pq

    back = pq.read_table(tmp_path / written[0]["path"]).to_pylist()
    assert back == [{"id": 1, "before": {"x": 1}}, {"id": 2, "before": None}]
    # A null where the parent is set is a real violation: refused, naming the field.
    broken = pa.StructArray.from_arrays([pa.array([None], pa.int32())], names=["x"])
    with pytest.raises(SchemaMismatchError, match=r"before\.x"):
        write_files(
            [pa.RecordBatch.from_arrays([pa.array([3]), broken], names=["id", "before"])],
            FileTarget(str(tmp_path), schema),
        )


def test_the_delta_rs_writer_puts_wider_values_into_the_tables_narrower_column(tmp_path) -> None:
    """The table's column is int (v1); the producers moved to long. Values that fit land; the
    one that does not is a dead letter naming the column, the value and both types."""
    schema = pa.schema([pa.field("n", pa.int32()), pa.field("_error", pa.string())])
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([1, 2**40, 3], pa.int64()),
            pa.array([None, None, None], pa.string()),
            pa.array(["t"] * 3),
            pa.array([0] * 3, pa.int32()),
            pa.array([10, 11, 12], pa.int64()),
        ],
        names=["n", "_error", "topic", "partition", "offset"],
    )
    table_schema = pa.schema([pa.field("n", pa.int32())])
    out = list(TaskWriter(FileTarget(str(tmp_path), table_schema), "_error")(iter([batch])))
    rows = pa.Table.from_batches(out).to_pylist()
    files = [r for r in rows if r["path"]]
    dead = [r for r in rows if not r["path"]]
    assert sum(f["num_records"] for f in files) == 2
    assert [d["dead_offset"] for d in dead] == [11]
    assert "1099511627776" in dead[0]["dead_error"] and "int32" in dead[0]["dead_error"]
    assert schema  # the batch's own schema: n int64, as the reader made it
