"""A small Schema Registry for development and tests: a stand-in for Confluent's, beside the
embedded broker. Standard library (and protobuf, grpcio-tools for Protobuf schemas), always on
127.0.0.1, its state (schemas, ids, subjects, versions, compatibility settings) kept in a JSON
file, so a stop and a start on the same port
keep every id: tests stop it to play "registry down" and start it again.

    python -m kafka_delta_dev.schema_registry_server start --state .registry.json [--port 8081]
    python -m kafka_delta_dev.schema_registry_server url --state .registry.json
    python -m kafka_delta_dev.schema_registry_server stop --state .registry.json

``scripts/broker.sh start`` starts it together with the broker (its URL goes to
``.broker.json`` under ``schema_registry_url``; ``scripts/broker.sh registry-url`` prints it).

It speaks the subset of Confluent's REST API that confluent-kafka's ``SchemaRegistryClient`` and
its Avro, Protobuf and JSON Schema serializers and deserializers use:

- ``POST /subjects/{s}/versions`` (register; answers ``id`` and ``guid``), ``POST /subjects/{s}``
  (look-up), ``GET /subjects``, ``GET /subjects/{s}/versions``,
  ``GET /subjects/{s}/versions/{v|latest}[/referencedby]``, ``GET /subjects/{s}/metadata``
  (the latest version whose metadata properties match ``?key=&value=``),
  ``DELETE /subjects/{s}[/versions/{v}]`` (soft, then ``?permanent=true``);
- ``GET /schemas/ids/{id}`` (``?subject=``, ``?format=``), ``GET /schemas/guids/{guid}``,
  ``GET /schemas/ids/{id}/versions``, ``GET /schemas/ids/{id}/subjects``, ``GET /schemas/types``;
- ``GET|PUT|DELETE /config[/{s}]``, ``POST /compatibility/subjects/{s}/versions[/{v|latest}]``,
  ``GET /mode``, and ``GET /associations/resources/{ns}/{topic}`` (always none: the serializers
  then fall back to the topic name strategy, ``<topic>-value``).

The same schema registered twice under a subject keeps its id and version; the same schema under
two subjects shares one id. A schema's identity is its text (Avro and JSON Schema by their parsed
JSON, Protobuf by its descriptor), references, metadata and rules, as Confluent's; metadata and
rules not given are the previous version's. References (``name``, ``subject``, ``version``) must
resolve when registering, are answered with the schema, and a referenced version cannot be
deleted (42206). Protobuf is kept as .proto text and as a FileDescriptorProto whichever form it
was registered in (text, as Java, Go and .NET clients register it, is compiled by protoc from
grpcio-tools with its references; the Python serializer's base64 descriptor is written out as
text): ``?format=serialized`` answers the base64 FileDescriptorProto, any other read the text.
Compatibility (``BACKWARD`` by default, ``NONE``, ``FORWARD``, ``FULL`` and their
``_TRANSITIVE`` forms) is checked for Avro with the Avro specification's schema-resolution
rules, as Confluent's: under ``BACKWARD`` the new version must read data written with the old
one (an added field needs a default; a type change that is not a promotion is refused), and an
incompatible registration answers 409 (error code 40901). Protobuf and JSON Schema are not
checked for compatibility (every change is accepted). Errors are Confluent's JSON
(``{"error_code": 40401, "message": ...}``: 40401 subject, 40402 version, 40403 schema not
found, 42201 invalid schema, 42202 invalid version, 42206 reference exists).

What it is not: no authentication, no TLS, no contexts, no rules executed (they are stored), no
``format=resolved``, no leader election. Production points the same config keys
(``decoding.schema_registry.url`` and its auth and TLS settings) at Confluent Schema Registry,
Karapace, Redpanda's registry or Apicurio (in its Confluent-compatible API, ``/apis/ccompat/v7``).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from kafka_delta_dev.children import HOST, ChildServer, die_with_parent, free_port, wait_for_http

log = logging.getLogger(__name__)

# this module's dotted name even when it runs as ``python -m`` (then __name__ is __main__)
MODULE = __spec__.name if __spec__ is not None else __name__
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
DEFAULT_LEVEL = "BACKWARD"


class RegistryError(RuntimeError):
    """The registry could not be started, or its state file is not one."""


class ApiError(Exception):
    """An error answer in Confluent's shape: HTTP status, error_code, message."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _subject_not_found(subject: str) -> ApiError:
    return ApiError(404, 40401, f"Subject '{subject}' not found.")


def _schema_not_found(what: str = "Schema not found") -> ApiError:
    return ApiError(404, 40403, what)


# --- Avro: parsing and the specification's schema-resolution rules --------------------------

_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
# writer type -> reader types that can read it (the specification's promotions)
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}


def _fullname(name: str, namespace: str | None) -> str:
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def parse_avro(
    schema: Any, names: dict[str, Any] | None = None, namespace: str | None = None
) -> Any:
    """An Avro schema (parsed JSON) as nodes: a primitive name, a list (union), or a dict with
    ``type`` record/enum/fixed/array/map. Named types are shared objects (records may recurse).
    Raises ValueError naming what is wrong."""
    names = {} if names is None else names
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return schema
        full = _fullname(schema, namespace)
        for candidate in (full, schema):
            if candidate in names:
                return names[candidate]
        raise ValueError(f"unknown type {schema!r}")
    if isinstance(schema, list):
        branches = [parse_avro(b, names, namespace) for b in schema]
        if any(isinstance(b, list) for b in branches):
            raise ValueError("a union cannot contain a union")
        return branches
    if not isinstance(schema, dict) or "type" not in schema:
        raise ValueError(f"not an Avro schema: {json.dumps(schema)[:80]}")
    kind = schema["type"]
    if kind in _PRIMITIVES:
        return kind  # logical types resolve by their underlying type
    if kind in ("record", "error", "enum", "fixed"):
        name = schema.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {kind} needs a name")
        ns = schema.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
        full = _fullname(name, ns)
        if full in names:
            raise ValueError(f"type {full!r} is defined twice")
        node: dict[str, Any] = {
            "type": kind if kind != "error" else "record",
            "name": full,
            "aliases": [_fullname(a, ns) for a in schema.get("aliases") or []],
        }
        names[full] = node
        if kind == "fixed":
            if not isinstance(schema.get("size"), int):
                raise ValueError(f"fixed {full!r} needs an integer size")
            node["size"] = schema["size"]
        elif kind == "enum":
            symbols = schema.get("symbols")
            if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
                raise ValueError(f"enum {full!r} needs a list of symbols")
            node["symbols"] = symbols
            node["default"] = schema.get("default")
        else:
            fields = schema.get("fields")
            if not isinstance(fields, list):
                raise ValueError(f"record {full!r} needs a list of fields")
            node["fields"] = []
            for field in fields:
                if not isinstance(field, dict) or not isinstance(field.get("name"), str):
                    raise ValueError(f"record {full!r} has a field without a name")
                if "type" not in field:
                    raise ValueError(f"field {field['name']!r} of {full!r} has no type")
                node["fields"].append(
                    {
                        "name": field["name"],
                        "type": parse_avro(field["type"], names, ns),
                        "has_default": "default" in field,
                        "aliases": field.get("aliases") or [],
                    }
                )
        return node
    if kind == "array":
        return {"type": "array", "items": parse_avro(schema.get("items"), names, namespace)}
    if kind == "map":
        return {"type": "map", "values": parse_avro(schema.get("values"), names, namespace)}
    if isinstance(kind, (dict, list)) or isinstance(kind, str):
        return parse_avro(kind, names, namespace)
    raise ValueError(f"unknown type {kind!r}")


def _describe(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return "[" + ", ".join(_describe(b) for b in node) + "]"
    return node.get("name") or node["type"]


def avro_read_errors(
    reader: Any, writer: Any, path: str = "", seen: set | None = None
) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty: it can)."""
    seen = set() if seen is None else seen
    where = path or "/"
    if isinstance(writer, list):
        return [e for w in writer for e in avro_read_errors(reader, w, path, seen)]
    if isinstance(reader, list):
        for branch in reader:
            if not avro_read_errors(branch, writer, path, set(seen)):
                return []
        return [
            f"{where}: the reader union {_describe(reader)} has no branch for {_describe(writer)}"
        ]
    if isinstance(reader, str) or isinstance(writer, str):
        if isinstance(reader, str) and isinstance(writer, str):
            if reader == writer or reader in _PROMOTIONS.get(writer, ()):
                return []
        return [f"{where}: type {_describe(writer)} changed to {_describe(reader)}"]
    if reader["type"] != writer["type"]:
        return [f"{where}: type {_describe(writer)} changed to {_describe(reader)}"]
    kind = reader["type"]
    if kind == "array":
        return avro_read_errors(reader["items"], writer["items"], f"{path}/items", seen)
    if kind == "map":
        return avro_read_errors(reader["values"], writer["values"], f"{path}/values", seen)
    if reader["name"].rsplit(".", 1)[-1] != writer["name"].rsplit(".", 1)[-1] and writer[
        "name"
    ] not in reader.get("aliases", ()):
        return [f"{where}: {kind} {writer['name']} changed to {reader['name']}"]
    if kind == "fixed":
        if reader["size"] != writer["size"]:
            return [f"{where}: fixed size {writer['size']} changed to {reader['size']}"]
        return []
    if kind == "enum":
        missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
        if missing and reader.get("default") is None:
            return [f"{where}: enum {reader['name']} lost the symbols {missing}"]
        return []
    key = (id(reader), id(writer))
    if key in seen:  # a recursive record already being compared
        return []
    seen.add(key)
    errors: list[str] = []
    written = {f["name"]: f for f in writer["fields"]}
    for field in reader["fields"]:
        source = written.get(field["name"]) or next(
            (written[a] for a in field["aliases"] if a in written), None
        )
        if source is not None:
            errors += avro_read_errors(
                field["type"], source["type"], f"{path}/fields/{field['name']}", seen
            )
        elif not field["has_default"]:
            errors.append(
                f"{path}/fields/{field['name']}: the field '{field['name']}' in the reader has no "
                "default value and is missing in the writer"
            )
    return errors


# --- Protobuf: .proto text and FileDescriptorProto, both ways --------------------------------
#
# Confluent stores a Protobuf schema as .proto text whichever form it was registered in: the
# Python serializer registers a base64 FileDescriptorProto, Java, Go and .NET clients register
# the text. ``?format=serialized`` answers the base64 FileDescriptorProto (what the Python
# deserializer and the engine's decoder read), any other read answers the text.

_WELL_KNOWN = ("google/protobuf/", "google/type/", "confluent/")
_PROTO_SCALARS = {
    1: "double",
    2: "float",
    3: "int64",
    4: "uint64",
    5: "int32",
    6: "fixed64",
    7: "fixed32",
    8: "bool",
    9: "string",
    12: "bytes",
    13: "uint32",
    15: "sfixed32",
    16: "sfixed64",
    17: "sint32",
    18: "sint64",
}
_MAX_FIELD_NUMBER = 536870911


def is_builtin_proto(name: str) -> bool:
    """A file every Protobuf client carries itself (never registered as a reference)."""
    return name.startswith(_WELL_KNOWN)


def _proto_quote(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    out = []
    for byte in data:
        char = chr(byte)
        if char in "\"'\\":
            out.append("\\" + char)
        elif 32 <= byte < 127:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _json_name(name: str) -> str:
    """protoc's default json_name of a field (ToJsonName)."""
    out, upper = [], False
    for char in name:
        if char == "_":
            upper = True
        elif upper:
            out.append(char.upper())
            upper = False
        else:
            out.append(char)
    return "".join(out)


def _option_value(field: Any, value: Any) -> str:
    from google.protobuf.descriptor import FieldDescriptor as F

    if field.type == F.TYPE_ENUM:
        found = field.enum_type.values_by_number.get(value)
        return found.name if found is not None else str(value)
    if field.type == F.TYPE_BOOL:
        return "true" if value else "false"
    if field.type in (F.TYPE_STRING, F.TYPE_BYTES):
        return _proto_quote(value)
    if isinstance(value, float):
        return {float("inf"): "inf", float("-inf"): "-inf"}.get(value, repr(value))
    return str(value)


def _options(options: Any) -> list[tuple[str, str]]:
    """An options message as (name, value) pairs; message-valued options as aggregates
    (``{ field_presence: IMPLICIT }``), custom options (extensions) named ``(full.name)``."""
    from google.protobuf.descriptor import FieldDescriptor as F

    pairs: list[tuple[str, str]] = []
    for field, value in options.ListFields():
        if field.name == "uninterpreted_option":
            continue
        name = f"({field.full_name})" if field.is_extension else field.name
        values = value if field.is_repeated else [value]
        for item in values:
            if field.type in (F.TYPE_MESSAGE, F.TYPE_GROUP):
                from google.protobuf import text_format

                pairs.append(
                    (name, "{ " + text_format.MessageToString(item, as_one_line=True) + " }")
                )
            else:
                pairs.append((name, _option_value(field, item)))
    return pairs


def _ranges(ranges: Any) -> str:
    parts = []
    for r in ranges:
        end = r.end - 1
        if r.start == end:
            parts.append(str(r.start))
        else:
            parts.append(f"{r.start} to {'max' if end >= _MAX_FIELD_NUMBER else end}")
    return ", ".join(parts)


class _ProtoPrinter:
    """A FileDescriptorProto as .proto text that protoc compiles back to the same descriptor
    (json_name and source info aside). Type names stay fully qualified (``.pkg.Message``)."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.syntax = file.syntax or "proto2"
        self.lines: list[str] = []

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def render(self) -> str:
        f = self.file
        if self.syntax == "editions":
            from google.protobuf import descriptor_pb2

            edition = descriptor_pb2.Edition.Name(f.edition).removeprefix("EDITION_")
            self.emit(0, f'edition = "{edition}";')
        else:
            self.emit(0, f'syntax = "{self.syntax}";')
        if f.package:
            self.emit(0, f"package {f.package};")
        for i, dep in enumerate(f.dependency):
            kind = (
                "public " if i in f.public_dependency else "weak " if i in f.weak_dependency else ""
            )
            self.emit(0, f"import {kind}{_proto_quote(dep)};")
        for name, value in _options(f.options):
            self.emit(0, f"option {name} = {value};")
        for message in f.message_type:
            self.message(message, 0)
        for enum in f.enum_type:
            self.enum(enum, 0)
        for service in f.service:
            self.service(service)
        self.extensions(f.extension, 0)
        return "\n".join(self.lines) + "\n"

    def field_options(self, field: Any) -> str:
        from google.protobuf.descriptor_pb2 import FieldDescriptorProto as P

        opts = []
        if field.HasField("default_value"):
            value = field.default_value
            if field.type == P.TYPE_STRING:
                value = _proto_quote(value)
            elif field.type == P.TYPE_BYTES:
                value = f'"{value}"'  # protoc keeps a bytes default C-escaped already
            opts.append(f"default = {value}")
        if field.HasField("json_name") and field.json_name != _json_name(field.name):
            opts.append(f"json_name = {_proto_quote(field.json_name)}")
        opts += [f"{n} = {v}" for n, v in _options(field.options)]
        return f" [{', '.join(opts)}]" if opts else ""

    def type_name(self, field: Any) -> str:
        return _PROTO_SCALARS.get(field.type) or field.type_name

    def field(self, field: Any, depth: int, nested: dict[str, Any], in_oneof: bool) -> None:
        from google.protobuf.descriptor_pb2 import FieldDescriptorProto as P

        entry = nested.get(field.type_name.rsplit(".", 1)[-1]) if field.type_name else None
        if entry is not None and entry.options.map_entry and field.label == P.LABEL_REPEATED:
            key, value = entry.field[0], entry.field[1]
            kind = f"map<{self.type_name(key)}, {self.type_name(value)}>"
            self.emit(depth, f"{kind} {field.name} = {field.number}{self.field_options(field)};")
            return
        label = ""
        if not in_oneof:
            if field.label == P.LABEL_REPEATED:
                label = "repeated "
            elif self.syntax == "proto2":
                label = "required " if field.label == P.LABEL_REQUIRED else "optional "
            elif field.proto3_optional:
                label = "optional "
        if field.type == P.TYPE_GROUP and entry is not None:
            self.emit(
                depth,
                f"{label}group {entry.name} = {field.number}{self.field_options(field)} " + "{",
            )
            self.body(entry, depth + 1)
            self.emit(depth, "}")
            return
        kind = self.type_name(field)
        self.emit(depth, f"{label}{kind} {field.name} = {field.number}{self.field_options(field)};")

    def message(self, message: Any, depth: int) -> None:
        self.emit(depth, f"message {message.name} " + "{")
        self.body(message, depth + 1)
        self.emit(depth, "}")

    def body(self, message: Any, depth: int) -> None:
        from google.protobuf.descriptor_pb2 import FieldDescriptorProto as P

        for name, value in _options(message.options):
            self.emit(depth, f"option {name} = {value};")
        nested = {m.name: m for m in message.nested_type}
        inline = set()  # map entries and groups are written with their field
        for field in message.field:
            entry = nested.get(field.type_name.rsplit(".", 1)[-1]) if field.type_name else None
            if entry is not None and (entry.options.map_entry or field.type == P.TYPE_GROUP):
                inline.add(entry.name)
        real_oneofs = {
            i
            for i, _ in enumerate(message.oneof_decl)
            if not all(
                f.proto3_optional
                for f in message.field
                if f.HasField("oneof_index") and f.oneof_index == i
            )
        }
        written: set[int] = set()
        for field in message.field:
            index = field.oneof_index if field.HasField("oneof_index") else None
            if index is not None and index in real_oneofs:
                if index in written:
                    continue
                written.add(index)
                oneof = message.oneof_decl[index]
                self.emit(depth, f"oneof {oneof.name} " + "{")
                for name, value in _options(oneof.options):
                    self.emit(depth + 1, f"option {name} = {value};")
                for member in message.field:
                    if member.HasField("oneof_index") and member.oneof_index == index:
                        self.field(member, depth + 1, nested, in_oneof=True)
                self.emit(depth, "}")
                continue
            self.field(field, depth, nested, in_oneof=False)
        for nested_message in message.nested_type:
            if nested_message.name not in inline:
                self.message(nested_message, depth)
        for enum in message.enum_type:
            self.enum(enum, depth)
        for r in message.extension_range:
            opts = [f"{n} = {v}" for n, v in _options(r.options)]
            suffix = f" [{', '.join(opts)}]" if opts else ""
            self.emit(depth, f"extensions {_ranges([r])}{suffix};")
        if message.reserved_range:
            self.emit(depth, f"reserved {_ranges(message.reserved_range)};")
        if message.reserved_name:
            self.emit(depth, f"reserved {', '.join(map(_proto_quote, message.reserved_name))};")
        self.extensions(message.extension, depth)

    def enum(self, enum: Any, depth: int) -> None:
        self.emit(depth, f"enum {enum.name} " + "{")
        for name, value in _options(enum.options):
            self.emit(depth + 1, f"option {name} = {value};")
        for value in enum.value:
            opts = [f"{n} = {v}" for n, v in _options(value.options)]
            suffix = f" [{', '.join(opts)}]" if opts else ""
            self.emit(depth + 1, f"{value.name} = {value.number}{suffix};")
        if enum.reserved_range:
            parts = [
                str(r.start) if r.start == r.end else f"{r.start} to {r.end}"
                for r in enum.reserved_range
            ]
            self.emit(depth + 1, f"reserved {', '.join(parts)};")
        if enum.reserved_name:
            self.emit(depth + 1, f"reserved {', '.join(map(_proto_quote, enum.reserved_name))};")
        self.emit(depth, "}")

    def service(self, service: Any) -> None:
        self.emit(0, f"service {service.name} " + "{")
        for name, value in _options(service.options):
            self.emit(1, f"option {name} = {value};")
        for method in service.method:
            given = "stream " if method.client_streaming else ""
            back = "stream " if method.server_streaming else ""
            head = (
                f"rpc {method.name}({given}{method.input_type}) "
                f"returns ({back}{method.output_type})"
            )
            options = _options(method.options)
            if not options:
                self.emit(1, head + ";")
                continue
            self.emit(1, head + " {")
            for name, value in options:
                self.emit(2, f"option {name} = {value};")
            self.emit(1, "}")
        self.emit(0, "}")

    def extensions(self, fields: Any, depth: int) -> None:
        by_extendee: dict[str, list[Any]] = {}
        for field in fields:
            by_extendee.setdefault(field.extendee, []).append(field)
        for extendee, members in by_extendee.items():
            self.emit(depth, f"extend {extendee} " + "{")
            for field in members:
                self.field(field, depth + 1, {}, in_oneof=False)
            self.emit(depth, "}")


def proto_text(file: Any) -> str:
    """A FileDescriptorProto as .proto text."""
    return _ProtoPrinter(file).render()


def canonical_descriptor(file: Any) -> bytes:
    """What makes two descriptors the same schema: all but the file's name, json names (protoc
    fills them in, a serializer may not) and source info."""
    from google.protobuf import descriptor_pb2

    copy = descriptor_pb2.FileDescriptorProto()
    copy.CopyFrom(file)
    copy.ClearField("name")
    copy.ClearField("source_code_info")

    def strip(fields: Any) -> None:
        for field in fields:
            field.ClearField("json_name")

    def walk(message: Any) -> None:
        strip(message.field)
        strip(message.extension)
        for nested in message.nested_type:
            walk(nested)

    for message in copy.message_type:
        walk(message)
    strip(copy.extension)
    return copy.SerializeToString(deterministic=True)


def parse_serialized_proto(text: str) -> Any | None:
    """The FileDescriptorProto of a base64 ``text`` (the serialized form), None for .proto
    text."""
    import base64
    import binascii

    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    stripped = "".join(text.split())
    if not stripped or any(c in text for c in ';{}"'):
        return None
    try:
        data = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError):
        return None
    file = descriptor_pb2.FileDescriptorProto()
    try:
        file.ParseFromString(data)
    except DecodeError:
        return None
    return file


def compile_proto(text: str, dependencies: list[Any], name: str = "default.proto") -> Any:
    """.proto text compiled by protoc (grpcio-tools) to a FileDescriptorProto; its imports
    resolve to ``dependencies`` (FileDescriptorProtos named by their import paths) or to the
    well-known files protoc ships. Raises ValueError with protoc's message."""
    import importlib.resources
    import tempfile

    from google.protobuf import descriptor_pb2

    try:
        include = importlib.resources.files("grpc_tools") / "_proto"
    except ModuleNotFoundError:
        raise ValueError(
            "registering .proto text needs protoc: pip install grpcio-tools (the dev extra)"
        ) from None
    with tempfile.TemporaryDirectory(prefix="dev-registry-protoc-") as tmp:
        folder = Path(tmp)
        source = folder / "src" / name
        source.parent.mkdir(parents=True)
        source.write_text(text, encoding="utf-8")
        out = folder / "out.desc"
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={folder / 'src'}",
            f"--proto_path={include}",
            f"--descriptor_set_out={out}",
        ]
        if dependencies:
            deps = folder / "deps.desc"
            deps.write_bytes(
                descriptor_pb2.FileDescriptorSet(file=dependencies).SerializeToString()
            )
            command.append(f"--descriptor_set_in={deps}")
        command.append(name)
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0 or not out.exists():
            message = (done.stderr or done.stdout).strip().replace(str(folder / "src") + "/", "")
            raise ValueError(message or f"protoc failed with exit code {done.returncode}")
        found = descriptor_pb2.FileDescriptorSet()
        found.ParseFromString(out.read_bytes())
    return found.file[-1]


# --- state --------------------------------------------------------------------------------


class RegistryState:
    """The registry's data, persisted to ``path`` after every change (write, then rename)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.data: dict[str, Any] = {
            "next_id": 1,
            "schemas": {},  # str(id) -> {schema, schemaType, references, guid}
            "subjects": {},  # subject -> [{version, id, deleted}]
            "config": {"global": DEFAULT_LEVEL, "subjects": {}},
        }
        if path is not None and path.exists():
            try:
                loaded = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise RegistryError(f"{path} is not a registry state file ({exc})") from None
            if not isinstance(loaded, dict) or not {"next_id", "schemas", "subjects"} <= set(
                loaded
            ):
                raise RegistryError(f"{path} is not a registry state file")
            self.data.update(loaded)

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    # schemas
    def schema(self, schema_id: int) -> dict[str, Any]:
        found = self.data["schemas"].get(str(schema_id))
        if found is None:
            raise _schema_not_found(f"Schema {schema_id} not found")
        return found

    def schema_by_guid(self, guid: str) -> tuple[int, dict[str, Any]]:
        for key, value in self.data["schemas"].items():
            if value["guid"] == guid:
                return int(key), value
        raise _schema_not_found(f"Schema {guid} not found")

    def find_id(self, canonical: str) -> int | None:
        for key, value in self.data["schemas"].items():
            if value["canonical"] == canonical:
                return int(key)
        return None

    # subjects
    def versions(self, subject: str, *, deleted: bool = False) -> list[dict[str, Any]]:
        entries = self.data["subjects"].get(subject, [])
        return [e for e in entries if deleted or not e["deleted"]]

    def level(self, subject: str) -> str:
        return self.data["config"]["subjects"].get(subject) or self.data["config"]["global"]


def _reference_list(body: dict[str, Any]) -> list[dict[str, Any]]:
    refs = body.get("references") or []
    if not isinstance(refs, list):
        raise ApiError(422, 42201, "Invalid schema: references must be a list")
    out = []
    for ref in refs:
        if not isinstance(ref, dict) or not all(
            ref.get(k) is not None for k in ("name", "subject")
        ):
            raise ApiError(422, 42201, f"Invalid schema: reference {ref!r} needs name and subject")
        try:
            version = int(ref.get("version", -1))
        except (TypeError, ValueError):
            raise ApiError(
                422,
                42202,
                f"The specified version '{ref.get('version')}' is not a valid version id.",
            ) from None
        out.append({"name": str(ref["name"]), "subject": str(ref["subject"]), "version": version})
    return out


def _schema_view(schema: dict[str, Any], fmt: str | None = None) -> dict[str, Any]:
    """A stored schema as Confluent answers it. Protobuf: the .proto text, or with
    ``format=serialized`` the base64 FileDescriptorProto."""
    text = schema["schema"]
    if schema["schemaType"] == "PROTOBUF":
        text = schema.get("serialized", text) if fmt == "serialized" else schema.get("text", text)
    view: dict[str, Any] = {"schema": text}
    if schema["schemaType"] != "AVRO":  # Confluent leaves it out for Avro
        view["schemaType"] = schema["schemaType"]
    if schema["references"]:
        view["references"] = schema["references"]
    for name in ("metadata", "ruleSet"):
        if schema.get(name):
            view[name] = schema[name]
    return view


def _format(query: dict[str, list[str]]) -> str | None:
    return (query.get("format") or [None])[-1] or None


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return (query.get(name) or ["false"])[-1].strip().lower() == "true"


class Registry:
    """The REST API over a :class:`RegistryState`: ``handle(method, path, query, body)``."""

    def __init__(self, state: RegistryState) -> None:
        self.state = state
        self._upgrade()
        self.routes: list[tuple[str, tuple[str, ...], Callable[..., Any]]] = [
            ("GET", (), lambda q, b: {}),
            ("GET", ("schemas", "types"), lambda q, b: list(SCHEMA_TYPES)),
            ("GET", ("schemas", "ids", "*"), self.get_schema),
            ("GET", ("schemas", "ids", "*", "schema"), self.get_schema_text),
            ("GET", ("schemas", "ids", "*", "versions"), self.get_schema_versions),
            ("GET", ("schemas", "ids", "*", "subjects"), self.get_schema_subjects),
            ("GET", ("schemas", "guids", "*"), self.get_schema_by_guid),
            ("GET", ("subjects",), self.get_subjects),
            ("POST", ("subjects", "*"), self.lookup),
            ("DELETE", ("subjects", "*"), self.delete_subject),
            ("GET", ("subjects", "*", "metadata"), self.get_latest_with_metadata),
            ("GET", ("subjects", "*", "versions"), self.get_versions),
            ("POST", ("subjects", "*", "versions"), self.register),
            ("GET", ("subjects", "*", "versions", "*"), self.get_version),
            ("GET", ("subjects", "*", "versions", "*", "schema"), self.get_version_text),
            ("GET", ("subjects", "*", "versions", "*", "referencedby"), self.get_referenced_by),
            ("DELETE", ("subjects", "*", "versions", "*"), self.delete_version),
            ("GET", ("config",), self.get_config),
            ("PUT", ("config",), self.put_config),
            ("GET", ("config", "*"), self.get_config),
            ("PUT", ("config", "*"), self.put_config),
            ("DELETE", ("config", "*"), self.delete_config),
            ("POST", ("compatibility", "subjects", "*", "versions", "*"), self.compatibility),
            ("POST", ("compatibility", "subjects", "*", "versions"), self.compatibility),
            ("GET", ("mode",), lambda q, b: {"mode": "READWRITE"}),
            ("GET", ("mode", "*"), lambda *a: {"mode": "READWRITE"}),
            ("GET", ("contexts",), lambda q, b: ["."]),
            # The serializers' default subject strategy (ASSOCIATED) asks for the topic's
            # associations first; none here, so they fall back to TopicNameStrategy.
            ("GET", ("associations", "resources", "*", "*"), lambda *a: []),
        ]

    def handle(self, method: str, raw_path: str, body: Any) -> tuple[int, Any]:
        split = urlsplit(raw_path)
        parts = tuple(unquote(p) for p in split.path.strip("/").split("/") if p)
        query = parse_qs(split.query, keep_blank_values=True)
        for route_method, pattern, func in self.routes:
            if route_method != method or len(pattern) != len(parts):
                continue
            args = [p for p, want in zip(parts, pattern, strict=True) if want == "*"]
            if all(want in ("*", p) for p, want in zip(parts, pattern, strict=True)):
                with self.state.lock:
                    return 200, func(*args, query, body)
        raise ApiError(404, 404, f"HTTP 404 Not Found: {method} {split.path}")

    def _upgrade(self) -> None:
        """Schemas kept by an earlier version of this registry get the keys it did not keep
        (oldest first: a reference always has the lower id)."""
        for key in sorted(self.state.data["schemas"], key=int):
            schema = self.state.data["schemas"][key]
            if "schema_key" in schema:
                continue
            try:
                stored = self._prepare(None, schema)
            except ApiError as exc:
                log.warning("schema %s kept as it is: %s", key, exc.message)
                continue
            schema.update({k: v for k, v in stored.items() if v is not None})
            schema["canonical"] = self._key(schema)

    # parsing what is registered ----------------------------------------------------------

    def _referenced(self, ref: dict[str, Any]) -> dict[str, Any]:
        """The stored schema a reference names (a deleted version still resolves, as in
        Confluent's); 42201 when there is none."""
        entries = self.state.versions(ref["subject"], deleted=True)
        if not entries:
            raise ApiError(
                422,
                42201,
                f"Invalid schema: reference {ref['name']!r}: Subject '{ref['subject']}' not found.",
            )
        if ref["version"] == -1:
            entry = ([e for e in entries if not e["deleted"]] or entries)[-1]
        else:
            entry = next((e for e in entries if e["version"] == ref["version"]), None)
            if entry is None:
                raise ApiError(
                    422,
                    42201,
                    f"Invalid schema: reference {ref['name']!r}: "
                    f"Version {ref['version']} of subject '{ref['subject']}' not found.",
                )
        return self.state.schema(entry["id"])

    def _avro_names(self, refs: list[dict[str, Any]], names: dict[str, Any], seen: set) -> None:
        """The named types of Avro references (theirs first), into ``names``."""
        for ref in refs:
            schema = self._referenced(ref)
            key = (ref["subject"], ref["version"])
            if key in seen:
                continue
            seen.add(key)
            if schema["schemaType"] != "AVRO":
                raise ValueError(f"reference {ref['name']!r} is {schema['schemaType']}, not AVRO")
            self._avro_names(schema["references"], names, seen)
            before = set(names)
            try:
                parse_avro(json.loads(schema["schema"]), names)
            except ValueError:
                # a type the two references both define: keep the first
                for name in set(names) - before:
                    del names[name]

    def _avro(self, text: str, refs: list[dict[str, Any]]) -> Any:
        names: dict[str, Any] = {}
        self._avro_names(refs, names, set())
        try:
            return parse_avro(json.loads(text), names)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None

    def _proto_files(self, refs: list[dict[str, Any]], out: dict[str, Any]) -> None:
        """The FileDescriptorProtos of Protobuf references, named by their import paths,
        dependencies first."""
        from google.protobuf import descriptor_pb2

        for ref in refs:
            if ref["name"] in out or is_builtin_proto(ref["name"]):
                continue
            schema = self._referenced(ref)
            if schema["schemaType"] != "PROTOBUF":
                raise ValueError(
                    f"reference {ref['name']!r} is {schema['schemaType']}, not PROTOBUF"
                )
            self._proto_files(schema["references"], out)
            file = descriptor_pb2.FileDescriptorProto()
            file.ParseFromString(base64.b64decode(schema["serialized"]))
            file.name = ref["name"]
            out[ref["name"]] = file

    def _prepare(self, subject: str | None, body: Any) -> dict[str, Any]:
        """A registration body checked and in the form it is stored in; raises 42201 on an
        invalid schema. ``key`` is its identity (schema, references, metadata and rules, as
        Confluent's MD5); ``schema_key`` the same without metadata and rules. Avro and JSON
        Schema compare by their parsed JSON, Protobuf by its descriptor, so whitespace, key
        order or the form it was given in (text or serialized) do not make a second id."""
        body = body if isinstance(body, dict) else {}
        text = body.get("schema")
        kind = str(body.get("schemaType") or "AVRO").upper()
        if not isinstance(text, str) or not text.strip():
            raise ApiError(422, 42201, "Invalid schema: empty schema")
        if kind not in SCHEMA_TYPES:
            raise ApiError(422, 42201, f"Invalid schema type {kind}")
        refs = _reference_list(body)
        stored: dict[str, Any] = {"schema": text, "schemaType": kind, "references": refs}
        try:
            if kind == "AVRO":
                self._avro(text, refs)
                normalized = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
            elif kind == "JSON":
                parsed = json.loads(text)
                if not isinstance(parsed, (dict, bool)):
                    raise ValueError("a JSON Schema is an object or a boolean")
                for ref in refs:
                    self._referenced(ref)
                normalized = json.dumps(parsed, sort_keys=True, separators=(",", ":"))
            else:
                file = parse_serialized_proto(text)
                if file is not None:
                    for ref in refs:
                        self._referenced(ref)
                    stored["text"] = proto_text(file)
                    stored["serialized"] = "".join(text.split())
                else:
                    files: dict[str, Any] = {}
                    self._proto_files(refs, files)
                    file = compile_proto(text, list(files.values()))
                    stored["text"] = text
                    stored["serialized"] = base64.b64encode(file.SerializeToString()).decode()
                normalized = base64.b64encode(canonical_descriptor(file)).decode()
        except ValueError as exc:
            raise ApiError(422, 42201, f"Invalid schema: {exc}") from None
        for name in ("metadata", "ruleSet"):
            value = body.get(name)
            if value is not None and not isinstance(value, dict):
                raise ApiError(422, 42201, f"Invalid schema: {name} must be an object")
            stored[name] = value or None
        same = [kind, normalized, refs]
        stored["schema_key"] = json.dumps(same, sort_keys=True, separators=(",", ":"))
        return stored

    @staticmethod
    def _key(stored: dict[str, Any]) -> str:
        return json.dumps(
            [json.loads(stored["schema_key"]), stored.get("metadata"), stored.get("ruleSet")],
            sort_keys=True,
            separators=(",", ":"),
        )

    # schemas -----------------------------------------------------------------------------

    @staticmethod
    def _id(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise _schema_not_found(f"Schema {text} not found") from None

    def get_schema(self, schema_id: str, query: dict, body: Any) -> dict[str, Any]:
        # ?subject= names a context in Confluent's; with the one default context every id is
        # found whatever the subject.
        schema = self.state.schema(self._id(schema_id))
        return {**_schema_view(schema, _format(query)), "guid": schema["guid"]}

    def get_schema_text(self, schema_id: str, query: dict, body: Any) -> str:
        return _schema_view(self.state.schema(self._id(schema_id)), _format(query))["schema"]

    def get_schema_by_guid(self, guid: str, query: dict, body: Any) -> dict[str, Any]:
        sid, schema = self.state.schema_by_guid(guid)
        return {**_schema_view(schema, _format(query)), "id": sid, "guid": guid}

    def _uses(self, sid: int, query: dict) -> list[tuple[str, int]]:
        self.state.schema(sid)
        deleted = _flag(query, "deleted")
        only = (query.get("subject") or [None])[-1]
        return [
            (subject, e["version"])
            for subject in sorted(self.state.data["subjects"])
            if only in (None, subject)
            for e in self.state.versions(subject, deleted=deleted)
            if e["id"] == sid
        ]

    def get_schema_versions(self, schema_id: str, query: dict, body: Any) -> list[dict[str, Any]]:
        uses = self._uses(self._id(schema_id), query)
        return [{"subject": s, "version": v} for s, v in _page(uses, query)]

    def get_schema_subjects(self, schema_id: str, query: dict, body: Any) -> list[str]:
        return _page(sorted({s for s, _ in self._uses(self._id(schema_id), query)}), query)

    # subjects ----------------------------------------------------------------------------

    def get_subjects(self, query: dict, body: Any) -> list[str]:
        deleted, only = _flag(query, "deleted"), _flag(query, "deleted_only")
        prefix = (query.get("subjectPrefix") or [""])[-1]
        found = []
        for subject, entries in sorted(self.state.data["subjects"].items()):
            live = any(not e["deleted"] for e in entries)
            gone = any(e["deleted"] for e in entries)
            if not subject.startswith(prefix):
                continue
            if (only and gone) or (not only and (live or (deleted and gone))):
                found.append(subject)
        return _page(found, query)

    def _existing(self, subject: str, *, deleted: bool = False) -> list[dict[str, Any]]:
        entries = self.state.versions(subject, deleted=deleted)
        if not entries:
            raise _subject_not_found(subject)
        return entries

    def get_versions(self, subject: str, query: dict, body: Any) -> list[int]:
        if _flag(query, "deleted_only"):
            return [e["version"] for e in self._existing(subject, deleted=True) if e["deleted"]]
        return [e["version"] for e in self._existing(subject, deleted=_flag(query, "deleted"))]

    def _entry(self, subject: str, version: str, *, deleted: bool) -> dict[str, Any]:
        if version not in ("latest", "-1"):
            try:
                number = int(version)
            except ValueError:
                number = 0
            if number <= 0:
                raise ApiError(
                    422,
                    42202,
                    f"The specified version '{version}' is not a valid version id. Allowed values "
                    'are between [1, 2^31-1] and the string "latest"',
                )
        entries = self._existing(subject, deleted=deleted)
        if version in ("latest", "-1"):
            live = [e for e in entries if not e["deleted"]] or entries
            return live[-1]
        for entry in entries:
            if entry["version"] == number:
                return entry
        raise ApiError(404, 40402, f"Version {version} not found.")

    def _register_answer(self, subject: str, entry: dict[str, Any], given: str) -> dict[str, Any]:
        """The schema text is in the answer only when it is the text given: the client caches
        the answer's text as the key of the id, and a textually different (but equal) stored
        text would miss that cache on every later call."""
        answer = self._registered(subject, entry)
        if answer["schema"] != given:
            del answer["schema"]
        return answer

    def _registered(
        self, subject: str, entry: dict[str, Any], fmt: str | None = None
    ) -> dict[str, Any]:
        schema = self.state.schema(entry["id"])
        return {
            "subject": subject,
            "version": entry["version"],
            "id": entry["id"],
            "guid": schema["guid"],
            **_schema_view(schema, fmt),
        }

    def get_version(self, subject: str, version: str, query: dict, body: Any) -> dict[str, Any]:
        entry = self._entry(subject, version, deleted=_flag(query, "deleted"))
        return self._registered(subject, entry, _format(query))

    def get_version_text(self, subject: str, version: str, query: dict, body: Any) -> str:
        entry = self._entry(subject, version, deleted=_flag(query, "deleted"))
        return _schema_view(self.state.schema(entry["id"]), _format(query))["schema"]

    def get_latest_with_metadata(self, subject: str, query: dict, body: Any) -> dict[str, Any]:
        """The latest version whose metadata properties hold every ``key``/``value`` pair
        asked for (Confluent's ``GET /subjects/{s}/metadata``; used by the serializers'
        ``use.latest.with.metadata``).

        confluent-kafka's Python client percent-encodes each key and value before its HTTP
        library encodes the query again, so ``owner=shop team`` arrives as ``shop%20team``:
        when nothing matches the pairs as they arrive, they are decoded once more (Java's
        client encodes once; its pairs match as they arrive)."""
        keys, values = query.get("key") or [], query.get("value") or []
        wanted = dict(zip(keys, values, strict=False))
        entries = self._existing(subject, deleted=_flag(query, "deleted"))
        twice = {unquote(k): unquote(v) for k, v in wanted.items()}
        for pairs in (wanted, twice) if twice != wanted else (wanted,):
            for entry in reversed(entries):
                metadata = self.state.schema(entry["id"]).get("metadata") or {}
                properties = metadata.get("properties")
                if properties is not None and all(properties.get(k) == v for k, v in pairs.items()):
                    return self._registered(subject, entry, _format(query))
        raise _schema_not_found()

    def _referencing(self, subject: str, version: int) -> list[int]:
        """The ids of live schema versions whose references name ``subject`` ``version``."""
        ids = set()
        latest = max((e["version"] for e in self.state.versions(subject)), default=None)
        for other in self.state.data["subjects"]:
            for entry in self.state.versions(other):
                for ref in self.state.schema(entry["id"])["references"]:
                    if ref["subject"] == subject and (
                        ref["version"] == version or (ref["version"] == -1 and version == latest)
                    ):
                        ids.add(entry["id"])
        return sorted(ids)

    def get_referenced_by(self, subject: str, version: str, query: dict, body: Any) -> list[int]:
        entry = self._entry(subject, version, deleted=False)
        return _page(self._referencing(subject, entry["version"]), query)

    def lookup(self, subject: str, query: dict, body: Any) -> dict[str, Any]:
        stored = self._prepare(subject, body)
        entries = self._existing(subject, deleted=_flag(query, "deleted"))
        given_meta = stored.get("metadata") or stored.get("ruleSet")
        for exact in (True, False):
            if not exact and given_meta:
                break  # metadata or rules asked for: only the exact schema answers
            for entry in reversed(entries):
                schema = self.state.schema(entry["id"])
                if (schema["canonical"] if exact else schema.get("schema_key")) == (
                    self._key(stored) if exact else stored["schema_key"]
                ):
                    return self._registered(subject, entry, _format(query))
        raise _schema_not_found()

    def _compatibility_errors(
        self, subject: str, new: dict[str, Any], against: list[dict[str, Any]], level: str
    ) -> list[str]:
        if level == "NONE" or not against:
            return []
        if not level.endswith("_TRANSITIVE"):
            against = against[-1:]
        kind = new["schemaType"]
        errors: list[str] = []
        for entry in against:
            old = self.state.schema(entry["id"])
            if old["schemaType"] != kind:
                errors.append(
                    f"version {entry['version']} is {old['schemaType']}, the new schema is {kind}"
                )
                continue
            if kind != "AVRO":
                continue  # stored as given: only Avro is checked
            new_node = self._avro(new["schema"], new["references"])
            old_node = self._avro(old["schema"], old["references"])
            if level.startswith(("BACKWARD", "FULL")):
                errors += [
                    f"{e} (the new schema cannot read data written with version {entry['version']})"
                    for e in avro_read_errors(new_node, old_node)
                ]
            if level.startswith(("FORWARD", "FULL")):
                errors += [
                    f"{e} (version {entry['version']} cannot read data written with the new schema)"
                    for e in avro_read_errors(old_node, new_node)
                ]
        return errors

    def register(self, subject: str, query: dict, body: Any) -> dict[str, Any]:
        stored = self._prepare(subject, body)
        state = self.state
        live = state.versions(subject)
        given_meta = stored.get("metadata") or stored.get("ruleSet")
        if live:
            # Confluent's: metadata and rules not given are the previous version's
            previous = state.schema(live[-1]["id"])
            for name in ("metadata", "ruleSet"):
                if stored.get(name) is None:
                    stored[name] = previous.get(name)
        key = self._key(stored)
        for entry in reversed(live):  # already there: same id, same version
            schema = state.schema(entry["id"])
            if schema["canonical"] == key or (
                not given_meta and schema.get("schema_key") == stored["schema_key"]
            ):
                return self._register_answer(subject, entry, stored["schema"])
        errors = self._compatibility_errors(subject, stored, live, state.level(subject))
        if errors:
            raise ApiError(
                409,
                40901,
                f'Schema being registered is incompatible with an earlier schema for subject "'
                f'{subject}", details: {errors}',
            )
        sid = state.find_id(key)
        if sid is None:
            sid = state.data["next_id"]
            state.data["next_id"] = sid + 1
            state.data["schemas"][str(sid)] = {
                **{k: v for k, v in stored.items() if v is not None},
                "guid": str(uuid.uuid4()),
                "canonical": key,
            }
        entries = state.data["subjects"].setdefault(subject, [])
        version = max((e["version"] for e in entries), default=0) + 1
        entry = {"version": version, "id": sid, "deleted": False}
        entries.append(entry)
        state.save()
        log.info("registered id %d as %s version %d", sid, subject, version)
        return self._register_answer(subject, entry, stored["schema"])

    def _refuse_if_referenced(self, subject: str, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            if self._referencing(subject, entry["version"]):
                raise ApiError(
                    422,
                    42206,
                    "One or more references exist to the schema "
                    "{"
                    + f"magic=1,keytype=SCHEMA,subject={subject},version={entry['version']}"
                    + "}.",
                )

    def delete_subject(self, subject: str, query: dict, body: Any) -> list[int]:
        entries = self.state.data["subjects"].get(subject)
        if not entries:
            raise _subject_not_found(subject)
        if _flag(query, "permanent"):
            if any(not e["deleted"] for e in entries):
                raise ApiError(
                    404,
                    40405,
                    f"Subject '{subject}' was not deleted first before being permanently deleted",
                )
            del self.state.data["subjects"][subject]
            self.state.data["config"]["subjects"].pop(subject, None)
            self.state.save()
            return [e["version"] for e in entries]
        live = [e for e in entries if not e["deleted"]]
        if not live:
            raise ApiError(
                404,
                40404,
                f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently",
            )
        self._refuse_if_referenced(subject, live)
        for entry in live:
            entry["deleted"] = True
        self.state.save()
        return [e["version"] for e in live]

    def delete_version(self, subject: str, version: str, query: dict, body: Any) -> int:
        permanent = _flag(query, "permanent")
        entry = self._entry(subject, version, deleted=True)
        if permanent:
            if not entry["deleted"]:
                raise ApiError(
                    404,
                    40407,
                    f"Subject '{subject}' Version {entry['version']} was not deleted first "
                    "before being permanently deleted",
                )
            self.state.data["subjects"][subject].remove(entry)
            if not self.state.data["subjects"][subject]:
                del self.state.data["subjects"][subject]
        else:
            if entry["deleted"]:
                raise ApiError(
                    404,
                    40406,
                    f"Subject '{subject}' Version {entry['version']} was soft deleted.Set "
                    "permanent=true to delete permanently",
                )
            self._refuse_if_referenced(subject, [entry])
            entry["deleted"] = True
        self.state.save()
        return int(entry["version"])

    # config and compatibility ------------------------------------------------------------

    def get_config(self, *args: Any) -> dict[str, Any]:
        *subject, query, _ = args
        if not subject:
            return {"compatibilityLevel": self.state.data["config"]["global"]}
        level = self.state.data["config"]["subjects"].get(subject[0])
        if level is None:
            if _flag(query, "defaultToGlobal"):
                return {"compatibilityLevel": self.state.data["config"]["global"]}
            raise ApiError(
                404,
                40408,
                f"Subject '{subject[0]}' does not have subject-level compatibility configured",
            )
        return {"compatibilityLevel": level}

    def put_config(self, *args: Any) -> dict[str, Any]:
        *subject, _, body = args
        body = body or {}
        level = str(body.get("compatibility") or body.get("compatibilityLevel") or "").upper()
        if level not in LEVELS:
            raise ApiError(422, 42203, f"Invalid compatibility level: {level or 'missing'}")
        if subject:
            self.state.data["config"]["subjects"][subject[0]] = level
        else:
            self.state.data["config"]["global"] = level
        self.state.save()
        return {"compatibility": level}

    def delete_config(self, subject: str, query: dict, body: Any) -> dict[str, Any]:
        old = self.state.data["config"]["subjects"].pop(subject, None)
        if old is None:
            raise _subject_not_found(subject)
        self.state.save()
        return {"compatibilityLevel": old}

    def compatibility(self, subject: str, *args: Any) -> dict[str, Any]:
        *version, query, body = args
        stored = self._prepare(subject, body)
        level = self.state.level(subject)
        if version:
            against = [self._entry(subject, version[0], deleted=False)]
            # a single version is checked under the level's direction, never transitively
            level = level.removesuffix("_TRANSITIVE")
        else:
            against = self.state.versions(subject)
        errors = self._compatibility_errors(subject, stored, against, level)
        answer: dict[str, Any] = {"is_compatible": not errors}
        if _flag(query, "verbose"):
            answer["messages"] = errors
        return answer


def _page(items: list[Any], query: dict[str, list[str]]) -> list[Any]:
    """``?offset=&limit=`` (a negative limit: all)."""
    try:
        offset = max(int((query.get("offset") or ["0"])[-1]), 0)
        limit = int((query.get("limit") or ["-1"])[-1])
    except ValueError:
        return items
    items = items[offset:]
    return items if limit < 0 else items[:limit]


# --- HTTP ---------------------------------------------------------------------------------


def make_handler(registry: Registry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "dev-schema-registry"

        def _send(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _dispatch(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    raise ApiError(400, 400, "the request body is not JSON") from None
                status, payload = registry.handle(self.command, self.path, body)
            except ApiError as exc:
                status, payload = exc.status, {"error_code": exc.code, "message": exc.message}
            except Exception as exc:  # answer 500 rather than drop the connection
                log.exception("registry request %s %s failed", self.command, self.path)
                status, payload = 500, {"error_code": 50001, "message": f"Error: {exc}"}
            self._send(status, payload)

        do_GET = do_POST = do_PUT = do_DELETE = _dispatch

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return Handler


def make_server(port: int, data_path: Path | None) -> ThreadingHTTPServer:
    """The registry's HTTP server on 127.0.0.1:``port`` (0: a free port), not yet serving."""
    registry = Registry(RegistryState(data_path))
    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer((HOST, port), make_handler(registry))
    server.daemon_threads = True
    return server


def serve(port: int, data_path: Path | None) -> None:
    """Serve until SIGTERM or SIGINT (the child process of :class:`LocalSchemaRegistry`)."""
    server = make_server(port, data_path)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


# --- process management -------------------------------------------------------------------


def _src_dir() -> Path:
    return Path(__file__).resolve().parents[2]


def wait_until_serving(url: str, timeout_s: float = 15.0, process: Any = None) -> None:
    wait_for_http(f"{url}/config", process, RegistryError, "the schema registry", timeout_s)


class LocalSchemaRegistry(ChildServer):
    """The registry in a child process on a loopback port; its data in ``data_path``.

    >>> with LocalSchemaRegistry(data_path=Path("registry.json")) as registry:  # doctest: +SKIP
    ...     SchemaRegistryClient({"url": registry.url})
    """

    def __init__(
        self,
        port: int | None = None,
        data_path: Path | None = None,
        log_path: Path | None = None,
        *,
        detached: bool = False,
    ) -> None:
        """``detached=False`` (the default) ties the registry's life to this process (Linux).
        Without ``data_path`` the state lives in memory and a stop forgets it."""
        self.port = port or free_port()
        self.data_path = data_path
        self.log_path = log_path
        self.detached = detached
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> LocalSchemaRegistry:
        command = [sys.executable, "-m", MODULE, "serve", "--port", str(self.port)]
        if self.data_path is not None:
            command += ["--data", str(self.data_path)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_src_dir()), env.get("PYTHONPATH")) if p
        )
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=None if self.detached else die_with_parent,
            )
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        try:
            wait_until_serving(self.url, process=self.process)
        except RegistryError:
            self.stop()
            raise
        return self


def is_registry_process(pid: int) -> bool:
    """``pid`` runs this registry (read from /proc where there is one): a pid reused by
    another program is never taken for it, or signalled."""
    cmdline = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self/cmdline").exists():
        try:
            return b"kafka_delta_dev.schema_registry_server" in cmdline.read_bytes()
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_pid(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM the registry ``pid`` (if it is one) and wait until it is gone."""
    if not is_registry_process(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and is_registry_process(pid):
        time.sleep(0.05)


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description="Start or stop the development Schema Registry."
    )
    parser.add_argument("action", choices=["start", "stop", "url", "serve"])
    parser.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: free)")
    parser.add_argument("--state", type=Path, default=Path(".registry.json"))
    parser.add_argument("--data", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.action == "serve":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
        try:
            serve(args.port or 8081, args.data)
        except (OSError, RegistryError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        state = json.loads(args.state.read_text()) if args.state.exists() else None
    except ValueError as exc:
        print(
            f"error: {args.state} is not a registry state file ({exc}); delete it", file=sys.stderr
        )
        return 1
    running = state is not None and is_registry_process(int(state.get("pid", 0)))
    if args.action == "url":
        if not running:
            print(f"error: no schema registry runs for {args.state}: start one", file=sys.stderr)
            return 1
        print(state["url"])
        return 0
    if args.action == "start":
        if running:
            print(f"error: a schema registry already runs at {state['url']}", file=sys.stderr)
            return 1
        port = args.port or (state or {}).get("port")
        registry = LocalSchemaRegistry(
            port,
            data_path=args.state.with_name(args.state.stem + ".data.json"),
            log_path=args.state.with_suffix(".log"),
            detached=True,
        )
        try:
            registry.start()
        except RegistryError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        assert registry.process is not None
        args.state.write_text(
            json.dumps({"pid": registry.process.pid, "url": registry.url, "port": registry.port})
        )
        print(registry.url)
        return 0
    if running:
        stop_pid(int(state["pid"]))
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
