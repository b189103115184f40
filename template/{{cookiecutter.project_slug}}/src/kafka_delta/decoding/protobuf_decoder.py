"""Protobuf: the protobuf runtime, with message classes built from the registry's descriptors
(Confluent framing: schema id and message indexes) or from the project's descriptor set."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from kafka_delta.decoding.columns import assemble
from kafka_delta.decoding.framing import header_guids, parse
from kafka_delta.decoding.protobuf_types import is_repeated, message_to_arrow, protobuf_descriptor
from kafka_delta.decoding.registry import Registry
from kafka_delta.decoding.spec import FieldSpec, SchemaChangedError, SchemaFileError
from kafka_delta.decoding.versions import compare_writer


def _value(message: Any, field: Any) -> Any:
    """A field of a parsed message as a Python value Arrow takes (Timestamp as microseconds)."""
    if not is_repeated(field) and field.has_presence and not message.HasField(field.name):
        return None
    raw = getattr(message, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return list(raw.items())
    if is_repeated(field):
        return [_scalar(v, field) for v in raw]
    return _scalar(raw, field)


def _scalar(raw: Any, field: Any) -> Any:
    from google.protobuf.descriptor import FieldDescriptor as F

    if field.type == F.TYPE_ENUM:
        value = field.enum_type.values_by_number.get(raw)
        return value.name if value is not None else str(raw)
    if field.type == F.TYPE_MESSAGE:
        if field.message_type.full_name == "google.protobuf.Timestamp":
            return raw.seconds * 1_000_000 + raw.nanos // 1000
        return {f.name: _value(raw, f) for f in field.message_type.fields}
    return raw


def _column(messages: list[Any], field: Any) -> list[Any]:
    """One field of every message: plain attribute reads for the common scalar fields (this
    runs per record and field), the general :func:`_value` for the rest."""
    from google.protobuf.descriptor import FieldDescriptor as F

    name = field.name
    plain = not is_repeated(field) and field.type not in (F.TYPE_ENUM, F.TYPE_MESSAGE)
    if plain and not field.has_presence:
        return [getattr(m, name) for m in messages]
    if plain:
        return [getattr(m, name) if m.HasField(name) else None for m in messages]
    if field.type == F.TYPE_MESSAGE and field.message_type.full_name == "google.protobuf.Timestamp":
        if not is_repeated(field):
            stamps = [getattr(m, name) if m.HasField(name) else None for m in messages]
            return [None if t is None else t.seconds * 1_000_000 + t.nanos // 1000 for t in stamps]
    return [_value(m, field) for m in messages]


class _Writer:
    def __init__(self, descriptor: Any, reader: pa.Schema, ref: Any) -> None:
        from google.protobuf import message_factory

        arrow = message_to_arrow(descriptor)
        new = compare_writer(reader, arrow, ref)
        if new:
            raise SchemaChangedError(tuple(new), ref)
        self.cls = message_factory.GetMessageClass(descriptor)
        self.fields = [
            descriptor.fields_by_name[n] for n in reader.names if n in descriptor.fields_by_name
        ]
        self.timestamps = {
            f.name
            for f in self.fields
            if f.message_type is not None
            and f.message_type.full_name == "google.protobuf.Timestamp"
        }


class ProtobufDecoder:
    def __init__(self, field: FieldSpec, registry: Registry | None, part: str) -> None:
        self.field = field
        self.registry = registry
        self.part = part
        self.reader = field.reader
        self._writers: dict[tuple[Any, tuple[int, ...]], _Writer | None] = {}
        self._files: dict[Any, str | None] = {}
        if field.framing == "none":
            if field.writer_schema is None:
                raise SchemaFileError("unframed Protobuf needs the descriptor set (schema_file)")
            import base64

            data = base64.b64decode(field.writer_schema)
            self._writers[(None, ())] = _Writer(
                protobuf_descriptor(data, field.message), self.reader, "of schema_file"
            )

    def _writer(self, ref: Any, indexes: tuple[int, ...]) -> _Writer | None:
        key = (ref, indexes)
        if key in self._writers:
            return self._writers[key]
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
        descriptor = protobuf_descriptor(found.schema_str, None, indexes)
        writer = self._writers[key] = _Writer(descriptor, self.reader, ref)
        return writer

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
        parts = []
        for (ref, indexes), members in groups.items():
            writer = self._writers[(None, ())] if ref is None else self._writer(ref, indexes)
            if writer is None:
                for i, _ in members:
                    errors[i] = f"unknown schema id {ref}: the Schema Registry does not have it"
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
                positions.append(i)
            if not messages:
                continue
            columns = {}
            for f in writer.fields:
                target = self.reader.field(f.name).type
                values_of = _column(messages, f)
                if f.name in writer.timestamps:
                    columns[f.name] = pa.array(values_of, pa.int64()).cast(target)
                else:
                    columns[f.name] = pa.array(values_of, target)
            for f in self.reader:
                if f.name not in columns:
                    columns[f.name] = pa.nulls(len(messages), f.type)
            parts.append((positions, pa.table(columns)))
        return assemble(self.reader, n, parts), errors
