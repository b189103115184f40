"""Protobuf descriptors as Arrow schemas: the columns a Protobuf message becomes, and the
message a record was written with (by name, or by the message indexes of Confluent's framing).

Which message the table takes
-----------------------------
``decoding.<part>.message`` (a full name, ``package.Message`` or ``package.Outer.Inner``) when
set: an override. Else the records decide, as their frames name their message (the
message-index path, nested messages included): a table that exists takes the message whose
fields are its columns (:func:`message_of_columns`); a new table starts from the file's
default (:func:`default_message`: its one top-level message; or, of several, the one no other
message uses as a field type; or the first of those), a guess that a batch of records of
another message replaces (:class:`.spec.MessageSeenError`: the query restarts with that
message's columns). Then a record of another message than the table's is a dead letter saying
which message it carries and which ``message:`` would take it. Two messages' fields never
share a table.

Schema references (``import``) are resolved through the registry (each reference's subject and
version, recursively); well-known imports (``google/protobuf/*``, ``google/type/*``,
``confluent/*``) need none.

Type mapping (every column nullable)
------------------------------------
========================================  ==================================================
Protobuf                                  Delta (Arrow)
========================================  ==================================================
double / float                            double / float
int32, sint32, sfixed32                   int
int64, sint64, sfixed64, uint32, fixed32  bigint
uint64, fixed64                           decimal(20,0)
bool / string / bytes                     boolean / string / binary
enum                                      string: the value's name (an unknown number: its
                                          decimal text)
message                                   struct of its fields
message without fields                    boolean: true when set, null when not
repeated T                                array<T>
map<K, V>                                 map<K, V>
oneof                                     each member its own column, null unless it is set
field with presence unset                 null (proto3 ``optional``, proto2, messages, oneof);
                                          a proto3 scalar without presence reads its default
google.protobuf.Timestamp                 timestamp (UTC, microseconds; nanoseconds below a
                                          microsecond are dropped)
google.protobuf.Duration                  bigint: microseconds (truncated toward zero; Delta
                                          has no interval type)
google.protobuf.*Value wrappers           the wrapped scalar, null when the wrapper is unset
google.protobuf.Struct, Value, ListValue  string: JSON (as google.protobuf.json_format
                                          writes it)
google.protobuf.Any                       string: JSON of the packed message with its
                                          ``@type`` when its type is in the schema's files,
                                          else ``{"@type": url, "value": base64}``
a message containing itself (recursion)   string: JSON of the sub-message (json_format, the
                                          .proto field names), from the field that recurses
========================================  ==================================================
"""

from __future__ import annotations

import base64
import importlib
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from kafka_delta.decoding.spec import SchemaFileError
from kafka_delta.decoding.versions import TIMESTAMP

TIMESTAMP_TYPE = "google.protobuf.Timestamp"
DURATION_TYPE = "google.protobuf.Duration"
WRAPPERS = frozenset(
    f"google.protobuf.{n}Value"
    for n in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
)
JSON_TYPES = frozenset(f"google.protobuf.{n}" for n in ("Struct", "Value", "ListValue", "Any"))
# Imports Confluent's serializer never registers as references (its ``_is_builtin``): the
# modules that put them in the default descriptor pool.
_BUILTIN_MODULES = {
    "confluent/meta.proto": "confluent_kafka.schema_registry.confluent.meta_pb2",
    "confluent/type/decimal.proto": "confluent_kafka.schema_registry.confluent.types.decimal_pb2",
}


def protobuf_file(data: bytes | str, imports: Sequence[tuple[str, str]] = ()) -> Any:
    """The file descriptor of ``data`` (a FileDescriptorSet's bytes: its last file; or a
    registry's base64 FileDescriptorProto, ``format=serialized``), in a pool of its own with
    ``imports`` (the registry's references: (import name, base64 FileDescriptorProto)) and the
    well-known files it imports."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    files = _file_protos(data)
    for name, text in imports:
        proto = _serialized(text)
        proto.name = name  # the name the importing file uses (Confluent's reference name)
        files.insert(0, proto)
    main = files[-1].name
    known = {f.name for f in files}
    default = descriptor_pool.Default()
    for name in {d for f in files for d in f.dependency} - known:
        well_known = _well_known(default, name)
        if well_known is None:
            raise SchemaFileError(
                f"the protobuf schema imports {name}, which is neither in it nor a well-known "
                "type: build the descriptor set with --include_imports (from a registry: the "
                "schema's references must name it)"
            )
        proto = descriptor_pb2.FileDescriptorProto()
        well_known.CopyToProto(proto)
        files.insert(0, proto)
    pool = descriptor_pool.DescriptorPool()
    try:
        for proto in _in_dependency_order(files):
            pool.Add(proto)
        return pool.FindFileByName(main)
    except (TypeError, KeyError, ValueError) as exc:
        raise SchemaFileError(f"the protobuf schema does not build: {exc}") from None


def _well_known(default: Any, name: str) -> Any:
    module = _BUILTIN_MODULES.get(name)
    if module is None and name.endswith(".proto") and name.startswith(("google/", "confluent/")):
        module = name[: -len(".proto")].replace("/", ".") + "_pb2"
    try:
        if module is not None:
            importlib.import_module(module)
        return default.FindFileByName(name)
    except (KeyError, ImportError):
        return None


def find_message(file: Any, message: str | None, index: Iterable[int] = ()) -> Any:
    """In ``file``: the message named ``message``, else the one at the message-index path
    ``index`` (Confluent's framing), else :func:`default_message`."""
    if message:
        try:
            return file.pool.FindMessageTypeByName(message)
        except KeyError:
            raise SchemaFileError(f"the protobuf schema has no message {message!r}") from None
    path = list(index)
    if not path:
        return default_message(file)
    try:
        found = list(file.message_types_by_name.values())[path[0]]
        for i in path[1:]:
            found = found.nested_types[i]
    except IndexError:
        raise SchemaFileError(f"the protobuf schema has no message at index {path}") from None
    return found


def default_message(file: Any) -> Any:
    """The message a table takes from ``file`` without ``message:``: its one top-level message;
    of several, the one no message of the file uses as a field type (the file's helpers are the
    others); when several are used by none, the first of those."""
    tops = list(file.message_types_by_name.values())
    if not tops:
        raise SchemaFileError(f"the protobuf schema {file.name} defines no message")
    if len(tops) == 1:
        return tops[0]
    used: set[str] = set()

    def uses(descriptor: Any) -> None:
        for f in descriptor.fields:
            if f.message_type is not None and f.message_type.full_name != descriptor.full_name:
                used.add(f.message_type.full_name)
        for nested in descriptor.nested_types:
            uses(nested)

    for top in tops:
        uses(top)
    roots = [t for t in tops if t.full_name not in used]
    return roots[0] if roots else tops[0]


def message_of_columns(file: Any, columns: Iterable[str]) -> str | None:
    """The message of ``file`` (top-level or nested) whose fields are all among ``columns``
    (an existing table's), the one with most fields (ties: :func:`default_message` first, then
    the file's order); None when none has a field and all its fields there."""
    have = set(columns)
    found: list[Any] = []

    def walk(descriptor: Any) -> None:
        found.append(descriptor)
        for nested in descriptor.nested_types:
            if not nested.GetOptions().map_entry:
                walk(nested)

    for top in file.message_types_by_name.values():
        walk(top)
    default = default_message(file) if found else None
    fits = [d for d in found if d.fields and {f.name for f in d.fields} <= have]
    if not fits:
        return None
    best = max(len(d.fields) for d in fits)
    fits = [d for d in fits if len(d.fields) == best]
    return (default if default in fits else fits[0]).full_name


def protobuf_descriptor(
    data: bytes | str,
    message: str | None,
    index: Iterable[int] = (),
    imports: Sequence[tuple[str, str]] = (),
) -> Any:
    """The message descriptor ``message`` (or, by the message indexes of Confluent's framing,
    ``index``; else :func:`default_message`) of ``data`` (see :func:`protobuf_file`)."""
    return find_message(protobuf_file(data, imports), message, index)


def _serialized(text: str) -> Any:
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(base64.b64decode(text, validate=True))
    except (DecodeError, ValueError) as exc:
        raise SchemaFileError(
            f"not a serialized protobuf schema (the registry's format=serialized): {exc}"
        ) from None
    return proto


def _file_protos(data: bytes | str) -> list[Any]:
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    if isinstance(data, str):  # the registry's serialized form: one file, base64
        return [_serialized(data)]
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
    data: bytes | str,
    message: str | None,
    index: Iterable[int] = (),
    imports: Sequence[tuple[str, str]] = (),
) -> pa.Schema:
    return message_to_arrow(protobuf_descriptor(data, message, index, imports))


def message_to_arrow(descriptor: Any) -> pa.Schema:
    """A message descriptor's fields as columns (every one nullable: proto3 has defaults, and
    fields with presence read null when unset)."""
    return pa.schema(_proto_fields(descriptor, (descriptor.full_name,)))


def _proto_fields(descriptor: Any, path: tuple[str, ...]) -> list[pa.Field]:
    return [pa.field(f.name, field_type(f, path), nullable=True) for f in descriptor.fields]


def is_map(field: Any) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def field_type(field: Any, path: tuple[str, ...]) -> pa.DataType:
    """The column type of ``field`` of a message reached through the messages ``path``."""
    if is_map(field):
        key, value = (
            field.message_type.fields_by_name["key"],
            field.message_type.fields_by_name["value"],
        )
        return pa.map_(scalar_type(key, path), scalar_type(value, path))
    item = scalar_type(field, path)
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


def message_kind(field: Any, path: tuple[str, ...]) -> str | None:
    """How a message-typed ``field`` (reached through ``path``) maps: ``timestamp``,
    ``duration``, ``wrapper``, ``json`` (Struct, Value, ListValue, Any), ``recursive`` (its
    type is on ``path``: JSON), ``empty`` (no fields: a boolean), ``struct``; None for a field
    that is not a message."""
    t = field.message_type
    if t is None:
        return None
    name = t.full_name
    if name == TIMESTAMP_TYPE:
        return "timestamp"
    if name == DURATION_TYPE:
        return "duration"
    if name in WRAPPERS:
        return "wrapper"
    if name in JSON_TYPES:
        return "json"
    if name in path:
        return "recursive"
    if not t.fields:
        return "empty"
    return "struct"


def scalar_type(field: Any, path: tuple[str, ...]) -> pa.DataType:
    """The type of one value of ``field`` (an item, for a repeated field)."""
    from google.protobuf.descriptor import FieldDescriptor as F

    kind = message_kind(field, path)
    if kind == "timestamp":
        return TIMESTAMP
    if kind == "duration":
        return pa.int64()
    if kind == "wrapper":
        return scalar_type(field.message_type.fields_by_name["value"], path)
    if kind in ("json", "recursive"):
        return pa.string()
    if kind == "empty":
        return pa.bool_()
    if kind == "struct":
        t = field.message_type
        return pa.struct(_proto_fields(t, (*path, t.full_name)))
    t = field.type
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
