"""Protobuf descriptors as Arrow schemas: the columns a Protobuf message becomes, and the
message a record was written with (by name, or by the message indexes of Confluent's framing)."""

from __future__ import annotations

import base64
import importlib
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from kafka_delta.decoding.spec import SchemaFileError
from kafka_delta.decoding.versions import TIMESTAMP


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
