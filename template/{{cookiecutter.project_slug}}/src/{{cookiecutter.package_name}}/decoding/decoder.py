"""One decoder for both engines: Kafka records (Spark's kafka columns, as Arrow) in, typed columns
out. The embedded source runs it in its read task; the cluster engine through ``mapInArrow``.

Output, in order: the value's columns (the reader schema); ``key`` (its bytes, or decoded);
``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``, ``headers``; ``_error``
(null when the record decoded); ``_raw_key`` and ``_raw_value``, the original bytes, kept only
on rows with an ``_error`` (they become dead letters with them).
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from .spec import DecodeSpec, FieldSpec, SchemaFileError

KAFKA_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestampType", "headers")
ERROR, RAW_KEY, RAW_VALUE = "_error", "_raw_key", "_raw_value"
_RESERVED = {"key", *KAFKA_COLUMNS, ERROR, RAW_KEY, RAW_VALUE}
_KAFKA_TYPES = {
    "key": pa.binary(),
    "topic": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestampType": pa.int32(),
    "headers": pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
}


class PartDecoder(Protocol):
    def decode(self, values: list[bytes | None], headers: list[Any]) -> tuple[pa.Table, list]:
        """(the reader's columns, one row per value; the error of each value or None)."""
        ...


def _key_type(key: FieldSpec) -> pa.DataType:
    """A record key as a struct column; a primitive one (a single field ``value``) as itself."""
    if key.reader.names == ["value"]:
        return key.reader.field("value").type
    return pa.struct(list(key.reader))


def output_schema(spec: DecodeSpec) -> pa.Schema:
    clash = sorted(_RESERVED & set(spec.value.reader.names))
    if clash:
        raise SchemaFileError(
            f"the value's field(s) {', '.join(clash)} have the names of the Kafka columns the "
            "decoder adds; rename them in the producers' schema, or decode with format raw"
        )
    key = _KAFKA_TYPES["key"] if spec.key is None else _key_type(spec.key)
    return pa.schema(
        [
            *spec.value.reader,
            pa.field("key", key),
            *(pa.field(name, _KAFKA_TYPES[name]) for name in KAFKA_COLUMNS),
            pa.field(ERROR, pa.string()),
            pa.field(RAW_KEY, pa.binary()),
            pa.field(RAW_VALUE, pa.binary()),
        ]
    )


def decoder_modules(spec: DecodeSpec) -> tuple[str, ...]:
    """The modules a task imports to decode with ``spec`` (to warm its workers)."""
    formats = {f.format for f in (spec.value, spec.key) if f is not None}
    names = {"avro": "avro_decoder", "protobuf": "protobuf_decoder", "json": "json_decoder"}
    return (
        __name__,
        *(f"{__package__}.{names[f]}" for f in sorted(formats) if f in names),
        *((f"{__package__}.registry",) if spec.registry is not None else ()),
    )


def _part_decoder(field: FieldSpec, spec: DecodeSpec, part: str) -> PartDecoder:
    registry = None
    if spec.registry is not None:
        from .registry import registry_for

        registry = registry_for(spec.registry)
    if field.format == "avro":
        from .avro_decoder import AvroDecoder

        return AvroDecoder(field, registry, part)
    if field.format == "protobuf":
        from .protobuf_decoder import ProtobufDecoder

        return ProtobufDecoder(field, registry, part)
    if field.format == "json":
        from .json_decoder import JsonDecoder

        return JsonDecoder(field, part)
    raise SchemaFileError(f"format {field.format} does not decode")


class Decoder:
    def __init__(self, spec: DecodeSpec) -> None:
        self.spec = spec
        self.output_schema = output_schema(spec)
        self.value = _part_decoder(spec.value, spec, "value")
        self.key = None if spec.key is None else _part_decoder(spec.key, spec, "key")

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        raw_value, raw_key = batch.column("value"), batch.column("key")
        headers = (
            batch.column("headers").to_pylist()
            if batch.column("headers").null_count < n
            else [None] * n
        )
        columns, errors = self.value.decode(raw_value.to_pylist(), headers)
        key = raw_key
        if self.key is not None:
            keys, key_errors = self.key.decode(raw_key.to_pylist(), headers)
            key = (
                keys.column(0).combine_chunks()
                if keys.column_names == ["value"]
                else pa.StructArray.from_arrays(
                    [c.combine_chunks() for c in keys.columns], fields=list(keys.schema)
                )
            )
            errors = [
                e or (f"key: {k}" if k else None) for e, k in zip(errors, key_errors, strict=True)
            ]
        error = pa.array(errors, pa.string())
        failed = pc.is_valid(error)
        none = pa.nulls(n, pa.binary())
        any_failed = error.null_count < n
        arrays = [
            *(columns.column(name).combine_chunks() for name in self.spec.value.reader.names),
            key,
            *(batch.column(name) for name in KAFKA_COLUMNS),
            error,
            pc.if_else(failed, raw_key, none) if any_failed else none,
            pc.if_else(failed, raw_value, none) if any_failed else none,
        ]
        arrays = [
            a.cast(f.type) if a.type != f.type else a
            for a, f in zip(arrays, self.output_schema, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.output_schema)


@functools.lru_cache(maxsize=8)
def decoder_for(spec_json: str) -> Decoder:
    """The decoder of a spec, one per Python worker (its schema caches live as long)."""
    return Decoder(DecodeSpec.from_json(spec_json))


def assemble(reader: pa.Schema, n: int, parts: list[tuple[list[int], pa.Table]]) -> pa.Table:
    """One table of ``n`` rows in record order from tables of some of the records (``parts``:
    (their positions, their rows)); rows of no part (records that failed) are null."""
    if not parts:
        return pa.table({f.name: pa.nulls(n, f.type) for f in reader})
    where: list[int | None] = [None] * n
    offset = 0
    tables = []
    for positions, table in parts:
        for j, i in enumerate(positions):
            where[i] = offset + j
        offset += table.num_rows
        tables.append(table.select(reader.names).cast(reader))
    whole = pa.concat_tables(tables)
    if offset == n and where == list(range(n)):
        return whole
    return whole.take(pa.array(where, pa.int64()))
