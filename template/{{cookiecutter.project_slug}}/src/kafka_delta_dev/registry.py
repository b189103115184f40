"""A small Schema Registry for development and tests: a stand-in for Confluent's, beside the
embedded broker. Standard library only, always on 127.0.0.1, its state (schemas, ids, subjects,
versions, compatibility settings) kept in a JSON file, so a stop and a start on the same port
keep every id: tests stop it to play "registry down" and start it again.

    python -m kafka_delta_dev.registry start --state .registry.json [--port 8081]
    python -m kafka_delta_dev.registry url --state .registry.json
    python -m kafka_delta_dev.registry stop --state .registry.json

``scripts/broker.sh start`` starts it together with the broker (its URL goes to
``.broker.json`` under ``schema_registry_url``; ``scripts/broker.sh registry-url`` prints it).

It speaks the subset of Confluent's REST API that confluent-kafka's ``SchemaRegistryClient`` and
its Avro, Protobuf and JSON Schema serializers and deserializers use:

- ``POST /subjects/{s}/versions`` (register; answers ``id`` and ``guid``), ``POST /subjects/{s}``
  (look-up), ``GET /subjects``, ``GET /subjects/{s}/versions``,
  ``GET /subjects/{s}/versions/{v|latest}``, ``DELETE /subjects/{s}[/versions/{v}]``
  (soft, then ``?permanent=true``);
- ``GET /schemas/ids/{id}`` (``?subject=``, ``?format=``), ``GET /schemas/guids/{guid}``,
  ``GET /schemas/ids/{id}/versions``, ``GET /schemas/ids/{id}/subjects``, ``GET /schemas/types``;
- ``GET|PUT|DELETE /config[/{s}]``, ``POST /compatibility/subjects/{s}/versions[/{v|latest}]``,
  ``GET /mode``, and ``GET /associations/resources/{ns}/{topic}`` (always none: the serializers
  then fall back to the topic name strategy, ``<topic>-value``).

The same schema registered twice under a subject keeps its id and version; the same schema under
two subjects shares one id. Compatibility (``BACKWARD`` by default, ``NONE``, ``FORWARD``,
``FULL`` and their ``_TRANSITIVE`` forms) is checked for Avro with the Avro specification's
schema-resolution rules: under ``BACKWARD`` the new version must read data written with the old
one (an added field needs a default; a type change that is not a promotion is refused), and an
incompatible registration answers 409 as Confluent does. Protobuf and JSON Schema are stored as
given (the Protobuf serializer registers a base64 ``FileDescriptorProto``, which is what
``?format=serialized`` returns) and not checked for compatibility. Errors are Confluent's JSON
(``{"error_code": 40401, "message": ...}``: 40401 subject, 40402 version, 40403 schema not
found, 42201 invalid schema).

What it is not: no authentication, no TLS, no schema references resolution beyond storing them,
no contexts, no rules or metadata, no leader election. Production points the same config keys
(``decoding.schema_registry.url`` and its auth and TLS settings) at Confluent Schema Registry,
Karapace, Redpanda's registry or Apicurio (in its Confluent-compatible API, ``/apis/ccompat/v7``).
"""

from __future__ import annotations

import argparse
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
        node: dict[str, Any] = {"type": kind if kind != "error" else "record", "name": full}
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
    if reader["name"].rsplit(".", 1)[-1] != writer["name"].rsplit(".", 1)[-1]:
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


def _parse_avro_text(text: str) -> Any:
    try:
        return parse_avro(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None


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


def _canonical(body: dict[str, Any]) -> tuple[str, str]:
    """(schemaType, key) of a registration body; raises ApiError 42201 on an invalid schema.
    Avro and JSON Schema compare by their parsed JSON, so whitespace and key order do not
    make a second id (Confluent compares a canonical form too)."""
    text = body.get("schema")
    kind = (body.get("schemaType") or "AVRO").upper()
    if not isinstance(text, str) or not text.strip():
        raise ApiError(422, 42201, "Invalid schema: empty schema")
    if kind not in SCHEMA_TYPES:
        raise ApiError(422, 42201, f"Invalid schema type {kind}")
    normalized = text
    try:
        if kind == "AVRO":
            _parse_avro_text(text)
            normalized = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
        elif kind == "JSON":
            parsed = json.loads(text)
            if not isinstance(parsed, (dict, bool)):
                raise ValueError("a JSON Schema is an object or a boolean")
            normalized = json.dumps(parsed, sort_keys=True, separators=(",", ":"))
    except ValueError as exc:
        raise ApiError(422, 42201, f"Invalid schema: {exc}") from None
    refs = body.get("references") or []
    key = json.dumps([kind, normalized, refs], sort_keys=True, separators=(",", ":"))
    return kind, key


def _schema_view(schema: dict[str, Any]) -> dict[str, Any]:
    view: dict[str, Any] = {"schema": schema["schema"]}
    if schema["schemaType"] != "AVRO":  # Confluent leaves it out for Avro
        view["schemaType"] = schema["schemaType"]
    if schema["references"]:
        view["references"] = schema["references"]
    return view


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return (query.get(name) or ["false"])[-1].strip().lower() == "true"


class Registry:
    """The REST API over a :class:`RegistryState`: ``handle(method, path, query, body)``."""

    def __init__(self, state: RegistryState) -> None:
        self.state = state
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
            ("GET", ("subjects", "*", "versions"), self.get_versions),
            ("POST", ("subjects", "*", "versions"), self.register),
            ("GET", ("subjects", "*", "versions", "*"), self.get_version),
            ("GET", ("subjects", "*", "versions", "*", "schema"), self.get_version_text),
            ("GET", ("subjects", "*", "versions", "*", "referencedby"), lambda *a: []),
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

    # schemas
    @staticmethod
    def _id(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise _schema_not_found(f"Schema {text} not found") from None

    def get_schema(self, schema_id: str, query: dict, body: Any) -> dict[str, Any]:
        # ?format= (e.g. serialized for Protobuf) answers the schema as stored: the Protobuf
        # serializer registers the serialized (base64 FileDescriptorProto) form itself.
        # ?subject= names a context in Confluent's; with the one default context every id is
        # found whatever the subject.
        schema = self.state.schema(self._id(schema_id))
        return {**_schema_view(schema), "guid": schema["guid"]}

    def get_schema_text(self, schema_id: str, query: dict, body: Any) -> str:
        return self.state.schema(self._id(schema_id))["schema"]

    def get_schema_by_guid(self, guid: str, query: dict, body: Any) -> dict[str, Any]:
        sid, schema = self.state.schema_by_guid(guid)
        return {**_schema_view(schema), "id": sid, "guid": guid}

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
        return [{"subject": s, "version": v} for s, v in uses]

    def get_schema_subjects(self, schema_id: str, query: dict, body: Any) -> list[str]:
        return sorted({s for s, _ in self._uses(self._id(schema_id), query)})

    # subjects
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
        return found

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
        entries = self._existing(subject, deleted=deleted)
        if version in ("latest", "-1"):
            live = [e for e in entries if not e["deleted"]] or entries
            return live[-1]
        try:
            number = int(version)
        except ValueError:
            raise ApiError(
                422, 42202, f"The specified version '{version}' is not a valid version id."
            ) from None
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

    def _registered(self, subject: str, entry: dict[str, Any]) -> dict[str, Any]:
        schema = self.state.schema(entry["id"])
        return {
            "subject": subject,
            "version": entry["version"],
            "id": entry["id"],
            "guid": schema["guid"],
            **_schema_view(schema),
        }

    def get_version(self, subject: str, version: str, query: dict, body: Any) -> dict[str, Any]:
        entry = self._entry(subject, version, deleted=_flag(query, "deleted"))
        return self._registered(subject, entry)

    def get_version_text(self, subject: str, version: str, query: dict, body: Any) -> str:
        entry = self._entry(subject, version, deleted=_flag(query, "deleted"))
        return self.state.schema(entry["id"])["schema"]

    def lookup(self, subject: str, query: dict, body: Any) -> dict[str, Any]:
        _, key = _canonical(body or {})
        entries = self._existing(subject, deleted=_flag(query, "deleted"))
        sid = self.state.find_id(key)
        for entry in reversed(entries):
            if entry["id"] == sid:
                return self._registered(subject, entry)
        raise _schema_not_found()

    def _compatibility_errors(
        self, subject: str, kind: str, text: str, against: list[dict[str, Any]], level: str
    ) -> list[str]:
        if level == "NONE" or not against:
            return []
        if not level.endswith("_TRANSITIVE"):
            against = against[-1:]
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
            new_node, old_node = _parse_avro_text(text), _parse_avro_text(old["schema"])
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
        body = body or {}
        kind, key = _canonical(body)
        state = self.state
        sid = state.find_id(key)
        live = state.versions(subject)
        for entry in live:
            if entry["id"] == sid:  # already there: same id, same version
                return self._register_answer(subject, entry, body["schema"])
        errors = self._compatibility_errors(
            subject, kind, body["schema"], live, state.level(subject)
        )
        if errors:
            raise ApiError(
                409,
                409,
                f'Schema being registered is incompatible with an earlier schema for subject "'
                f'{subject}", details: {errors}',
            )
        if sid is None:
            sid = state.data["next_id"]
            state.data["next_id"] = sid + 1
            state.data["schemas"][str(sid)] = {
                "schema": body["schema"],
                "schemaType": kind,
                "references": body.get("references") or [],
                "guid": str(uuid.uuid4()),
                "canonical": key,
            }
        entries = state.data["subjects"].setdefault(subject, [])
        version = max((e["version"] for e in entries), default=0) + 1
        entry = {"version": version, "id": sid, "deleted": False}
        entries.append(entry)
        state.save()
        log.info("registered id %d as %s version %d", sid, subject, version)
        return self._register_answer(subject, entry, body["schema"])

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
            raise ApiError(404, 40404, f"Subject '{subject}' was soft deleted.")
        for entry in live:
            entry["deleted"] = True
        self.state.save()
        return [e["version"] for e in live]

    def delete_version(self, subject: str, version: str, query: dict, body: Any) -> int:
        permanent = _flag(query, "permanent")
        entry = self._entry(subject, version, deleted=permanent)
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
            entry["deleted"] = True
        self.state.save()
        return int(entry["version"])

    # config and compatibility
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
        body = body or {}
        kind, _ = _canonical(body)
        level = self.state.level(subject)
        if version:
            live = self.state.versions(subject)
            if not live:
                raise _subject_not_found(subject)
            against = [self._entry(subject, version[0], deleted=False)]
            # a single version is checked under the level's direction, never transitively
            level = level.removesuffix("_TRANSITIVE")
        else:
            against = self.state.versions(subject)
        errors = self._compatibility_errors(subject, kind, body["schema"], against, level)
        answer: dict[str, Any] = {"is_compatible": not errors}
        if _flag(query, "verbose"):
            answer["messages"] = errors
        return answer


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
            return b"kafka_delta_dev.registry" in cmdline.read_bytes()
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
    parser = argparse.ArgumentParser(description="Start or stop the development Schema Registry.")
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
