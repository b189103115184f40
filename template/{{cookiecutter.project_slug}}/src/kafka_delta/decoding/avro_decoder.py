"""Avro: fastavro's schemaless reader with each record's writer schema, records grouped by
schema, columns built per group for the reader's fields.

No reader-schema resolution per record (fastavro's is slower): a field the writer lacks reads
null, and a writer with fields the reader lacks, or a field of another type, is seen once per
writer schema, before any of its records is decoded. Timestamps and dates come back from
fastavro as integers (their logical type is dropped from the schema it reads with) and are
cast as whole columns: a ``datetime`` per record costs more than the rest of the record.
"""

from __future__ import annotations

import copy
import io
import itertools
import json
import struct
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kafka_delta.decoding.avro_types import avro_to_arrow
from kafka_delta.decoding.columns import assemble
from kafka_delta.decoding.framing import header_guids, parse
from kafka_delta.decoding.registry import Registry
from kafka_delta.decoding.spec import FieldSpec, SchemaChangedError, SchemaFileError
from kafka_delta.decoding.versions import compare_writer

# Logical types read as integers and cast per column: (the integer's Arrow type, micros per unit)
_AS_INTEGERS = {
    "timestamp-millis": (pa.int64(), 1000),
    "timestamp-micros": (pa.int64(), 1),
    "local-timestamp-millis": (pa.int64(), 1000),
    "local-timestamp-micros": (pa.int64(), 1),
    "date": (pa.int32(), None),
}


class _Writer:
    """A writer schema, parsed for fastavro, with the casts its integer columns need."""

    def __init__(self, schema: dict[str, Any] | str, reader: pa.Schema, ref: Any) -> None:
        from fastavro import parse_schema

        parsed = json.loads(schema) if isinstance(schema, str) else schema
        arrow = avro_to_arrow(parsed)
        new = compare_writer(reader, arrow, ref)
        if new:
            raise SchemaChangedError(tuple(new), ref)
        self.casts: dict[str, tuple[pa.DataType, int | None]] = {}
        if isinstance(parsed, dict) and parsed.get("type") == "record":
            plain = copy.deepcopy(parsed)
            for field in plain["fields"]:
                self._strip(field)
            self.parsed = parse_schema(plain)
            self.fields = [f["name"] for f in parsed["fields"]]
        else:
            self.parsed = parse_schema(parsed)
            self.fields = ["value"]
        self.primitive = self.fields == ["value"] and not (
            isinstance(parsed, dict) and parsed.get("type") == "record"
        )

    def _strip(self, field: dict[str, Any]) -> None:
        t = field["type"]
        branches = t if isinstance(t, list) else [t]
        for i, branch in enumerate(branches):
            if isinstance(branch, dict) and branch.get("logicalType") in _AS_INTEGERS:
                self.casts[field["name"]] = _AS_INTEGERS[branch["logicalType"]]
                branches[i] = branch["type"]
        field["type"] = branches if isinstance(t, list) else branches[0]


def _column(
    values: list[Any], target: pa.DataType, cast: tuple[pa.DataType, int | None] | None
) -> pa.Array:
    if cast is None:
        return pa.array(values, target)
    integers = pa.array(values, cast[0])
    if cast[1] is None:  # days since the epoch
        return integers.cast(pa.date32())
    micros = pc.multiply(integers, cast[1]) if cast[1] != 1 else integers
    return micros.cast(pa.timestamp("us", tz="UTC")).cast(target)


class AvroDecoder:
    def __init__(self, field: FieldSpec, registry: Registry | None, part: str) -> None:
        self.field = field
        self.registry = registry
        self.part = part
        self.reader = field.reader
        self._writers: dict[Any, _Writer | None] = {}
        if field.framing == "none":
            if field.writer_schema is None:
                raise SchemaFileError("unframed Avro needs the writer schema (schema_file)")
            self._writers[None] = _Writer(field.writer_schema, self.reader, "of schema_file")

    def _writer(self, ref: Any) -> _Writer | None:
        if ref in self._writers:
            return self._writers[ref]
        assert self.registry is not None
        found = (
            self.registry.schema_by_guid(ref)
            if isinstance(ref, str)
            else self.registry.schema_by_id(ref)
        )
        if found is None:
            return None  # not cached: the id may be registered by the next look-up
        if found.schema_type != "AVRO":
            raise SchemaFileError(
                f"schema id {ref} is a {found.schema_type} schema, but decoding.{self.part}."
                "format is avro"
            )
        writer = self._writers[ref] = _Writer(found.schema_str, self.reader, ref)
        return writer

    def decode(self, values: list[bytes | None], headers: list[Any]) -> tuple[pa.Table, list]:
        from fastavro import schemaless_reader

        n = len(values)
        errors: list[str | None] = [None] * n
        groups: dict[Any, list[tuple[int, int]]] = {}
        framed = self.field.framing == "confluent"
        guids = header_guids(headers, self.part) if framed else [None] * n
        for i, value in enumerate(values):
            if value is None:
                errors[i] = f"{self.part} is null"
                continue
            if not framed:
                groups.setdefault(None, []).append((i, 0))
                continue
            if guids[i] is None and len(value) > 4 and value[0] == 0:  # the common case, inline
                groups.setdefault(int.from_bytes(value[1:5], "big"), []).append((i, 5))
                continue
            frame = parse(value, guids[i], protobuf=False)
            if isinstance(frame, str):
                errors[i] = frame
            else:
                groups.setdefault(frame.schema, []).append((i, frame.start))
        parts = []
        for ref, members in groups.items():
            writer = self._writer(ref)
            if writer is None:
                for i, _ in members:
                    errors[i] = f"unknown schema id {ref}: the Schema Registry does not have it"
                continue
            # The group's records back to back in one stream: one reader call per record and no
            # stream per record. Each record must end exactly where its bytes do; one that does
            # not is a dead letter, and the next is read from its own start.
            group = [values[i] for i, _ in members]
            ends = list(itertools.accumulate(map(len, group)))
            stream = io.BytesIO(b"".join(group))
            records, positions = [], []
            begin = 0
            for (i, start), end in zip(members, ends, strict=True):
                stream.seek(begin + start)
                begin = end
                try:
                    record = schemaless_reader(stream, writer.parsed, None)
                    if stream.tell() != end:
                        raise ValueError(f"{end - stream.tell()} bytes left over after the record")
                except (EOFError, IndexError, struct.error):
                    errors[i] = f"truncated record: it ends before schema {ref} says it does"
                    continue
                except Exception as exc:
                    errors[i] = f"bytes do not match schema {ref}: {exc}"
                    continue
                records.append({"value": record} if writer.primitive else record)
                positions.append(i)
            if not records:
                continue
            columns = {
                f.name: _column([r.get(f.name) for r in records], f.type, writer.casts.get(f.name))
                if f.name in writer.fields
                else pa.nulls(len(records), f.type)
                for f in self.reader
            }
            parts.append((positions, pa.table(columns)))
        return assemble(self.reader, n, parts), errors
