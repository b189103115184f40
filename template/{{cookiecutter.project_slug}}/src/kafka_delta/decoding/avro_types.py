"""Avro schemas as Arrow schemas: the columns an Avro value (or key) becomes."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from kafka_delta.decoding.spec import SchemaFileError
from kafka_delta.decoding.versions import TIMESTAMP

_AVRO_PRIMITIVES = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
_AVRO_LOGICAL = {
    "timestamp-millis": TIMESTAMP,
    "timestamp-micros": TIMESTAMP,
    "local-timestamp-millis": TIMESTAMP,
    "local-timestamp-micros": TIMESTAMP,
    "date": pa.date32(),
    "uuid": pa.string(),
}


def avro_to_arrow(schema: str | dict[str, Any]) -> pa.Schema:
    """A record schema as its fields; any other schema (a key of type string, say) as one
    field named ``value``."""
    parsed = json.loads(schema) if isinstance(schema, str) else schema
    named: dict[str, Any] = {}
    if isinstance(parsed, dict) and parsed.get("type") == "record":
        return pa.schema(_avro_fields(parsed, named))
    arrow_type, nullable = _avro_type(parsed, named, "value")
    return pa.schema([pa.field("value", arrow_type, nullable=nullable)])


def _avro_fields(record: dict[str, Any], named: dict[str, Any]) -> list[pa.Field]:
    namespace = record.get("namespace")
    name = record.get("name", "")
    full = name if "." in name or not namespace else f"{namespace}.{name}"
    named[full] = record
    named[name] = record
    fields = []
    for f in record.get("fields", []):
        arrow_type, nullable = _avro_type(f["type"], named, f["name"])
        fields.append(pa.field(f["name"], arrow_type, nullable=nullable))
    return fields


def _avro_type(t: Any, named: dict[str, Any], where: str) -> tuple[pa.DataType, bool]:
    """(Arrow type, nullable) of an Avro type."""
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        if len(branches) != 1:
            raise SchemaFileError(
                f'field {where!r} is a union of {t}: only ["null", <type>] unions map to a column'
            )
        arrow_type, _ = _avro_type(branches[0], named, where)
        return arrow_type, True
    if isinstance(t, str):
        if t in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[t], t == "null"
        if t in named:
            return _avro_type(named[t], named, where)
        raise SchemaFileError(f"field {where!r} has the unknown Avro type {t!r}")
    kind = t.get("type")
    logical = t.get("logicalType")
    if logical in _AVRO_LOGICAL:
        return _AVRO_LOGICAL[logical], False
    if logical == "decimal":
        return pa.decimal128(int(t["precision"]), int(t.get("scale", 0))), False
    if kind == "record":
        return pa.struct(_avro_fields(t, named)), False
    if kind == "enum":
        named[t["name"]] = t
        return pa.string(), False
    if kind == "fixed":
        named[t["name"]] = t
        return pa.binary(), False
    if kind == "array":
        item, nullable = _avro_type(t["items"], named, where)
        return pa.list_(pa.field("element", item, nullable=nullable)), False
    if kind == "map":
        item, nullable = _avro_type(t["values"], named, where)
        return pa.map_(pa.string(), pa.field("value", item, nullable=nullable)), False
    return _avro_type(kind, named, where)
