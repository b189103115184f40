"""JSON Schema documents as Arrow schemas: the columns a JSON value becomes, and its required
fields."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from kafka_delta.decoding.spec import SchemaFileError
from kafka_delta.decoding.versions import TIMESTAMP


def json_schema_to_arrow(text: str | dict[str, Any]) -> tuple[pa.Schema, list[str]]:
    """(the columns, the required top-level fields) of a JSON Schema document of an object."""
    try:
        doc = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError as exc:
        raise SchemaFileError(f"not a JSON Schema document: {exc}") from None
    if _json_kind(doc)[0] != "object" or "properties" not in doc:
        raise SchemaFileError("the JSON Schema must describe an object with properties")
    fields = [
        pa.field(name, _json_type(prop, name), nullable=True)
        for name, prop in doc["properties"].items()
    ]
    return pa.schema(fields), list(doc.get("required", []))


def _json_kind(prop: dict[str, Any]) -> tuple[str, bool]:
    kind = prop.get("type", "object")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise SchemaFileError(f"JSON Schema type {kind} does not map to one column type")
        return kinds[0], True
    return kind, False


def _json_type(prop: dict[str, Any], where: str) -> pa.DataType:
    kind, _ = _json_kind(prop)
    if kind == "integer":
        return pa.int64()
    if kind == "number":
        return pa.float64()
    if kind == "boolean":
        return pa.bool_()
    if kind == "string":
        return {"date-time": TIMESTAMP, "date": pa.date32()}.get(
            prop.get("format", ""), pa.string()
        )
    if kind == "array":
        return pa.list_(_json_type(prop.get("items", {"type": "string"}), where))
    if kind == "object":
        return pa.struct(
            [pa.field(n, _json_type(p, n)) for n, p in prop.get("properties", {}).items()]
        )
    raise SchemaFileError(f"field {where!r} has the JSON Schema type {kind!r}, not a column type")
