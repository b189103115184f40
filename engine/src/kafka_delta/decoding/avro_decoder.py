"""Avro: fastavro's schemaless reader with each record's writer schema, records grouped by
schema, columns built per group for the reader's fields.

No reader-schema resolution per record (fastavro's is slower): a field the writer lacks reads
the reader's default (the newest version's ``default`` of the field, kept in the reader's field
metadata by :func:`.avro_types.avro_to_arrow`), put in as one constant column for the writer's
whole group of records; a field without a default reads null. Each writer schema is compared
with the reader once, before any of its records is decoded (:func:`.versions.compare_writer`):

- fields the reader lacks: :class:`SchemaChangedError` (the query restarts with them), for a
  schema of the topic's own subject;
- a type the reader's column cannot take by any rule (:mod:`.versions`), or a schema
  registered under another subject (``subject_name_strategy: topic_name``): every record of
  that schema is a dead letter with the schema id and the reason; the rest of the batch lands.

Logical types come back from fastavro as plain values (they are left out of the schema it
reads with, :func:`.avro_types.plain_schema`) and become their columns as whole Arrow
columns (:func:`.avro_types.finish`): a ``datetime`` or ``UUID`` per record costs more than the
rest of the record. Columns of another type than the reader's (a promotion, a union) are fitted
to it as whole columns too (:func:`.versions.fit_column`); a value that does not fit makes its
record a dead letter.
"""

from __future__ import annotations

import io
import itertools
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kafka_delta.decoding.avro_types import (
    AvroColumn,
    avro_columns,
    field_default,
    finish,
    is_record,
    parse,
    plain_schema_tagged,
)
from kafka_delta.decoding.columns import assemble
from kafka_delta.decoding.schema_registry import Registry
from kafka_delta.decoding.spec import (
    FieldSpec,
    SchemaChangedError,
    SchemaFileError,
    SchemaIncompatibleError,
)
from kafka_delta.decoding.versions import compare_writer, fit_column
from kafka_delta.decoding.wire_format import header_guids
from kafka_delta.decoding.wire_format import parse as parse_frame


class _Writer:
    """A writer schema, parsed for fastavro, with its columns; or why its records are refused
    (``rejected``)."""

    def __init__(self, schema: Any, reader: pa.Schema, ref: Any) -> None:
        from fastavro import parse_schema

        self.ref = ref
        self.rejected: str | None = None
        parsed = parse(schema)
        names, columns = avro_columns(parsed)
        arrow = pa.schema(
            pa.field(n, c.final, nullable=c.nullable) for n, c in zip(names, columns, strict=True)
        )
        try:
            new = compare_writer(reader, arrow, ref, checked=True)
        except SchemaIncompatibleError as exc:
            self.rejected = str(exc)
            return
        if new:
            raise SchemaChangedError(tuple(new), ref)
        self.columns: dict[str, AvroColumn] = dict(zip(names, columns, strict=True))
        plain, tagged = plain_schema_tagged(parsed)
        self.parsed = parse_schema(plain)
        # fastavro's named-type tags cost about a fifth of its read: asked only where a union
        # needs them to tell its branches apart.
        self.tags = (
            {"return_named_type": True, "return_named_type_override": True} if tagged else {}
        )
        self.primitive = not is_record(parsed)


def _build(values: list[Any], column: AvroColumn) -> pa.Array:
    if column.prep is not None:
        values = [column.prep(v) for v in values]
    return finish(pa.array(values, column.raw), column.final)


class AvroDecoder:
    def __init__(self, field: FieldSpec, registry: Registry | None, part: str) -> None:
        self.field = field
        self.registry = registry
        self.part = part
        self.reader = field.reader
        self._defaults = _defaults(self.reader)
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
        foreign = self._foreign(ref)
        if foreign is not None:
            writer = _Writer.__new__(_Writer)
            writer.ref, writer.rejected = ref, foreign
        else:
            writer = _Writer(found.schema_str, self.reader, ref)
        self._writers[ref] = writer
        return writer

    def _foreign(self, ref: Any) -> str | None:
        """Why ``ref`` is not a schema of the topics' subjects; None when it is (or when any
        subject is taken)."""
        subjects = self.field.subjects
        if not subjects or not isinstance(ref, int):
            return None
        assert self.registry is not None
        theirs = self.registry.subjects_of(ref) or ()
        if not set(theirs) & set(subjects):  # a cached answer may predate our subject
            theirs = self.registry.subjects_of(ref, fresh=True) or ()
        if set(theirs) & set(subjects):
            return None
        where = ", ".join(theirs) if theirs else "no subject"
        return (
            f"schema id {ref} is registered under {where}, not {', '.join(subjects)}: a record "
            f"framed with another subject's schema (decoding.{self.part}.subject_name_strategy "
            "is topic_name)"
        )

    def decode(self, values: list[bytes | None], headers: list[Any]) -> tuple[pa.Table, list]:
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
            frame = parse_frame(value, guids[i], protobuf=False)
            if isinstance(frame, str):
                errors[i] = frame
            else:
                groups.setdefault(frame.schema, []).append((i, frame.start))
        parts = []
        for ref, members in groups.items():
            writer = self._writer(ref)
            if writer is None or writer.rejected is not None:
                reason = (
                    f"unknown schema id {ref}: the Schema Registry does not have it"
                    if writer is None
                    else writer.rejected
                )
                for i, _ in members:
                    errors[i] = reason
                continue
            records, positions = self._read(writer, values, members, errors)
            if records:
                part = self._columns(writer, records, positions, errors)
                if part is not None:
                    parts.append(part)
        return assemble(self.reader, n, parts), errors

    def _read(
        self,
        writer: _Writer,
        values: list[bytes | None],
        members: list[tuple[int, int]],
        errors: list[str | None],
    ) -> tuple[list[Any], list[int]]:
        """The group's records back to back in one stream: one reader call per record and no
        stream per record. Each record must end exactly where its bytes do; one that does not
        is a dead letter, and the next is read from its own start."""
        from fastavro import schemaless_reader

        ref = writer.ref
        group = [values[i] for i, _ in members]
        ends = list(itertools.accumulate(map(len, group)))  # type: ignore[arg-type]
        stream = io.BytesIO(b"".join(group))  # type: ignore[arg-type]
        records, positions = [], []
        begin = 0
        for (i, start), end in zip(members, ends, strict=True):
            stream.seek(begin + start)
            begin = end
            try:
                record = schemaless_reader(stream, writer.parsed, None, **writer.tags)
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
        return records, positions

    def _columns(
        self, writer: _Writer, records: list[Any], positions: list[int], errors: list[str | None]
    ) -> tuple[list[int], pa.Table] | None:
        """The reader's columns of a group's records: whole columns; one record at a time
        only when a whole column fails (to find the records that make it fail)."""
        try:
            table, bad = self._table(writer, records)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            if len(records) == 1:
                errors[positions[0]] = f"schema id {writer.ref}: {_sentence(exc)}"
                return None
            tables, kept = [], []
            for record, i in zip(records, positions, strict=True):
                one = self._columns(writer, [record], [i], errors)
                if one is not None:
                    tables.append(one[1])
                    kept.append(i)
            return (kept, pa.concat_tables(tables)) if tables else None
        if bad is None:
            return positions, table
        marks = bad.to_pylist()
        for i, reason in ((p, r) for p, r in zip(positions, marks, strict=True) if r):
            errors[i] = reason
        keep = pa.array([not r for r in marks], pa.bool_())
        kept = [p for p, r in zip(positions, marks, strict=True) if not r]
        return (kept, table.filter(keep)) if kept else None

    def _table(self, writer: _Writer, records: list[Any]) -> tuple[pa.Table, pa.Array | None]:
        """(the columns, the reason per record that did not fit the reader, or None)."""
        columns, reasons = {}, None
        for f in self.reader:
            column = writer.columns.get(f.name)
            if column is None:
                default = self._defaults.get(f.name)
                one = _null_value(f.type) if default is None else default
                columns[f.name] = one.take(np.zeros(len(records), dtype=np.int64))
                continue
            built = _build([r.get(f.name) for r in records], column)
            fitted, bad, why = fit_column(built, f.type, f"field {f.name!r}")
            columns[f.name] = fitted
            if bad is not None:
                reason = pa.scalar(f"schema id {writer.ref}: {why}", pa.string())
                none = pa.scalar(None, pa.string())
                mine = pc.if_else(bad, reason, none)
                reasons = mine if reasons is None else pc.coalesce(reasons, mine)
        return pa.table(columns), reasons


def _null_value(t: pa.DataType) -> pa.Array:
    """One null of type ``t`` whose nested non-null fields hold a value (``pa.nulls`` leaves
    them null, which the reader's type refuses: a record field a FORWARD-compatible version
    added without a default, whose record has required fields)."""
    return pa.array([None], t)


def _defaults(reader: pa.Schema) -> dict[str, pa.Array]:
    """The reader's fields' defaults (:func:`.avro_types.field_default`) as one-value columns
    of the reader's types; a default that does not fit its column is left out (reads null)."""
    found = {}
    for f in reader:
        default = field_default(f)
        if default is None:
            continue
        try:
            fitted, bad, _ = fit_column(default, f.type, f"field {f.name!r}")
        except (pa.ArrowException, ValueError, TypeError, StopIteration):
            continue
        if bad is None and fitted.null_count == 0:
            found[f.name] = fitted
    return found


def _sentence(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"a value does not fit its column: {text[0] if text else type(exc).__name__}"
