"""JSON Schema documents as Arrow schemas: the columns a JSON value becomes, and its required
fields.

=============================================  ====================================
JSON Schema                                    column
=============================================  ====================================
``integer``                                    ``long`` (int64)
``number``                                     ``double``
``boolean``                                    ``boolean``
``string``                                     ``string``
``string`` with ``format: date-time``          ``timestamp`` (UTC, microseconds)
``string`` with ``format: date``               ``date``
``string`` ``enum`` / ``const`` (no ``type``)  ``string``
``array`` of X (``items``)                     ``array<X>`` (no ``items``: ``array<string>``)
``object`` with ``properties``                 ``struct<...>``, in the properties' order
``type: [X, "null"]``                          X, nullable
``oneOf`` / ``anyOf`` of X and ``null``        X, nullable
``$ref`` (``#/definitions/..``,                what it points to (in the same document)
``#/$defs/..``, any ``#/..`` pointer)
``allOf`` of one schema                        that schema
=============================================  ====================================

Every column is nullable; a top-level property in ``required`` (of the record's own writer
schema) makes a record without it, or with null where its type does not take null, a dead
letter (:func:`required_of`). What maps to no one column type (a union of two types, an object
without properties, a recursive ``$ref``) is refused with the property's path.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from kafka_delta.decoding.spec import SchemaFileError
from kafka_delta.decoding.versions import TIMESTAMP

_SCALARS = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
_STRING_FORMATS = {"date-time": TIMESTAMP, "date": pa.date32()}


def json_schema_to_arrow(text: str | dict[str, Any]) -> tuple[pa.Schema, list[str]]:
    """(the columns, the required top-level fields) of a JSON Schema document of an object."""
    try:
        doc = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError as exc:
        raise SchemaFileError(f"not a JSON Schema document: {exc}") from None
    if not isinstance(doc, dict):
        raise SchemaFileError("the JSON Schema must describe an object with properties")
    root, _ = _resolve(doc, doc, "/", ())
    kind, _ = _json_kind(root, "/")
    if kind != "object" or not isinstance(root.get("properties"), dict) or not root["properties"]:
        raise SchemaFileError("the JSON Schema must describe an object with properties")
    fields = [
        pa.field(name, _json_type(doc, prop, f"/{name}", ()), nullable=True)
        for name, prop in root["properties"].items()
    ]
    return pa.schema(fields), list(root.get("required", []))


def required_of(text: str | dict[str, Any]) -> dict[str, bool]:
    """The required top-level fields of a JSON Schema document of an object (as
    :func:`json_schema_to_arrow` reads it), each with whether null is a value of its type: a
    record must have each, and null only where its type takes null (``["string", "null"]``),
    or it is not a record of the schema."""
    doc = json.loads(text) if isinstance(text, str) else text
    root, _ = _resolve(doc, doc, "/", ())
    properties = root.get("properties", {})
    out = {}
    required = root.get("required", [])
    for name in required if isinstance(required, list) else []:
        prop = properties.get(name, {})
        resolved, _ = _resolve(doc, prop, f"/{name}", ())
        out[name] = prop == {} or prop is True or _json_kind(resolved, f"/{name}")[1]
    return out


def _pointer(doc: dict[str, Any], ref: str, where: str) -> Any:
    if not ref.startswith("#"):
        raise SchemaFileError(
            f"{where}: $ref {ref!r} points outside the document; only local references "
            "(#/definitions/..., #/$defs/...) resolve"
        )
    node: Any = doc
    for part in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise SchemaFileError(f"{where}: $ref {ref!r} points to nothing in the document")
    if not isinstance(node, dict):
        raise SchemaFileError(f"{where}: $ref {ref!r} is not a schema")
    return node


def _resolve(
    doc: dict[str, Any], prop: Any, where: str, refs: tuple[str, ...]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``prop`` with ``$ref``, single-schema ``allOf`` and ``oneOf``/``anyOf`` of one schema and
    null followed; a nullable union becomes the schema with ``"null"`` in its types."""
    if prop is True or prop == {}:
        return {}, refs
    if not isinstance(prop, dict):
        raise SchemaFileError(f"{where}: not a JSON Schema: {json.dumps(prop)[:60]}")
    if "$ref" in prop:
        ref = prop["$ref"]
        if ref in refs:
            raise SchemaFileError(
                f"{where}: $ref {ref!r} is recursive: a recursive schema has no column type"
            )
        target = _pointer(doc, ref, where)
        # keywords beside $ref (draft 2019-09+) add to the target: a nullable type survives
        merged = {**target, **{k: v for k, v in prop.items() if k != "$ref"}}
        return _resolve(doc, merged, where, (*refs, ref))
    for keyword in ("oneOf", "anyOf"):
        if keyword in prop:
            branches = prop[keyword]
            if not isinstance(branches, list):
                raise SchemaFileError(f"{where}: {keyword} is not a list")
            rest = {k: v for k, v in prop.items() if k != keyword}
            nulls = [b for b in branches if isinstance(b, dict) and b.get("type") == "null"]
            others = [b for b in branches if b not in nulls]
            if len(others) != 1:
                raise SchemaFileError(
                    f"{where}: {keyword} of {len(others)} schemas besides null does not map to "
                    "one column type"
                )
            inner, refs = _resolve(doc, {**rest, **others[0]}, where, refs)
            if nulls:
                inner = _with_null(inner)
            return inner, refs
    if "allOf" in prop:
        branches = prop["allOf"]
        if not isinstance(branches, list) or len(branches) != 1:
            raise SchemaFileError(f"{where}: allOf of several schemas does not map to a column")
        rest = {k: v for k, v in prop.items() if k != "allOf"}
        inner, refs = _resolve(doc, branches[0], where, refs)
        return {**inner, **rest}, refs
    return prop, refs


def _with_null(prop: dict[str, Any]) -> dict[str, Any]:
    kind = prop.get("type")
    if kind is None:
        return prop
    kinds = kind if isinstance(kind, list) else [kind]
    return {**prop, "type": [*kinds, "null"] if "null" not in kinds else kinds}


def _json_kind(prop: dict[str, Any], where: str) -> tuple[str, bool]:
    """(the one JSON type of ``prop``, whether null is allowed too)."""
    kind = prop.get("type")
    if kind is None:
        if "properties" in prop:
            kind = "object"
        elif "items" in prop:
            kind = "array"
        elif "enum" in prop or "const" in prop:
            values = prop.get("enum", [prop.get("const")])
            if all(isinstance(v, str) or v is None for v in values):
                return "string", None in values
            raise SchemaFileError(f"{where}: an enum of other values than strings has no type")
        else:
            kind = "object"
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise SchemaFileError(
                f"{where}: JSON Schema type {kind} does not map to one column type"
            )
        return kinds[0], len(kinds) != len(kind)
    return kind, False


def _json_type(doc: dict[str, Any], prop: Any, where: str, refs: tuple[str, ...]) -> pa.DataType:
    prop, refs = _resolve(doc, prop, where, refs)
    kind, _ = _json_kind(prop, where)
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "string":
        return _STRING_FORMATS.get(prop.get("format", ""), pa.string())
    if kind == "array":
        items = prop.get("items", {"type": "string"})
        if isinstance(items, list):  # draft 4-7 tuple form: one type for all, or refused
            if len(items) != 1:
                raise SchemaFileError(f"{where}: a tuple of items does not map to one column type")
            items = items[0]
        return pa.list_(_json_type(doc, items, f"{where}/items", refs))
    if kind == "object":
        properties = prop.get("properties")
        if not isinstance(properties, dict) or not properties:
            raise SchemaFileError(
                f"{where}: an object without properties has no columns (give its properties, "
                "or decode with format raw)"
            )
        return pa.struct(
            [pa.field(n, _json_type(doc, p, f"{where}/{n}", refs)) for n, p in properties.items()]
        )
    raise SchemaFileError(f"{where}: the JSON Schema type {kind!r} is not a column type")


def read_schema(reader: pa.Schema) -> pa.Schema:
    """The schema pyarrow's JSON reader parses with: dates as timestamps (it cannot read a
    date from a string), cast to the reader schema after."""
    return pa.schema([f.with_type(_readable(f.type)) for f in reader])


def _readable(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_date32(kind):
        return pa.timestamp("s")
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_readable(f.type)) for f in kind])
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_readable(kind.value_type)))
    return kind
