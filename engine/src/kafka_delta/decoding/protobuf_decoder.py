"""Protobuf: the protobuf runtime, with message classes built from the registry's descriptors
(Confluent framing: schema id and message indexes, references resolved through the registry) or
from the project's descriptor set. The columns each type becomes: :mod:`.protobuf_types`."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from kafka_delta.decoding.columns import assemble
from kafka_delta.decoding.protobuf_types import (
    default_message,
    find_message,
    is_map,
    is_repeated,
    message_kind,
    message_to_arrow,
    protobuf_file,
)
from kafka_delta.decoding.schema_registry import Registry
from kafka_delta.decoding.spec import (
    FieldSpec,
    MessageSeenError,
    SchemaChangedError,
    SchemaFileError,
)
from kafka_delta.decoding.versions import compare_writer
from kafka_delta.decoding.wire_format import header_guids, parse

Convert = Callable[[Any], Any]


def _micros(seconds: int, nanos: int) -> int:
    """Microseconds of (seconds, nanos) of the same sign, truncated toward zero."""
    return seconds * 1_000_000 + (nanos // 1000 if nanos >= 0 else -(-nanos // 1000))


def _to_json(message: Any) -> str:
    from google.protobuf import json_format

    try:
        data = json_format.MessageToDict(
            message,
            preserving_proto_field_name=True,
            descriptor_pool=message.DESCRIPTOR.file.pool,
        )
    except (TypeError, KeyError, ValueError):  # an Any whose packed type is not in the schema
        if message.DESCRIPTOR.full_name != "google.protobuf.Any":
            raise
        data = {"@type": message.type_url, "value": base64.b64encode(message.value).decode()}
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _item(field: Any, path: tuple[str, ...]) -> Convert | None:
    """What one value of ``field`` becomes (an item, for a repeated field); None: itself."""
    from google.protobuf.descriptor import FieldDescriptor as F

    kind = message_kind(field, path)
    if kind is None:
        if field.type == F.TYPE_ENUM:
            by_number = {v.number: v.name for v in field.enum_type.values}
            return lambda raw: by_number.get(raw, str(raw))
        return None
    if kind == "timestamp":
        return lambda raw: raw.seconds * 1_000_000 + raw.nanos // 1000
    if kind == "duration":
        return lambda raw: _micros(raw.seconds, raw.nanos)
    if kind == "wrapper":
        inner = _item(field.message_type.fields_by_name["value"], path)
        if inner is None:
            return lambda raw: raw.value
        return lambda raw: inner(raw.value)
    if kind in ("json", "recursive"):
        return _to_json
    if kind == "empty":
        return lambda raw: True
    t = field.message_type
    fields = [(f.name, _value(f, (*path, t.full_name))) for f in t.fields]
    return lambda raw: {name: get(raw) for name, get in fields}


def _value(field: Any, path: tuple[str, ...]) -> Callable[[Any], Any]:
    """Reads ``field`` of a parsed message as a value Arrow takes for its column."""
    name = field.name
    if is_map(field):
        key = _item(field.message_type.fields_by_name["key"], path)
        value = _item(field.message_type.fields_by_name["value"], path)
        if key is None and value is None:
            return lambda m: list(getattr(m, name).items())
        k = key or (lambda x: x)
        v = value or (lambda x: x)
        return lambda m: [(k(a), v(b)) for a, b in getattr(m, name).items()]
    item = _item(field, path)
    if is_repeated(field):
        if item is None:
            return lambda m: list(getattr(m, name))
        return lambda m: [item(x) for x in getattr(m, name)]
    if field.has_presence:
        if item is None:
            return lambda m: getattr(m, name) if m.HasField(name) else None
        return lambda m: item(getattr(m, name)) if m.HasField(name) else None
    if item is None:
        return lambda m: getattr(m, name)
    return lambda m: item(getattr(m, name))


def _column(field: Any, path: tuple[str, ...]) -> Callable[[list[Any]], list[Any]]:
    """One field of every message: plain attribute reads for the common scalar fields (this
    runs per record and field), the general :func:`_value` for the rest."""
    from google.protobuf.descriptor import FieldDescriptor as F

    name = field.name
    plain = not is_repeated(field) and field.type not in (
        F.TYPE_ENUM,
        F.TYPE_MESSAGE,
        F.TYPE_GROUP,
    )
    if plain and not field.has_presence:
        return lambda messages: [getattr(m, name) for m in messages]
    if plain:
        return lambda messages: [getattr(m, name) if m.HasField(name) else None for m in messages]
    get = _value(field, path)
    return lambda messages: [get(m) for m in messages]


class _Writer:
    """The records of one writer message: its class and how each reader column is read; or,
    for a message the table does not take, why (``refused``: its records are dead letters)."""

    def __init__(self, descriptor: Any, reader: pa.Schema, ref: Any, expected: str) -> None:
        from google.protobuf import message_factory
        from google.protobuf.descriptor import FieldDescriptor as F

        self.ref = ref
        self.carries = descriptor.full_name
        self.expected = expected
        self.refused: str | None = None
        if descriptor.full_name != expected:
            self.refused = (
                f"the record carries message {descriptor.full_name} (schema {ref}), but the "
                f"table takes {expected}: set decoding.<part>.message to {descriptor.full_name} "
                "for a table of those"
            )
            return
        arrow = message_to_arrow(descriptor)
        new = compare_writer(reader, arrow, ref)
        if new:
            raise SchemaChangedError(tuple(new), ref)
        self.cls = message_factory.GetMessageClass(descriptor)
        path = (descriptor.full_name,)
        fields = [
            descriptor.fields_by_name[n] for n in reader.names if n in descriptor.fields_by_name
        ]
        self.columns: list[tuple[str, Callable[[list[Any]], list[Any]], bool]] = []
        for f in fields:
            stamp = (
                f.type == F.TYPE_MESSAGE
                and not is_repeated(f)
                and message_kind(f, path) == "timestamp"
            )
            self.columns.append((f.name, _column(f, path), stamp))


class ProtobufDecoder:
    def __init__(self, field: FieldSpec, registry: Registry | None, part: str) -> None:
        self.field = field
        self.registry = registry
        self.part = part
        self.reader = field.reader
        self._writers: dict[tuple[Any, tuple[int, ...]], _Writer | None] = {}
        self._files: dict[Any, Any] = {}
        if field.framing == "none":
            if field.writer_schema is None:
                raise SchemaFileError("unframed Protobuf needs the descriptor set (schema_file)")
            data = base64.b64decode(field.writer_schema)
            descriptor = find_message(protobuf_file(data), field.message)
            self._writers[(None, ())] = _Writer(
                descriptor, self.reader, "of schema_file", descriptor.full_name
            )

    def _file(self, ref: Any) -> Any:
        """The registry's file of schema ``ref`` (an id or a GUID), its references resolved;
        None when the registry does not know ``ref``."""
        if ref in self._files:
            return self._files[ref]
        assert self.registry is not None
        found = (
            self.registry.schema_by_guid(ref, fmt="serialized")
            if isinstance(ref, str)
            else self.registry.schema_by_id(ref, fmt="serialized")
        )
        if found is None:
            return None
        if found.schema_type != "PROTOBUF":
            raise SchemaFileError(
                f"schema id {ref} is a {found.schema_type} schema, but decoding.{self.part}."
                "format is protobuf"
            )
        try:
            file = protobuf_file(found.schema_str, self.registry.protobuf_imports(ref))
        except SchemaFileError as exc:  # its records are dead letters; the rest goes on
            return f"schema {ref} does not build: {exc}"
        self._files[ref] = file
        return file

    def _writer(self, ref: Any, indexes: tuple[int, ...]) -> _Writer | str | None:
        key = (ref, indexes)
        if key in self._writers:
            return self._writers[key]
        file = self._file(ref)
        if file is None or isinstance(file, str):
            return file
        try:
            descriptor = find_message(file, None, indexes)
        except SchemaFileError as exc:
            return f"schema {ref}: {exc}"
        expected = self.field.message or default_message(file).full_name
        writer = self._writers[key] = _Writer(descriptor, self.reader, ref, expected)
        if writer.refused:
            writer.refused = writer.refused.replace("<part>", self.part)
        return writer

    def _check_guess(self, groups: dict[Any, list[tuple[int, int]]]) -> None:
        """Without ``message:``, the reader's columns are the file's default message, a guess:
        the frames say which message each record is. A batch with records of that message
        keeps it (the others are dead letters: one table, one message); a batch with none of
        them raises :class:`MessageSeenError` for the message most of its records carry (the
        query restarts with its columns)."""
        carried: dict[str, int] = {}
        refs: dict[str, Any] = {}
        guessed = None
        for (ref, indexes), members in groups.items():
            writer = self._writer(ref, indexes)
            if not isinstance(writer, _Writer):
                continue
            if writer.refused is None:
                return  # records of the reader's message are here
            guessed = writer.expected
            carried[writer.carries] = carried.get(writer.carries, 0) + len(members)
            refs.setdefault(writer.carries, ref)
        if carried and guessed is not None:
            message = max(sorted(carried), key=carried.__getitem__)
            raise MessageSeenError(message, refs[message], guessed)

    def decode(self, values: list[bytes | None], headers: list[Any]) -> tuple[pa.Table, list]:
        from google.protobuf.message import DecodeError

        n = len(values)
        errors: list[str | None] = [None] * n
        framed = self.field.framing == "confluent"
        guids = header_guids(headers, self.part) if framed else [None] * n
        groups: dict[Any, list[tuple[int, int]]] = {}
        for i, value in enumerate(values):
            if value is None:
                errors[i] = f"{self.part} is null"
                continue
            if not framed:
                groups.setdefault((None, ()), []).append((i, 0))
                continue
            if guids[i] is None and len(value) > 5 and value[0] == 0 and value[5] == 0:
                # The common case inline: schema id, then the single 0 of message index [0].
                groups.setdefault((int.from_bytes(value[1:5], "big"), (0,)), []).append((i, 6))
                continue
            frame = parse(value, guids[i], protobuf=True)
            if isinstance(frame, str):
                errors[i] = frame
            else:
                groups.setdefault((frame.schema, frame.indexes), []).append((i, frame.start))
        if framed and self.field.message is None:
            self._check_guess(groups)
        parts = []
        for (ref, indexes), members in groups.items():
            writer = self._writers[(None, ())] if ref is None else self._writer(ref, indexes)
            if writer is None or isinstance(writer, str) or writer.refused:
                reason = (
                    f"unknown schema id {ref}: the Schema Registry does not have it"
                    if writer is None
                    else writer
                    if isinstance(writer, str)
                    else writer.refused
                )
                for i, _ in members:
                    errors[i] = reason
                continue
            messages, positions = [], []
            for i, start in members:
                try:
                    messages.append(writer.cls.FromString(values[i][start:]))
                except DecodeError as exc:
                    errors[i] = (
                        f"bytes do not match schema {ref}: {exc} (truncated or not protobuf)"
                    )
                    continue
                except RecursionError:
                    errors[i] = f"bytes of schema {ref} nest deeper than protobuf parses"
                    continue
                positions.append(i)
            if not messages:
                continue
            columns = {}
            for name, read, stamp in writer.columns:
                target = self.reader.field(name).type
                if stamp:
                    columns[name] = pa.array(read(messages), pa.int64()).cast(target)
                else:
                    columns[name] = pa.array(read(messages), target)
            for f in self.reader:
                if f.name not in columns:
                    columns[f.name] = pa.nulls(len(messages), f.type)
            parts.append((positions, pa.table(columns)))
        return assemble(self.reader, n, parts), errors
