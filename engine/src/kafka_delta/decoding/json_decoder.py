"""JSON: pyarrow's JSON reader against the reader schema, a whole block of records at a time.
Plain JSON, or JSON Schema in Confluent's framing (``confluent_kafka``'s ``JSONSerializer``:
magic byte 0 + the schema id, or the id in a schema-id header, then the JSON text): each
writer schema is looked up once and compared with the reader's, as Avro's are, and its
``required`` fields are checked on its records (a producer's serializer need not validate:
Java's does not by default).

pyarrow has no per-row error handler, so the values are first checked for what would shift
rows (null, empty, not an object), joined one per line (a newline inside a JSON value can only
be whitespace, so it becomes a space), and parsed at once. Only when the block fails, or gives
another number of rows than lines, is it cut in halves until each bad line is found alone.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kafka_delta.decoding.columns import assemble
from kafka_delta.decoding.json_types import json_schema_to_arrow, read_schema, required_of
from kafka_delta.decoding.schema_registry import Registry
from kafka_delta.decoding.spec import (
    FieldSpec,
    SchemaChangedError,
    SchemaFileError,
    SchemaIncompatibleError,
)
from kafka_delta.decoding.versions import compare_writer
from kafka_delta.decoding.wire_format import header_guids, parse


class JsonDecoder:
    def __init__(self, field: FieldSpec, part: str, registry: Registry | None = None) -> None:
        from pyarrow import json as pa_json

        self.field = field
        self.part = part
        self.registry = registry
        self.reader = field.reader
        self.framed = field.framing == "confluent"
        self._json = pa_json
        self._read = read_schema(self.reader)
        self._cast = self._read != self.reader
        self._parse_options = pa_json.ParseOptions(
            explicit_schema=self._read, unexpected_field_behavior="ignore"
        )
        self._known: dict[Any, str | None] = {}  # writer schema (id or GUID) -> its problem
        # writer schema -> its required fields, each with whether null is a value of its type;
        # None: the reader's (a schema file's, whose required fields take no null)
        self._required: dict[Any, dict[str, bool]] = {None: dict.fromkeys(field.required, False)}

    def _writer_problem(self, ref: Any) -> str | None:
        """Why records of writer schema ``ref`` cannot be read (None: they can). Raises
        :class:`SchemaChangedError` when the writer has fields the reader lacks (the query
        restarts with them). Only ``json_schema`` (a reader from the registry) has a registry
        here; ``json`` reads each record's JSON with its own reader schema whatever the id."""
        if self.registry is None:
            return None
        if ref in self._known:
            return self._known[ref]
        found = (
            self.registry.schema_by_guid(ref)
            if isinstance(ref, str)
            else self.registry.schema_by_id(ref)
        )
        if found is None:  # not cached: the id may be registered by the next look-up
            return f"unknown schema id {ref}: the Schema Registry does not have it"
        if found.schema_type != "JSON":
            raise SchemaFileError(
                f"schema id {ref} is a {found.schema_type} schema, but decoding.{self.part}."
                f"format is {self.field.format}"
            )
        try:
            new = compare_writer(self.reader, json_schema_to_arrow(found.schema_str)[0], ref)
        except (SchemaIncompatibleError, SchemaFileError) as exc:
            problem = self._known[ref] = str(exc)
            return problem
        if new:
            raise SchemaChangedError(tuple(new), ref)
        self._required[ref] = required_of(found.schema_str)
        self._known[ref] = None
        return None

    def _parse(self, lines: list[bytes]) -> pa.Table | str:
        block = b"\n".join(lines) + b"\n"
        try:
            table = self._json.read_json(
                pa.BufferReader(block),
                read_options=self._json.ReadOptions(
                    use_threads=False, block_size=max(len(block) + 1, 1 << 20)
                ),
                parse_options=self._parse_options,
            )
            if self._cast:
                table = table.cast(self.reader)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            return str(exc).splitlines()[0]
        if table.num_rows != len(lines):
            return "not one JSON object"
        return table

    def _parse_all(
        self, lines: list[bytes], rows: list[int], errors: list[str | None]
    ) -> list[tuple[list[int], pa.Table]]:
        """Tables of the good lines (with their row numbers); bad lines' errors set."""
        parsed = self._parse(lines)
        if isinstance(parsed, pa.Table):
            return [(rows, parsed)]
        if len(lines) == 1:
            errors[rows[0]] = f"malformed JSON, or a field of the wrong type: {parsed}"
            return []
        half = len(lines) // 2
        return self._parse_all(lines[:half], rows[:half], errors) + self._parse_all(
            lines[half:], rows[half:], errors
        )

    def decode(self, values: list[bytes | None], headers: list[Any]) -> tuple[pa.Table, list]:
        n = len(values)
        errors: list[str | None] = [None] * n
        lines, rows = [], []
        writers: list[Any] = [None] * n  # each row's writer schema (None: the reader's)
        starts = [0] * n  # where each record's JSON starts
        guids = header_guids(headers, self.part) if self.framed else [None] * n
        for i, value in enumerate(values):
            if value is None:
                errors[i] = f"{self.part} is null"
                continue
            if self.framed:
                if not value and guids[i] is None:
                    errors[i] = f"{self.part} is empty"
                    continue
                frame = parse(value, guids[i], protobuf=False)
                if isinstance(frame, str):
                    errors[i] = frame
                    continue
                problem = self._writer_problem(frame.schema)
                if problem is not None:
                    errors[i] = problem
                    continue
                value = value[frame.start :]
                starts[i] = frame.start
                if self.registry is not None:
                    writers[i] = frame.schema
            if b"\n" in value or b"\r" in value:
                value = value.replace(b"\r", b" ").replace(b"\n", b" ")
            if value.lstrip()[:1] != b"{":
                errors[i] = f"{self.part} is empty" if not value.strip() else "not a JSON object"
                continue
            lines.append(value)
            rows.append(i)
        parts = self._parse_all(lines, rows, errors) if lines else []
        table = assemble(self.reader, n, parts)
        self._check_required(table, values, starts, writers, errors)
        return table, errors

    def _check_required(
        self,
        table: pa.Table,
        values: list[bytes | None],
        starts: list[int],
        writers: list[Any],
        errors: list[str | None],
    ) -> None:
        """A row whose writer schema's required field is null in its column is a dead letter,
        unless null is a value of the field's type and the record has it (its JSON is read
        again, for those rows only: the column cannot tell null from missing)."""
        names = {name for ref in set(writers) for name in self._required.get(ref, {})}
        for name in sorted(names & set(self.reader.names)):  # required without a property:
            column = table.column(name)  # no column to check it by
            if not column.null_count:
                continue
            for i in pc.indices_nonzero(pc.is_null(column)).to_pylist():
                required = self._required.get(writers[i], {})
                if errors[i] is not None or name not in required:
                    continue
                present = _has_key(values[i], starts[i], name)
                if present and required[name]:
                    continue
                of = "" if writers[i] is None else f" of schema {writers[i]}"
                errors[i] = (
                    f"required field {name!r}{of} is null, which its type does not take"
                    if present
                    else f"required field {name!r}{of} is missing"
                )


def _has_key(value: bytes | None, start: int, name: str) -> bool:
    """Whether the JSON object in ``value`` from ``start`` has the top-level key ``name``."""
    import json

    try:
        record = json.loads((value or b"")[start:])
    except ValueError:
        return False
    return isinstance(record, dict) and name in record
