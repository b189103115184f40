"""Avro schemas as Arrow schemas: the columns an Avro value (or key) becomes.

A record schema becomes its fields; any other schema one column named ``value``. The mapping
follows Spark's ``from_avro`` (Spark 4 ``SchemaConverters``) wherever a Delta table can hold
the result:

==============================================  ===========================================
Avro                                            Column (Arrow / Delta)
==============================================  ===========================================
null                                            string, always null (Delta has no void)
boolean / int / long                            bool / int32 / int64
float / double                                  float32 / float64
bytes / string                                  binary / string
enum                                            string (the symbol)
fixed                                           binary
record                                          struct (a required field: non-null inside it)
array / map                                     list / map<string, ...>
["null", T] (either order)                      T, nullable (records too)
union of several non-null types                 struct<member0, member1, ...>, one nullable
                                                member per non-null branch, in order, the
                                                branch written set (its index in the bytes:
                                                600 written as a long is the long's, though
                                                an int holds it); null when the value is null
                                                (as Spark does)
decimal (bytes or fixed), precision <= 38       decimal128(precision, scale)
decimal, precision > 38                         string, the exact decimal ("-12.50")
uuid (string or fixed)                          string
date                                            date32
time-millis / time-micros                       int32 ms / int64 µs of the day (Spark's)
timestamp-millis / -micros / -nanos             timestamp[us, UTC] (nanos truncated to µs)
local-timestamp-millis / -micros / -nanos       timestamp[us, UTC]: the wall-clock value read
                                                as UTC (what tables already hold: unchanged)
duration (fixed 12)                             struct<months, days, milliseconds: int64>
a named type used again by name                 the same column type as where it was defined
a recursive reference (a record inside itself)  string: the nested value as JSON (Avro's JSON
                                                encoding, bytes as ISO-8859-1 text)
==============================================  ===========================================

Defaults (Avro's reader/writer resolution): a field a record's writer schema lacks reads the
reader's default for it, the ``default`` of the field in the newest version that has the field
(:func:`.versions.union_schemas` keeps the newest version's), in the column's type by the mapping
above (a union's default is of its first branch; bytes and fixed as ISO-8859-1 text, as Avro
writes them). ``avro_to_arrow`` keeps it in the field's metadata (:data:`DEFAULT_KEY`: the one
value as Arrow IPC, base64), the decoder puts it in whole: one constant column per writer
schema that lacks the field, no work per record. A field without a default (or with one that
does not match its type) reads null, as a field of a nested record the writer lacks does.

Values are decoded by fastavro with the logical types left out of the schema it reads with
(``plain_schema``) and turned into the columns above as whole Arrow columns (:func:`finish`,
here with the mapping it completes: the decoder and the defaults above both go through it): the
raw Arrow type of each column (``AvroColumn.raw``) is what ``pyarrow.array`` builds from
fastavro's values in C++; only multi-type unions and recursive references need Python per value
(``AvroColumn.prep``).
"""

from __future__ import annotations

import base64
import copy
import decimal
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from kafka_delta.decoding.spec import SchemaFileError
from kafka_delta.decoding.versions import TIMESTAMP

MAX_DECIMAL_PRECISION = 38  # Delta's
DURATION = pa.struct(
    [
        pa.field("months", pa.int64()),
        pa.field("days", pa.int64()),
        pa.field("milliseconds", pa.int64()),
    ]
)
_PRIMITIVES = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
# Logical types fastavro reads as their plain values once left out: (raw Arrow type, final).
_RAW_LOGICAL = {
    "timestamp-millis": (pa.timestamp("ms", tz="UTC"), TIMESTAMP),
    "timestamp-micros": (pa.timestamp("us", tz="UTC"), TIMESTAMP),
    "timestamp-nanos": (pa.timestamp("ns", tz="UTC"), TIMESTAMP),
    "local-timestamp-millis": (pa.timestamp("ms", tz="UTC"), TIMESTAMP),
    "local-timestamp-micros": (pa.timestamp("us", tz="UTC"), TIMESTAMP),
    "local-timestamp-nanos": (pa.timestamp("ns", tz="UTC"), TIMESTAMP),
    "date": (pa.date32(), pa.date32()),
    "time-millis": (pa.int32(), pa.int32()),
    "time-micros": (pa.int64(), pa.int64()),
}
# Logical types whose underlying Avro type they must annotate to count (else: ignored, as the
# Avro spec says of a logical type on the wrong type).
_LOGICAL_ON = {
    "timestamp-millis": "long",
    "timestamp-micros": "long",
    "timestamp-nanos": "long",
    "local-timestamp-millis": "long",
    "local-timestamp-micros": "long",
    "local-timestamp-nanos": "long",
    "date": "int",
    "time-millis": "int",
    "time-micros": "long",
    "uuid": ("string", "fixed"),
    "duration": "fixed",
    "decimal": ("bytes", "fixed"),
}
# fastavro converts these itself; the rest are left out of the schema it reads with.
_KEPT_LOGICAL = {"decimal"}


@dataclass(frozen=True)
class AvroColumn:
    """One Avro type as a column: ``final`` is the column's type, ``raw`` the type
    ``pyarrow.array`` builds from fastavro's values (after ``prep``, when not None)."""

    final: pa.DataType
    raw: pa.DataType
    nullable: bool
    prep: Callable[[Any], Any] | None = None


def finish(raw: pa.Array, final: pa.DataType) -> pa.Array:
    """A column as fastavro's plain values built it (``AvroColumn.raw``) as its final type."""
    if raw.type == final:
        return raw
    t = raw.type
    if pa.types.is_timestamp(t):
        return raw.cast(final, safe=t.unit != "ns")  # nanoseconds: truncated to microseconds
    if pa.types.is_fixed_size_binary(t) and final == DURATION:
        return _duration(raw)
    if pa.types.is_struct(t) and pa.types.is_struct(final):
        children = [finish(raw.field(i), f.type) for i, f in enumerate(final)]
        built = pa.StructArray.from_arrays(
            children,
            fields=[f.with_nullable(True) for f in final],
            mask=raw.is_null() if raw.null_count else None,
        )
        return built.cast(final)
    if pa.types.is_list(t) and pa.types.is_list(final):
        values = finish(raw.values, final.value_type)
        return pa.ListArray.from_arrays(
            raw.offsets, values, mask=raw.is_null() if raw.null_count else None
        ).cast(final)
    if pa.types.is_map(t) and pa.types.is_map(final):
        items = finish(raw.items, final.item_type)
        return pa.MapArray.from_arrays(
            raw.offsets, raw.keys, items, mask=raw.is_null() if raw.null_count else None
        ).cast(final)
    return raw.cast(final)


def _duration(raw: pa.Array) -> pa.Array:
    """Avro's duration (three little-endian unsigned 32-bit ints) as months, days, millis."""
    n = len(raw)
    data = raw.buffers()[1]
    words = np.frombuffer(data, dtype="<u4", count=3 * (raw.offset + n))[3 * raw.offset :]
    words = words.reshape(n, 3).astype(np.int64)
    mask = raw.is_null() if raw.null_count else None
    return pa.StructArray.from_arrays(
        [pa.array(words[:, i]) for i in range(3)], fields=list(DURATION), mask=mask
    )


# The field metadata key holding a field's Avro default (see the module's docstring).
DEFAULT_KEY = b"kafka_delta.avro.default"


def avro_to_arrow(schema: str | dict[str, Any] | list) -> pa.Schema:
    """A record schema as its fields; any other schema (a key of type string, say) as one
    field named ``value``. A field's default, when it has one that is not null, is in the
    field's metadata (:data:`DEFAULT_KEY`, :func:`field_default`)."""
    names, columns = avro_columns(schema)
    defaults = avro_defaults(schema)
    return pa.schema(
        pa.field(
            n,
            c.final,
            nullable=c.nullable,
            metadata={DEFAULT_KEY: defaults[n]} if n in defaults else None,
        )
        for n, c in zip(names, columns, strict=True)
    )


def avro_defaults(schema: str | dict[str, Any] | list) -> dict[str, bytes]:
    """The non-null defaults of a record schema's fields, each a one-value column of the
    field's type serialized for the field's metadata; a default that does not match its field's
    type (a writer's mistake the registry did not catch) is left out: the field reads null."""
    parsed = parse(schema)
    if not is_record(parsed):
        return {}
    mapper = _Mapper()
    names, columns = avro_columns_into(mapper, parsed)
    namespace = _namespace_of(parsed, None)
    found: dict[str, bytes] = {}
    for f, column in zip(parsed.get("fields", []), columns, strict=True):
        if f.get("default") is None:
            continue
        try:
            value = mapper.default_value(f["type"], f["default"], namespace)
            if column.prep is not None:
                value = column.prep(value)
            one = finish(pa.array([value], column.raw), column.final)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, pa.ArrowException):
            continue
        if one.null_count:
            continue
        found[f["name"]] = _one_value_text(one)
    assert set(found) <= set(names)
    return found


def _one_value_text(one: pa.Array) -> bytes:
    batch = pa.record_batch([one], names=["default"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return base64.b64encode(sink.getvalue().to_pybytes())


def field_default(field: pa.Field) -> pa.Array | None:
    """The one-value column of ``field``'s default (:func:`avro_to_arrow`), or None."""
    text = (field.metadata or {}).get(DEFAULT_KEY)
    if text is None:
        return None
    return pa.ipc.open_stream(base64.b64decode(text)).read_all().column(0).combine_chunks()


def parse(schema: str | dict[str, Any] | list) -> Any:
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError:
            return schema  # a bare primitive name: "string"
    return schema


def is_record(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "record"


def avro_columns(schema: str | dict[str, Any] | list) -> tuple[list[str], list[AvroColumn]]:
    """(column names, their :class:`AvroColumn`) of a schema."""
    return avro_columns_into(_Mapper(), parse(schema))


def avro_columns_into(mapper: _Mapper, parsed: Any) -> tuple[list[str], list[AvroColumn]]:
    """:func:`avro_columns` of a parsed schema, with ``mapper`` (which then knows its named
    types)."""
    if is_record(parsed):
        full = mapper.define(parsed, None)
        mapper.stack.append(full)
        fields = parsed.get("fields", [])
        namespace = _namespace_of(parsed, None)
        return [f["name"] for f in fields], [
            mapper.column(f["type"], namespace, f["name"]) for f in fields
        ]
    return ["value"], [mapper.column(parsed, None, "value")]


def _namespace_of(named: dict[str, Any], enclosing: str | None) -> str | None:
    name = named.get("name", "")
    if "." in name:
        return name.rpartition(".")[0]
    return named.get("namespace", enclosing) or None


def _full_name(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


class _Mapper:
    def __init__(self) -> None:
        self.named: dict[str, tuple[dict[str, Any], str | None]] = {}
        self.stack: list[str] = []  # records being mapped (a name met again inside: recursion)

    def define(self, t: dict[str, Any], namespace: str | None) -> str:
        full = _full_name(t["name"], namespace)
        self.named[full] = (t, namespace)
        return full

    def lookup(self, name: str, namespace: str | None, where: str) -> tuple[str, Any, str | None]:
        for candidate in (_full_name(name, namespace), name):
            if candidate in self.named:
                return candidate, *self.named[candidate]
        short = [k for k in self.named if k.rpartition(".")[2] == name]
        if len(short) == 1:
            return short[0], *self.named[short[0]]
        raise SchemaFileError(f"field {where!r} has the unknown Avro type {name!r}")

    def column(self, t: Any, namespace: str | None, where: str) -> AvroColumn:
        if isinstance(t, list):
            return self.union(t, namespace, where)
        if isinstance(t, str):
            if t == "null":
                return AvroColumn(pa.string(), pa.string(), True)
            if t in _PRIMITIVES:
                return AvroColumn(_PRIMITIVES[t], _PRIMITIVES[t], False)
            full, named, ns = self.lookup(t, namespace, where)
            if full in self.stack:
                return AvroColumn(pa.string(), pa.string(), False, _as_json)
            return self.column(named, ns, where)
        if not isinstance(t, dict):
            raise SchemaFileError(f"field {where!r} has the Avro type {t!r}, which is not one")
        kind = t.get("type")
        logical = t.get("logicalType")
        if logical is not None and _logical_applies(logical, kind):
            column = self.logical(t, namespace, logical)
            if column is not None:
                return column
        if kind == "record" or kind == "error":
            full = self.define(t, namespace)
            inner_ns = _namespace_of(t, namespace)
            self.stack.append(full)
            try:
                fields = [
                    (f["name"], self.column(f["type"], inner_ns, f"{where}.{f['name']}"))
                    for f in t.get("fields", [])
                ]
            finally:
                self.stack.pop()
            final = pa.struct([pa.field(n, c.final, nullable=c.nullable) for n, c in fields])
            raw = pa.struct([pa.field(n, c.raw, nullable=True) for n, c in fields])
            preps = [(n, c.prep) for n, c in fields if c.prep is not None]
            return AvroColumn(final, raw, False, _record_prep(preps) if preps else None)
        if kind in ("enum", "fixed"):
            self.define(t, namespace)
            dtype = pa.string() if kind == "enum" else pa.binary()
            return AvroColumn(dtype, dtype, False)
        if kind == "array":
            item = self.column(t["items"], namespace, where)
            return AvroColumn(
                pa.list_(pa.field("element", item.final, nullable=item.nullable)),
                pa.list_(pa.field("element", item.raw)),
                False,
                _list_prep(item.prep) if item.prep else None,
            )
        if kind == "map":
            item = self.column(t["values"], namespace, where)
            return AvroColumn(
                pa.map_(pa.string(), pa.field("value", item.final, nullable=item.nullable)),
                pa.map_(pa.string(), pa.field("value", item.raw)),
                False,
                _map_prep(item.prep) if item.prep else None,
            )
        if isinstance(kind, str | list | dict):
            return self.column(kind, namespace, where)
        raise SchemaFileError(f"field {where!r} has the Avro type {t!r}, which is not one")

    def logical(self, t: dict[str, Any], namespace: str | None, logical: str) -> AvroColumn | None:
        kind = t.get("type")
        if kind == "fixed":
            self.define(t, namespace)
        if logical in _RAW_LOGICAL:
            raw, final = _RAW_LOGICAL[logical]
            return AvroColumn(final, raw, False)
        if logical == "uuid":
            if kind == "fixed":
                return AvroColumn(pa.string(), pa.string(), False, _uuid_text)
            return AvroColumn(pa.string(), pa.string(), False)
        if logical == "duration" and int(t.get("size", 0)) == 12:
            return AvroColumn(DURATION, pa.binary(12), False)
        if logical == "decimal":
            precision, scale = int(t.get("precision", 0)), int(t.get("scale", 0))
            if not 0 < precision or not 0 <= scale <= precision:
                return None  # an invalid decimal is its underlying type (the Avro spec)
            if precision <= MAX_DECIMAL_PRECISION:
                dtype = pa.decimal128(precision, scale)
                return AvroColumn(dtype, dtype, False)
            return AvroColumn(pa.string(), pa.decimal256(min(precision, 76), scale), False)
        return None

    def union(self, t: list, namespace: str | None, where: str) -> AvroColumn:
        branches = [b for b in t if b != "null"]
        nullable = len(branches) < len(t)
        if not branches:
            return AvroColumn(pa.string(), pa.string(), True)
        if len(branches) == 1:
            inner = self.column(branches[0], namespace, where)
            return AvroColumn(inner.final, inner.raw, True, inner.prep)
        members = [self.column(b, namespace, f"{where}.member{i}") for i, b in enumerate(branches)]
        keys = [self.branch_key(b, namespace) for b in branches]
        final = pa.struct(
            [pa.field(f"member{i}", m.final, nullable=True) for i, m in enumerate(members)]
        )
        raw = pa.struct([pa.field(f"member{i}", m.raw) for i, m in enumerate(members)])
        return AvroColumn(final, raw, nullable, _union_prep(keys, [m.prep for m in members]))

    def default_value(self, t: Any, d: Any, namespace: str | None) -> Any:
        """A field's JSON default ``d`` as fastavro would read a value of type ``t`` (with
        :func:`plain_schema`); raises ValueError (or TypeError, KeyError) when ``d`` is not a
        value of ``t``. Named types must be known (the schema's columns mapped first)."""
        if isinstance(t, list):
            non_null = [b for b in t if b != "null"]
            twins = _twin_kinds(_primitive_kind(b) for b in t)
            for b in t:  # Avro: the first branch; a later one as a lenient fallback
                try:
                    value = self.default_value(b, d, namespace)
                except (ValueError, TypeError, KeyError, AttributeError):
                    continue
                if value is not None and len(non_null) > 1 and _named(b):
                    return (self.branch_key(b, namespace)[1], value)
                if value is not None and _primitive_kind(b) in twins:
                    kind = _primitive_kind(b)  # as fastavro reads it, tagged
                    return (_WRAPPED[kind], {kind: value})
                return value
            raise ValueError(f"the default {d!r} is of no branch of {t!r}")
        if isinstance(t, str):
            if t == "null":
                if d is not None:
                    raise ValueError("not null")
                return None
            if t in _PRIMITIVES:
                return _primitive_default(t, d)
            _, named, ns = self.lookup(t, namespace, "default")
            return self.default_value(named, d, ns)
        kind = t.get("type")
        logical = t.get("logicalType")
        if kind in ("record", "error"):
            if not isinstance(d, dict):
                raise TypeError("a record's default is an object")
            inner = _namespace_of(t, namespace)
            out = {}
            for f in t.get("fields", []):
                if f["name"] in d:
                    out[f["name"]] = self.default_value(f["type"], d[f["name"]], inner)
                elif "default" in f:
                    out[f["name"]] = self.default_value(f["type"], f["default"], inner)
                else:
                    raise KeyError(f["name"])
            return out
        if kind == "enum":
            if d not in t.get("symbols", []):
                raise ValueError(f"{d!r} is not a symbol")
            return d
        if kind == "fixed":
            value = _primitive_default("bytes", d)
            if len(value) != int(t.get("size", -1)):
                raise ValueError("a fixed default of another size")
            return _decimal_default(t, value) if logical == "decimal" else value
        if kind == "array":
            if not isinstance(d, list):
                raise TypeError("an array's default is a list")
            return [self.default_value(t["items"], x, namespace) for x in d]
        if kind == "map":
            if not isinstance(d, dict):
                raise TypeError("a map's default is an object")
            return {str(k): self.default_value(t["values"], v, namespace) for k, v in d.items()}
        if kind == "bytes" and logical == "decimal":
            return _decimal_default(t, _primitive_default("bytes", d))
        if isinstance(kind, str | list | dict):
            return self.default_value(kind, d, namespace)
        raise ValueError(f"no default for {t!r}")

    def branch_key(self, b: Any, namespace: str | None) -> tuple[str, str | None]:
        """(the Avro kind of a union branch, its full name when named)."""
        if isinstance(b, str):
            if b in _PRIMITIVES:
                return b, None
            full, named, _ = self.lookup(b, namespace, "union")
            return named.get("type", "record"), full
        kind = b.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            return kind, _full_name(b["name"], namespace)
        if isinstance(kind, str) and kind in _PRIMITIVES:
            if b.get("logicalType") == "decimal" and kind == "bytes":
                return "decimal", None
            return kind, None
        return str(kind), None


def _primitive_default(kind: str, d: Any) -> Any:
    if kind == "boolean" and isinstance(d, bool):
        return d
    if kind in ("int", "long") and isinstance(d, int) and not isinstance(d, bool):
        bits = 32 if kind == "int" else 64
        if not -(2 ** (bits - 1)) <= d < 2 ** (bits - 1):
            raise ValueError(f"{d} is out of an Avro {kind}'s range")
        return d
    if kind in ("float", "double"):
        if isinstance(d, int | float) and not isinstance(d, bool):
            return float(d)
        if d in ("NaN", "Infinity", "-Infinity"):
            return float(d.replace("Infinity", "inf"))
    if kind == "string" and isinstance(d, str):
        return d
    if kind == "bytes" and isinstance(d, str):
        return d.encode("iso-8859-1")  # Avro's JSON: one code point per byte
    raise TypeError(f"{d!r} is not an Avro {kind}")


def _decimal_default(t: dict[str, Any], value: bytes) -> Any:
    precision, scale = int(t.get("precision", 0)), int(t.get("scale", 0))
    if not 0 < precision or not 0 <= scale <= precision:
        return value  # an invalid decimal is its underlying type
    unscaled = decimal.Decimal(int.from_bytes(value, "big", signed=True))
    return unscaled.scaleb(-scale, context=decimal.Context(prec=80))


def _logical_applies(logical: str, kind: Any) -> bool:
    on = _LOGICAL_ON.get(logical)
    if on is None:
        return False
    return kind in on if isinstance(on, tuple) else kind == on


# -- Python per value, only where a column needs it ------------------------------------------


def _record_prep(preps: list[tuple[str, Callable[[Any], Any]]]) -> Callable[[Any], Any]:
    def prep(value: Any) -> Any:
        if value is None:
            return None
        out = dict(value)
        for name, p in preps:
            out[name] = p(value.get(name))
        return out

    return prep


def _list_prep(p: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else [p(v) for v in value]


def _map_prep(p: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else {k: p(v) for k, v in value.items()}


def _uuid_text(value: Any) -> Any:
    import uuid

    return None if value is None else str(uuid.UUID(bytes=bytes(value)))


def _plain(value: Any) -> Any:
    """A fastavro value as Avro's JSON encoding holds it."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        if value[0] in _BRANCH_OF:  # a twin primitive's branch, read as a record (plain_schema)
            return _plain(value[1])
        return {value[0]: _plain(value[1])}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("iso-8859-1")
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


def _as_json(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False)


def _fits_float32(value: float) -> bool:
    try:
        return struct.unpack("f", struct.pack("f", value))[0] == value or value != value
    except OverflowError:
        return False


def _union_prep(
    keys: list[tuple[str, str | None]], preps: list[Callable[[Any], Any] | None]
) -> Callable[[Any], Any]:
    """A value of a multi-type union as {"member<i>": value} of its branch. fastavro reads a
    named branch as (full name, value), and an int or long (float or double) branch of a union
    that has both as {kind: value} (see :func:`plain_schema`; with named-type tags, as (its
    wrapper's name, {kind: value})): the branch written, which the value alone cannot tell. The
    other branches come back as Python values whose type says the branch."""
    names = {full: i for i, (_, full) in enumerate(keys) if full is not None}
    twins = _twin_kinds(kind for kind, full in keys if full is None)
    mine = {k: i for i, (k, full) in enumerate(keys) if full is None and k in twins}
    names.update({_WRAPPED[k]: i for k, i in mine.items()})
    by_kind: dict[str, list[int]] = {}
    for i, (kind, full) in enumerate(keys):
        if full is None:
            by_kind.setdefault(kind, []).append(i)
    untagged = {} if "map" in by_kind else mine  # a map's dict would be ambiguous: tagged
    ints = by_kind.get("int", []) + by_kind.get("long", [])
    floats = by_kind.get("float", []) + by_kind.get("double", [])

    def branch(value: Any) -> int:
        if isinstance(value, tuple) and len(value) == 2 and value[0] in names:
            return names[value[0]]
        if untagged and isinstance(value, dict) and len(value) == 1:
            found = untagged.get(next(iter(value)))
            if found is not None:
                return found
        if isinstance(value, bool):
            return by_kind["boolean"][0]
        if isinstance(value, int):
            for i in ints:
                if keys[i][0] == "long" or -(2**31) <= value < 2**31:
                    return i
        if isinstance(value, float):
            for i in floats:
                if keys[i][0] == "double" or _fits_float32(value):
                    return i
        if isinstance(value, str):
            return by_kind["string"][0]
        if isinstance(value, decimal.Decimal):
            return by_kind["decimal"][0]
        if isinstance(value, bytes | bytearray):
            return by_kind["bytes"][0]
        if isinstance(value, dict):
            return by_kind["map"][0]
        if isinstance(value, list):
            return by_kind["array"][0]
        raise KeyError(type(value).__name__)

    def prep(value: Any) -> Any:
        if value is None:
            return None
        try:
            i = branch(value)
        except (KeyError, IndexError):
            raise ValueError(f"a {type(value).__name__} matches no branch of the union") from None
        if isinstance(value, tuple):
            value = value[1]
        if keys[i][1] is None and keys[i][0] in mine:
            value = value[keys[i][0]]
        p = preps[i]
        return {f"member{i}": p(value) if p is not None else value}

    return prep


# -- the schema fastavro reads with ----------------------------------------------------------


_NEVER = {"type": "fixed", "name": "kafka_delta.never_written", "size": 0}
# Avro's twin primitives: a value of one is a value of the other (600 is an int and a long).
_TWINS = (("int", "long"), ("float", "double"))
# The record each twin branch is read as: a record of one field is encoded as that field, so
# the bytes read the same, and the field's name (the kind) says the branch fastavro read.
_WRAPPED = {kind: f"kafka_delta.branch_{kind}" for pair in _TWINS for kind in pair}
_BRANCH_OF = {name: kind for kind, name in _WRAPPED.items()}
_TAGS = ""  # in _plain_in's state (no name is empty): a union needs named-type tags


def _twin_kinds(kinds: Any) -> set[str]:
    """The kinds among a union's branch ``kinds`` whose twin is a branch too."""
    present = set(kinds)
    return {k for pair in _TWINS if set(pair) <= present for k in pair}


def _primitive_kind(b: Any) -> str | None:
    """The primitive a union branch is (``"int"``, ``{"type": "int", ...}``), or None."""
    kind = b.get("type") if isinstance(b, dict) else b
    return kind if isinstance(kind, str) and kind in _PRIMITIVES else None


def plain_schema(schema: Any) -> Any:
    """A copy of ``schema`` for fastavro: logical types other than decimal left out (their
    values come back plain and become columns as whole Arrow columns), and each multi-type
    union with named branches given one more named branch that no writer uses (appended: the
    branch indexes written stay valid), so that fastavro's ``return_named_type_override``
    returns their values as (name, value) while ``["null", record]`` stays a plain value.

    A union with both ``int`` and ``long`` (or ``float`` and ``double``) branches has those
    branches read as records :data:`_WRAPPED` of one field named after the kind (same bytes):
    fastavro then returns the branch written, ``{"long": 600}`` (600 written as a long is the
    long's, though an int holds it), which neither the value nor fastavro's plain read says;
    the plain call suffices unless the union has a map branch too (whose dict could look the
    same: then named-type tags tell them apart)."""
    return plain_schema_tagged(schema)[0]


def plain_schema_tagged(schema: Any) -> tuple[Any, bool]:
    """(:func:`plain_schema`, whether any of its unions needs fastavro's named-type tags): a
    schema without such a union reads with fastavro's plain, faster call."""
    state: dict[str, bool] = {}
    plain = _plain_in(copy.deepcopy(schema), state)
    return plain, bool(state.get(_TAGS))


def _plain_in(t: Any, state: dict[str, bool]) -> Any:
    """``state`` holds the names defined so far (a named type is defined once, where fastavro
    meets it first, then used by name: this walk follows fastavro's order), and :data:`_TAGS`
    when a union needs fastavro's named-type tags."""
    if isinstance(t, list):
        twins = _twin_kinds(_primitive_kind(b) for b in t)
        out = []
        for b in t:
            kind = _primitive_kind(b)
            if kind in twins:
                out.append(_defined(state, _WRAPPED[kind], kind))
            else:
                out.append(_plain_in(b, state))
        non_null = [b for b in t if b != "null"]
        named = len(non_null) > 1 and any(_named(b) for b in non_null)
        if named and not twins:  # the wrappers already make it a union of several names
            out.append(_defined(state, _NEVER["name"], None))
        if named or (twins and any(_kind_of(b) == "map" for b in non_null)):
            state[_TAGS] = True
        return out
    if not isinstance(t, dict):
        return t
    logical = t.get("logicalType")
    if logical is not None and logical not in _KEPT_LOGICAL:
        t = {k: v for k, v in t.items() if k != "logicalType"}
    kind = t.get("type")
    if kind in ("record", "error"):
        t["fields"] = [{**f, "type": _plain_in(f["type"], state)} for f in t.get("fields", [])]
    elif kind == "array":
        t["items"] = _plain_in(t["items"], state)
    elif kind == "map":
        t["values"] = _plain_in(t["values"], state)
    elif isinstance(kind, list | dict):
        t["type"] = _plain_in(kind, state)
    return t


def _defined(state: dict[str, bool], name: str, kind: str | None) -> Any:
    """The named type ``name`` (``kind``'s wrapper, or :data:`_NEVER` when None): its
    definition the first time, its name after."""
    if name in state:
        return name
    state[name] = True
    if kind is None:
        return dict(_NEVER)
    return {"type": "record", "name": name, "fields": [{"name": kind, "type": kind}]}


def _kind_of(b: Any) -> Any:
    return b.get("type") if isinstance(b, dict) else b


def _named(b: Any) -> bool:
    if isinstance(b, str):
        return b not in _PRIMITIVES and b != "null"
    return isinstance(b, dict) and b.get("type") in ("record", "error", "enum", "fixed")
