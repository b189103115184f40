"""JSON: pyarrow's JSON reader against the reader schema, a whole block of records at a time.

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
from kafka_delta.decoding.spec import FieldSpec


def _frame_problem(value: bytes, part: str) -> str | None:
    """Why a JSON Schema record lacks Confluent's 5-byte header (magic byte 0 + id), if it does."""
    if not value:
        return f"{part} is empty"
    if value[0] != 0:
        return f"wrong magic byte 0x{value[0]:02x}: not Confluent framing (0x00 + schema id)"
    if len(value) < 5:
        return f"truncated record: {len(value)} bytes, shorter than the 5-byte schema id header"
    return None


class JsonDecoder:
    def __init__(self, field: FieldSpec, part: str) -> None:
        from pyarrow import json as pa_json

        self.field = field
        self.part = part
        self.reader = field.reader
        self.framed = field.framing == "confluent"
        self._json = pa_json
        self._parse_options = pa_json.ParseOptions(
            explicit_schema=self.reader, unexpected_field_behavior="ignore"
        )

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
        for i, value in enumerate(values):
            if value is None:
                errors[i] = f"{self.part} is null"
                continue
            if self.framed:
                problem = _frame_problem(value, self.part)
                if problem is not None:
                    errors[i] = problem
                    continue
                value = value[5:]
            if b"\n" in value or b"\r" in value:
                value = value.replace(b"\r", b" ").replace(b"\n", b" ")
            if value.lstrip()[:1] != b"{":
                errors[i] = f"{self.part} is empty" if not value.strip() else "not a JSON object"
                continue
            lines.append(value)
            rows.append(i)
        parts = self._parse_all(lines, rows, errors) if lines else []
        table = assemble(self.reader, n, parts)
        for name in self.field.required:
            missing = pc.is_null(table.column(name)).to_pylist()
            for i, gone in enumerate(missing):
                if gone and errors[i] is None:
                    errors[i] = f"required field {name!r} is missing"
        return table, errors
