"""Generated Protobuf (issue: formats): Hypothesis draws .proto files (scalars of every wire
type, enums, oneofs, proto3 optional, repeated, maps, nested and self-recursive messages, the
well-known types) and records; confluent-kafka's own ProtobufSerializer frames them against the
development registry (the produced message may be any top-level or nested one: its index path
is in the frame). Every value read back must equal the value written under the mapping of
kafka_delta.decoding.protobuf_types, or the record is a dead letter with its reason (a message
the table does not take: another pinned by ``message:``); never a crash. The decoder on many
examples, the pipeline (each sink) on a few.

KAFKA_DELTA_HYPOTHESIS_EXAMPLES sets how many (default 20 for the decoder; a twentieth of
it, at least 1, through the pipeline, per sink);
``KAFKA_DELTA_HYPOTHESIS_EXAMPLES=500 pytest ...`` runs more.
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_delta.decoding.spec import MessageSeenError
from kafka_delta.pipeline import Pipeline
from test_protobuf_types import (
    decode,
    file_proto,
    message_class,
    message_classes,
    registry_spec,
    serialize,
)

EXAMPLES = int(os.environ.get("KAFKA_DELTA_HYPOTHESIS_EXAMPLES", "20"))
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
UINT32 = st.integers(0, 2**32 - 1)
UINT64 = st.integers(0, 2**64 - 1)
FLOAT32 = st.floats(width=32, allow_nan=False)
DOUBLE = st.floats(allow_nan=False)
TEXT = st.text(max_size=6)
BYTES = st.binary(max_size=6)
# (protobuf type, values, what the column holds for a value, the unset default's column value)
SCALARS: dict[str, tuple[str, Any, Any, Any]] = {
    "int32": ("TYPE_INT32", INT32, int, 0),
    "sint32": ("TYPE_SINT32", INT32, int, 0),
    "sfixed32": ("TYPE_SFIXED32", INT32, int, 0),
    "int64": ("TYPE_INT64", INT64, int, 0),
    "sint64": ("TYPE_SINT64", INT64, int, 0),
    "sfixed64": ("TYPE_SFIXED64", INT64, int, 0),
    "uint32": ("TYPE_UINT32", UINT32, int, 0),
    "fixed32": ("TYPE_FIXED32", UINT32, int, 0),
    "uint64": ("TYPE_UINT64", UINT64, Decimal, Decimal(0)),
    "fixed64": ("TYPE_FIXED64", UINT64, Decimal, Decimal(0)),
    "bool": ("TYPE_BOOL", st.booleans(), bool, False),
    "float": ("TYPE_FLOAT", FLOAT32, float, 0.0),
    "double": ("TYPE_DOUBLE", DOUBLE, float, 0.0),
    "string": ("TYPE_STRING", TEXT, str, ""),
    "bytes": ("TYPE_BYTES", BYTES, bytes, b""),
    "enum": ("TYPE_ENUM", st.sampled_from([0, 1, 5, 9]), None, "ZERO"),  # 9: unknown (open)
}
ENUM_NAMES = {0: "ZERO", 1: "ONE", 5: "FIVE"}
WRAPPERS = {
    "Int32Value": "int32",
    "Int64Value": "int64",
    "UInt32Value": "uint32",
    "UInt64Value": "uint64",
    "BoolValue": "bool",
    "StringValue": "string",
    "BytesValue": "bytes",
    "FloatValue": "float",
    "DoubleValue": "double",
}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
WELL_KNOWN = ["Timestamp", "Duration", "Struct", "Value", "ListValue", "Empty", *WRAPPERS]
MAP_KEYS = ["string", "int64", "int32", "bool", "uint64"]


@dataclass
class Field:
    name: str
    kind: str  # a SCALARS key, a WELL_KNOWN name, "sub" (the message's Sub), "self"
    shape: str = "single"  # single | optional | repeated | map | oneof
    key: str | None = None  # map: the key's SCALARS kind
    oneof: int | None = None


@dataclass
class Message:
    name: str
    fields: list[Field]
    sub: list[Field] = field(default_factory=list)  # the nested message Sub's scalar fields


def _field_text(f: Field, number: int, package: str, owner: str, entry: str | None) -> str:
    label = "LABEL_REPEATED" if f.shape in ("repeated", "map") else "LABEL_OPTIONAL"
    extra = ""
    if f.shape == "map":
        type_part = f'type: TYPE_MESSAGE type_name: ".{package}.{owner}.{entry}"'
    else:
        type_part = _type_text(f.kind, package, owner)
    if f.shape == "optional":
        extra = f" proto3_optional: true oneof_index: {f.oneof}"
    if f.shape == "oneof":
        extra = f" oneof_index: {f.oneof}"
    return f'field {{ name: "{f.name}" number: {number} {type_part} label: {label}{extra} }}'


def _type_text(kind: str, package: str, owner: str) -> str:
    if kind in SCALARS:
        wire = SCALARS[kind][0]
        enum = f' type_name: ".{package}.E"' if kind == "enum" else ""
        return f"type: {wire}{enum}"
    if kind == "sub":
        return f'type: TYPE_MESSAGE type_name: ".{package}.{owner}.Sub"'
    if kind == "self":
        return f'type: TYPE_MESSAGE type_name: ".{package}.{owner}"'
    return f'type: TYPE_MESSAGE type_name: ".google.protobuf.{kind}"'


def proto_text(package: str, messages: list[Message]) -> str:
    imports = {
        "Timestamp": "timestamp",
        "Duration": "duration",
        "Struct": "struct",
        "Value": "struct",
        "ListValue": "struct",
        "Empty": "empty",
        **dict.fromkeys(WRAPPERS, "wrappers"),
    }
    deps = sorted(
        {
            f"google/protobuf/{imports[f.kind]}.proto"
            for m in messages
            for f in m.fields
            if f.kind in imports
        }
    )
    out = [f'name: "{package}.proto" package: "{package}" syntax: "proto3"']
    out += [f'dependency: "{d}"' for d in deps]
    out.append(
        'enum_type { name: "E" value { name: "ZERO" number: 0 } value { name: "ONE" number: 1 }'
        ' value { name: "FIVE" number: 5 } }'
    )
    for m in messages:
        body, nested, oneofs = [], [], []
        sub = " ".join(_field_text(f, i + 1, package, m.name, None) for i, f in enumerate(m.sub))
        nested.append(f'nested_type {{ name: "Sub" {sub} }}')
        for i, f in enumerate(m.fields):
            entry = None
            if f.shape == "map":
                entry = f"{f.name.capitalize()}Entry"
                key = _type_text(f.key or "string", package, m.name)
                value = _type_text(f.kind, package, m.name)
                nested.append(
                    f'nested_type {{ name: "{entry}" options {{ map_entry: true }} '
                    f'field {{ name: "key" number: 1 {key} label: LABEL_OPTIONAL }} '
                    f'field {{ name: "value" number: 2 {value} label: LABEL_OPTIONAL }} }}'
                )
            body.append(_field_text(f, i + 1, package, m.name, entry))
        count = max([f.oneof for f in m.fields if f.oneof is not None], default=-1) + 1
        oneofs = [f'oneof_decl {{ name: "_o{i}" }}' for i in range(count)]
        out.append(f'message_type {{ name: "{m.name}" {" ".join(body + nested + oneofs)} }}')
    return "\n".join(out)


@st.composite
def messages(draw: Any) -> list[Message]:
    out = []
    for mi in range(draw(st.integers(1, 3))):
        sub = [
            Field(f"s{i}", draw(st.sampled_from(sorted(SCALARS))))
            for i in range(draw(st.integers(1, 3)))
        ]
        fields: list[Field] = []
        oneof = 0
        for i in range(draw(st.integers(1, 6))):
            shape = draw(st.sampled_from(["single", "optional", "repeated", "map", "oneof"]))
            kinds = sorted(SCALARS) + WELL_KNOWN + ["sub", "self"]
            kind = draw(st.sampled_from(kinds))
            if shape in ("optional", "oneof") and kind not in SCALARS:
                shape = "single"
            if shape == "map" and kind in ("self", "Empty", "Struct", "ListValue", "Value"):
                shape = "repeated"
            name = f"f{i}_{kind.lower()}"
            if shape == "optional":
                fields.append(Field(name, kind, shape, oneof=oneof))
                oneof += 1
            elif shape == "oneof":
                other = draw(st.sampled_from(sorted(SCALARS)))
                fields.append(Field(name, kind, shape, oneof=oneof))
                fields.append(Field(f"f{i}_or_{other}", other, shape, oneof=oneof))
                oneof += 1
            elif shape == "map":
                fields.append(Field(name, kind, shape, key=draw(st.sampled_from(MAP_KEYS))))
            else:
                fields.append(Field(name, kind, shape))
        # Real oneofs first: protobuf wants proto3 optional's synthetic ones after them.
        real = sorted({f.oneof for f in fields if f.shape == "oneof"})
        synthetic = [f.oneof for f in fields if f.shape == "optional"]
        renumber = {old: new for new, old in enumerate([*real, *synthetic])}
        for f in fields:
            if f.oneof is not None:
                f.oneof = renumber[f.oneof]
        out.append(Message(f"M{mi}", fields, sub))
    return out


# -- values: set on a message, and what its column must hold --------------------------------


def _scalar(draw: Any, kind: str) -> tuple[Any, Any]:
    _, values, column, _ = SCALARS[kind]
    v = draw(values)
    if kind == "enum":
        return v, ENUM_NAMES.get(v, str(v))
    return v, column(v)


def _well_known(draw: Any, kind: str, target: Any) -> Any:
    """Sets ``target`` (a message of ``kind``) and returns its column value."""
    target.SetInParent()  # set, even when it holds only defaults (an empty Struct: "{}")
    if kind == "Timestamp":
        seconds = draw(st.integers(-62135596800, 253402300799))
        nanos = draw(st.integers(0, 999_999_999))
        target.seconds, target.nanos = seconds, nanos
        return EPOCH + timedelta(microseconds=seconds * 1_000_000 + nanos // 1000)
    if kind == "Duration":
        seconds = draw(st.integers(-315576000000, 315576000000))
        nanos = draw(st.integers(0, 999_999_999))
        if seconds < 0 or (seconds == 0 and draw(st.booleans())):
            nanos = -nanos
        target.seconds, target.nanos = seconds, nanos
        return seconds * 1_000_000 + int(nanos / 1000)
    if kind in WRAPPERS:
        raw, column = _scalar(draw, WRAPPERS[kind])
        target.value = raw
        return column
    if kind == "Struct":
        doc = draw(st.dictionaries(TEXT, JSON_VALUES, max_size=3))
        target.update(doc)
        return ("json", doc)
    if kind == "ListValue":
        items = draw(st.lists(JSON_VALUES, max_size=3))
        target.extend(items)
        return ("json", items)
    if kind == "Value":
        from google.protobuf import json_format

        value = draw(JSON_VALUES)
        json_format.ParseDict(value, target)
        return ("json", value)
    assert kind == "Empty"
    target.SetInParent()
    return True


def _item(draw: Any, f: Field, kind: str, make: Any, spec: Message) -> tuple[Any, Any]:
    """(a value to put in a repeated field or map, its column value) for ``kind``."""
    if kind in SCALARS:
        return _scalar(draw, kind)
    item = make()
    if kind == "sub":
        return item, _fill_sub(draw, item, spec)
    if kind == "self":
        return item, _fill_self(draw, item, spec)
    return item, _well_known(draw, kind, item)


def _fill_sub(draw: Any, sub: Any, spec: Message) -> dict[str, Any]:
    sub.SetInParent()  # set, even when none of its fields is
    out = {}
    for f in spec.sub:
        if draw(st.booleans()):
            raw, column = _scalar(draw, f.kind)
            setattr(sub, f.name, raw)
            out[f.name] = column
        else:
            out[f.name] = SCALARS[f.kind][3]
    return out


def _fill_self(draw: Any, inner: Any, spec: Message) -> Any:
    """A message of the recursing type: some of its scalar fields set; its column is JSON."""
    from google.protobuf import json_format

    for f in spec.fields:
        if f.kind in SCALARS and f.shape == "single" and draw(st.booleans()):
            setattr(inner, f.name, _scalar(draw, f.kind)[0])
    inner.SetInParent()
    return ("json", json_format.MessageToDict(inner, preserving_proto_field_name=True))


@st.composite
def record(draw: Any, cls: Any, spec: Message) -> tuple[Any, dict[str, Any]]:
    m = cls()
    expected: dict[str, Any] = {}
    chosen: dict[int, str | None] = {}
    for f in spec.fields:
        if f.shape == "oneof":
            if f.oneof not in chosen:
                members = [g.name for g in spec.fields if g.oneof == f.oneof]
                chosen[f.oneof] = draw(st.sampled_from([None, *members]))  # type: ignore[index]
            if chosen[f.oneof] != f.name:  # type: ignore[index]
                expected[f.name] = None
                continue
            raw, column = _scalar(draw, f.kind)
            setattr(m, f.name, raw)
            expected[f.name] = column
        elif f.shape in ("single", "optional") and f.kind in SCALARS:
            if draw(st.booleans()):
                raw, column = _scalar(draw, f.kind)
                setattr(m, f.name, raw)
                expected[f.name] = column
            else:
                expected[f.name] = None if f.shape == "optional" else SCALARS[f.kind][3]
        elif f.shape == "single":
            if not draw(st.booleans()):
                expected[f.name] = None
                continue
            target = getattr(m, f.name)
            if f.kind == "sub":
                expected[f.name] = _fill_sub(draw, target, spec)
            elif f.kind == "self":
                expected[f.name] = _fill_self(draw, target, spec)
            else:
                expected[f.name] = _well_known(draw, f.kind, target)
        elif f.shape == "repeated":
            container = getattr(m, f.name)
            items = []
            for _ in range(draw(st.integers(0, 3))):
                if f.kind in SCALARS:
                    raw, column = _scalar(draw, f.kind)
                    container.append(raw)
                else:
                    column = _item(draw, f, f.kind, container.add, spec)[1]
                items.append(column)
            expected[f.name] = items
        else:  # map
            container = getattr(m, f.name)
            entries = {}
            for _ in range(draw(st.integers(0, 3))):
                key, key_column = _scalar(draw, f.key or "string")
                if f.kind in SCALARS:
                    raw, column = _scalar(draw, f.kind)
                    container[key] = raw
                else:
                    entry = functools.partial(_entry, container, key)
                    column = _item(draw, f, f.kind, entry, spec)[1]
                entries[key_column] = column
            expected[f.name] = entries
    return m, expected


def _entry(container: Any, key: Any) -> Any:
    """The message a map holds at ``key``, emptied: a key drawn twice is written anew, as its
    expected value says (protobuf returns the entry already there, with its fields set)."""
    entry = container[key]
    entry.Clear()
    return entry


def same(got: Any, want: Any) -> bool:
    """``got`` (a column's value read back) is ``want`` under the documented mapping."""
    if isinstance(want, tuple) and len(want) == 2 and want[0] == "json":
        return isinstance(got, str) and json.loads(got) == want[1]
    if isinstance(want, dict) and isinstance(got, list):  # a map: (key, value) pairs
        return len(got) == len(want) and all(k in want and same(v, want[k]) for k, v in got)
    if isinstance(want, dict):
        return isinstance(got, dict) and all(same(got.get(k), v) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(got) == len(want)
            and all(same(g, w) for g, w in zip(got, want, strict=True))
        )
    if isinstance(want, float) and isinstance(got, float):
        return got == want
    return type(got) is type(want) and got == want if want is not None else got is None


@dataclass
class Case:
    topic: str
    values: list[bytes]
    expected: list[dict[str, Any]]
    produced: str  # the produced message's full name
    message: str | None  # decoding.value.message
    takes: bool  # whether the table takes the produced message (not another one pinned)


@st.composite
def cases(draw: Any, registry_url: str, topic: str) -> Case:
    package = f"g{uuid.uuid4().hex[:10]}"
    specs = draw(messages())
    pool = message_classes(file_proto(proto_text(package, specs)))
    which = draw(st.integers(0, len(specs) - 1))
    spec = specs[which]
    nested = draw(st.booleans())
    produced = f"{package}.{spec.name}" + (".Sub" if nested else "")
    cls = message_class(pool, produced)
    if nested:
        sub_spec = Message("Sub", spec.sub)
        drawn = [draw(record(cls, sub_spec)) for _ in range(draw(st.integers(1, 4)))]
    else:
        drawn = [draw(record(cls, spec)) for _ in range(draw(st.integers(1, 4)))]
    # No `message:`: the table takes the message the records carry (the file's default, M0,
    # is a guess the frames correct). `message:` the produced one, or another the file has:
    # then the records are dead letters naming their message.
    others = [
        name
        for s in specs
        for name in (f"{package}.{s.name}", f"{package}.{s.name}.Sub")
        if name != produced
    ]
    message = draw(st.sampled_from([None, produced, *others]))
    takes = message in (None, produced)
    values = serialize(registry_url, topic, [m for m, _ in drawn])
    return Case(topic, values, [e for _, e in drawn], produced, message, takes)


def check(case: Case, rows: list[dict[str, Any]]) -> None:
    assert len(rows) == len(case.values)
    for row, want in zip(rows, case.expected, strict=True):
        if not case.takes:
            assert row["_error"] and f"carries message {case.produced}" in row["_error"]
            continue
        assert row["_error"] is None, row["_error"]
        for name, value in want.items():
            assert same(row[name], value), (name, row[name], value)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_records_expected_map_of_messages_is_what_its_message_holds(data) -> None:
    """The generator's own oracle: a map of messages whose keys are drawn twice (a bool key: two
    keys in all) holds, at each key, the last value drawn for it, as the expected rows say."""
    package = f"g{uuid.uuid4().hex[:10]}"
    spec = Message("M0", [Field("m", "sub", "map", key="bool")], [Field("s0", "enum")])
    cls = message_class(message_classes(file_proto(proto_text(package, [spec]))), f"{package}.M0")
    message, expected = data.draw(record(cls, spec))
    held = {k: {"s0": ENUM_NAMES.get(v.s0, str(v.s0))} for k, v in message.m.items()}
    assert held == expected["m"]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_generated_protobuf_decodes_to_the_documented_values(schema_registry, data) -> None:
    case = data.draw(cases(schema_registry.url, f"gen-{uuid.uuid4().hex[:12]}"))
    spec = registry_spec(schema_registry.url, case.topic, case.message)
    try:
        rows = decode(spec, case.values)
    except MessageSeenError as seen:  # the pipeline's restart: the records' message's columns
        assert case.message is None and seen.message == case.produced, seen
        spec = registry_spec(schema_registry.url, case.topic, seen.message)
        rows = decode(spec, case.values)
    check(case, rows)


@pytest.mark.spark
@pytest.mark.broker
@settings(
    max_examples=max(1, EXAMPLES // 20),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_generated_protobuf_lands_in_the_table_or_the_dead_letters(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, sink_engine, tmp_path, data
) -> None:
    from kafka_delta_dev.produce import produce_values

    (topic,) = new_topics(1, partitions=1)
    case = data.draw(cases(schema_registry.url, topic))
    produce_values(kafka_bootstrap, topic, [(0, v) for v in case.values])
    run = tmp_path / uuid.uuid4().hex[:8]
    value: dict[str, Any] = {"format": "protobuf"}
    if case.message:
        value["message"] = case.message
    cfg = make_config([topic], engine=sink_engine, transform=None).with_overrides(
        **{
            "delta.table": str(run / "table"),
            "checkpoint": str(run / "checkpoint"),
            "decoding": {"value": value, "schema_registry": {"url": schema_registry.url}},
        }
    )

    Pipeline(spark, cfg).run()

    table = DeltaTable(cfg.delta.table).to_pyarrow_table().to_pylist()
    assert cfg.dead_letter_table is not None
    dead = (
        DeltaTable(cfg.dead_letter_table).to_pyarrow_table().to_pylist()
        if os.path.exists(cfg.dead_letter_table)
        else []
    )
    assert len(table) + len(dead) == len(case.values)
    if case.takes:
        assert dead == []
        rows = [{**r, "_error": None} for r in sorted(table, key=lambda r: r["offset"])]
    else:
        assert table == []
        rows = [{"_error": d["error"]} for d in sorted(dead, key=lambda r: r["offset"])]
    check(case, rows)
