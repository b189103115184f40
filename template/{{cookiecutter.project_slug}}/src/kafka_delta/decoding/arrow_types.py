"""Schemas of each format as Arrow schemas (the columns the transform receives), and the union
of several versions of one schema (the reader schema of a topic whose producers evolve)."""

from __future__ import annotations

import base64
import importlib
import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from kafka_delta.decoding.spec import SchemaFileError, SchemaIncompatibleError

TIMESTAMP = pa.timestamp("us", tz="UTC")

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


# -- Avro ----------------------------------------------------------------------------------


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


# -- Protobuf ------------------------------------------------------------------------------


def protobuf_descriptor(data: bytes | str, message: str | None, index: Iterable[int] = ()) -> Any:
    """The message descriptor ``message`` (or, by the message indexes of Confluent's framing,
    ``index``; else the first message) of ``data``: a FileDescriptorSet's bytes (a project's
    descriptor file), or a registry's base64 FileDescriptorProto (``format=serialized``)."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    files = _file_protos(data)
    known = {f.name for f in files}
    default = descriptor_pool.Default()
    for name in {d for f in files for d in f.dependency} - known:
        try:  # well-known types (google/protobuf/timestamp.proto, ...), once their module loads
            if name.startswith("google/protobuf/") and name.endswith(".proto"):
                importlib.import_module(name[: -len(".proto")].replace("/", ".") + "_pb2")
            well_known = default.FindFileByName(name)
        except (KeyError, ImportError):
            raise SchemaFileError(
                f"the protobuf schema imports {name}, which is neither in it nor a well-known "
                "type: build the descriptor set with --include_imports"
            ) from None
        proto = descriptor_pb2.FileDescriptorProto()
        well_known.CopyToProto(proto)
        files.insert(0, proto)
    for proto in _in_dependency_order(files):
        pool.Add(proto)
    if message:
        try:
            return pool.FindMessageTypeByName(message)
        except KeyError:
            raise SchemaFileError(f"the protobuf schema has no message {message!r}") from None
    main = pool.FindFileByName(files[-1].name)
    path = list(index) or [0]
    try:
        found = list(main.message_types_by_name.values())[path[0]]
        for i in path[1:]:
            found = found.nested_types[i]
    except IndexError:
        raise SchemaFileError(f"the protobuf schema has no message at index {path}") from None
    return found


def _file_protos(data: bytes | str) -> list[Any]:
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    if isinstance(data, str):  # the registry's serialized form: one file, base64
        proto = descriptor_pb2.FileDescriptorProto()
        try:
            proto.ParseFromString(base64.b64decode(data))
        except (DecodeError, ValueError) as exc:
            raise SchemaFileError(f"not a serialized protobuf schema: {exc}") from None
        return [proto]
    file_set = descriptor_pb2.FileDescriptorSet()
    try:
        file_set.ParseFromString(data)
    except DecodeError as exc:
        raise SchemaFileError(f"not a protobuf descriptor set: {exc}") from None
    if not file_set.file:
        raise SchemaFileError("the protobuf descriptor set holds no file")
    return list(file_set.file)


def _in_dependency_order(files: list[Any]) -> list[Any]:
    by_name = {f.name: f for f in files}
    done: list[Any] = []
    seen: set[str] = set()

    def visit(f: Any) -> None:
        if f.name in seen:
            return
        seen.add(f.name)
        for dep in f.dependency:
            if dep in by_name:
                visit(by_name[dep])
        done.append(f)

    for f in files:
        visit(f)
    return done


def protobuf_to_arrow(
    data: bytes | str, message: str | None, index: Iterable[int] = ()
) -> pa.Schema:
    return message_to_arrow(protobuf_descriptor(data, message, index))


def message_to_arrow(descriptor: Any) -> pa.Schema:
    """A message descriptor's fields as columns (every one nullable: proto3 has defaults, and
    fields with presence read null when unset)."""
    return pa.schema(_proto_fields(descriptor))


def _proto_fields(descriptor: Any) -> list[pa.Field]:
    return [pa.field(f.name, _proto_type(f), nullable=True) for f in descriptor.fields]


def _proto_type(field: Any) -> pa.DataType:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = (
            field.message_type.fields_by_name["key"],
            field.message_type.fields_by_name["value"],
        )
        return pa.map_(_proto_scalar(key), _proto_scalar(value))
    item = _proto_scalar(field)
    if is_repeated(field):
        return pa.list_(item)
    return item


def is_repeated(field: Any) -> bool:
    """A repeated field (protobuf 5 and 6: ``label`` is deprecated in 6)."""
    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return bool(repeated() if callable(repeated) else repeated)
    from google.protobuf.descriptor import FieldDescriptor as F

    return bool(field.label == F.LABEL_REPEATED)


def _proto_scalar(field: Any) -> pa.DataType:
    from google.protobuf.descriptor import FieldDescriptor as F

    t = field.type
    if t == F.TYPE_MESSAGE:
        if field.message_type.full_name == "google.protobuf.Timestamp":
            return TIMESTAMP
        return pa.struct(_proto_fields(field.message_type))
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return pa.int32()
    if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64, F.TYPE_UINT32, F.TYPE_FIXED32):
        return pa.int64()
    if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return pa.decimal128(20, 0)
    return {
        F.TYPE_BOOL: pa.bool_(),
        F.TYPE_FLOAT: pa.float32(),
        F.TYPE_DOUBLE: pa.float64(),
        F.TYPE_STRING: pa.string(),
        F.TYPE_BYTES: pa.binary(),
        F.TYPE_ENUM: pa.string(),
    }[t]


# -- JSON Schema ---------------------------------------------------------------------------


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


# -- versions ------------------------------------------------------------------------------


def union_schemas(schemas: Iterable[pa.Schema]) -> pa.Schema:
    """Every field of every version, in the order fields first appear, all nullable. A field
    whose type differs between versions, or one required (not nullable) in a version and
    missing from another, is an incompatible change."""
    versions = list(schemas)
    fields: dict[str, pa.Field] = {}
    for schema in versions:
        for f in schema:
            seen = fields.get(f.name)
            if seen is None:
                fields[f.name] = f
            elif not _same_type(seen.type, f.type):
                raise SchemaIncompatibleError(
                    f"field {f.name!r} changed type from {seen.type} to {f.type} between "
                    "versions of the producers' schema: the table cannot hold both"
                )
    for name, f in fields.items():
        if not f.nullable and any(name not in s.names for s in versions):
            raise SchemaIncompatibleError(
                f"required field {name!r} ({f.type}) was removed in a version of the producers' "
                "schema (or renamed): old and new records cannot share the table's column"
            )
    return pa.schema([f.with_nullable(True) for f in fields.values()])


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal types, nested nullability aside."""
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return [f.name for f in a] == [f.name for f in b] and all(
            _same_type(x.type, y.type) for x, y in zip(a, b, strict=True)
        )
    if pa.types.is_list(a) and pa.types.is_list(b):
        return _same_type(a.value_type, b.value_type)
    return a == b


def compare_writer(reader: pa.Schema, writer: pa.Schema, schema_id: int | str) -> list[str]:
    """The writer's fields the reader lacks; raises when a shared field changed type."""
    new = []
    for f in writer:
        if f.name not in reader.names:
            new.append(f.name)
            continue
        mine = reader.field(f.name).type
        if not _same_type(mine, f.type):
            raise SchemaIncompatibleError(
                f"field {f.name!r} is {f.type} in writer schema {schema_id} but {mine} in the "
                "table's schema: a type change the table cannot follow; nothing was written"
            )
    return new
