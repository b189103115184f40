"""One decoder for both engines: Kafka records (Spark's kafka columns, as Arrow) in, typed columns
out. The embedded source runs it in its read task; the cluster engine in an Arrow UDF
(:mod:`.dataframe`).

Output, in order: the value's columns (the reader schema; with ``envelope: debezium`` the
row's, and ``_op``, see :mod:`.envelope`); ``key`` (its bytes, or decoded);
``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``, ``headers``; ``_error``
(null when the record decoded); ``_raw_key`` and ``_raw_value``, the original bytes, kept only
on rows with an ``_error`` (they become dead letters with them); with ``tombstone_keys``,
``_key_delete`` (:data:`~kafka_delta.contract.KEY_DELETE_COLUMN`, the engine's own: a row read
as a delete of its key keeps its bytes too, for a table that takes it as a dead letter).
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from kafka_delta.contract import (
    DEAD_LETTER_COLUMN,
    KAFKA_ARROW_SCHEMA,
    KEY_DELETE_COLUMN,
    OP_COLUMN,
    RAW_KEY,
    RAW_VALUE,
    RECORD_COLUMNS,
)
from kafka_delta.decoding.columns import column_names, distinct_type
from kafka_delta.decoding.envelope import row_fields, value_arrays
from kafka_delta.decoding.spec import DecodeSpec, FieldSpec, SchemaFileError

_RESERVED = {"key", *RECORD_COLUMNS, DEAD_LETTER_COLUMN, RAW_KEY, RAW_VALUE}


class PartDecoder(Protocol):
    def decode(self, values: list[bytes | None], headers: list[Any]) -> tuple[pa.Table, list]:
        """(the reader's columns, one row per value; the error of each value or None)."""
        ...


def _key_type(key: FieldSpec) -> pa.DataType:
    """A record key as a struct column; a primitive one (a single field ``value``) as itself.
    Its fields are named as the value's are (:func:`.columns.distinct_type`)."""
    if key.reader.names == ["value"]:
        return distinct_type(key.reader.field("value").type)
    return distinct_type(pa.struct(list(key.reader)))


def value_columns(spec: DecodeSpec) -> list[pa.Field]:
    """The value's fields as the decoder's output names them (:func:`.columns.column_names`): a
    field whose name equals, ignoring case as Spark and Delta do, a column the decoder adds
    (``key``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``,
    ``headers``, the engine's ``_error``, ``_raw_key``, ``_raw_value`` and, when ops are marked,
    ``_op``) or an earlier field's column is ``value_<name>``
    (:data:`~kafka_delta.contract.VALUE_FIELD_PREFIX`): Kafka's columns keep their names, a
    value's ``timestamp`` (or ``Timestamp``) lands as ``value_timestamp``, an ``Id`` after an
    ``id`` as ``value_Id``; the same inside records. Fields keep the reader's order, the
    order versions first name them, so a later schema version never renames a column a table
    already has."""
    fields = row_fields(spec)
    op = [fields.pop()] if spec.marks_ops else []  # the engine's _op, last
    reserved = _RESERVED | ({OP_COLUMN} if spec.marks_ops else set())
    reserved |= {KEY_DELETE_COLUMN} if spec.tombstone_keys else set()
    names = column_names((f.name for f in fields), reserved)
    out = [
        f.with_name(name).with_type(distinct_type(f.type))
        for f, name in zip(fields, names, strict=True)
    ]
    return out + op


def output_schema(spec: DecodeSpec) -> pa.Schema:
    key = KAFKA_ARROW_SCHEMA.field("key").type if spec.key is None else _key_type(spec.key)
    return pa.schema(
        [
            *value_columns(spec),
            pa.field("key", key),
            *(KAFKA_ARROW_SCHEMA.field(name) for name in RECORD_COLUMNS),
            pa.field(DEAD_LETTER_COLUMN, pa.string()),
            pa.field(RAW_KEY, pa.binary()),
            pa.field(RAW_VALUE, pa.binary()),
            *([pa.field(KEY_DELETE_COLUMN, pa.string())] if spec.tombstone_keys else []),
        ]
    )


def decoder_modules(spec: DecodeSpec) -> tuple[str, ...]:
    """The modules a task imports to decode with ``spec`` (to warm its workers)."""
    formats = {f.format for f in (spec.value, spec.key) if f is not None}
    names = {
        "avro": "avro_decoder",
        "protobuf": "protobuf_decoder",
        "json": "json_decoder",
        "json_schema": "json_decoder",
    }
    package = __name__.rpartition(".")[0]
    return (
        __name__,
        *(f"{package}.{names[f]}" for f in sorted(formats) if f in names),
        *((f"{package}.schema_registry",) if spec.registry is not None else ()),
    )


def _part_decoder(field: FieldSpec, spec: DecodeSpec, part: str) -> PartDecoder:
    registry = None
    if spec.registry is not None:
        from kafka_delta.decoding.schema_registry import registry_for

        registry = registry_for(spec.registry)
    if field.format == "avro":
        from kafka_delta.decoding.avro_decoder import AvroDecoder

        return AvroDecoder(field, registry, part)
    if field.format == "protobuf":
        from kafka_delta.decoding.protobuf_decoder import ProtobufDecoder

        return ProtobufDecoder(field, registry, part)
    if field.format == "json":
        from kafka_delta.decoding.json_decoder import JsonDecoder

        return JsonDecoder(field, part)
    if field.format == "json_schema":
        from kafka_delta.decoding.json_decoder import JsonDecoder

        return JsonDecoder(field, part, registry)
    raise SchemaFileError(f"format {field.format} does not decode")


class Decoder:
    def __init__(self, spec: DecodeSpec) -> None:
        self.spec = spec
        self.output_schema = output_schema(spec)
        # The decoded arrays' types, as the reader names fields: an output column whose fields
        # the naming rule renamed is the same data under another type (a zero-copy view).
        decoded = _decoded_types(spec, self.output_schema)
        # The columns decoding makes (all but Kafka's record columns), and their decoded types.
        parts = [i for i, f in enumerate(self.output_schema) if f.name not in RECORD_COLUMNS]
        self.part_fields = [self.output_schema.field(i) for i in parts]
        self._part_types = [decoded[i] for i in parts]
        self.value = _part_decoder(spec.value, spec, "value")
        self.key = None if spec.key is None else _part_decoder(spec.key, spec, "key")

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A batch of Kafka's columns (:data:`~kafka_delta.contract.KAFKA_ARROW_SCHEMA`)
        decoded: the output schema's columns, Kafka's passed through."""
        parts = self.decode_parts(
            batch.column("value"),
            batch.column("key"),
            batch.column("headers") if self.spec.reads_headers else None,
        )
        after_key = self.output_schema.get_field_index("key") + 1
        arrays = [
            *parts[:after_key],
            *(batch.column(name) for name in RECORD_COLUMNS),
            *parts[after_key:],
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.output_schema)

    def decode_parts(
        self, raw_value: pa.Array, raw_key: pa.Array, headers: pa.Array | None
    ) -> list[pa.Array]:
        """The output columns that decoding makes, in the output schema's order: every column
        but Kafka's record columns (``topic`` ... ``headers``), which decoding never changes.
        ``headers`` may be None when the spec does not read them
        (:attr:`.spec.DecodeSpec.reads_headers`)."""
        n = len(raw_value)
        header_rows = (
            headers.to_pylist() if headers is not None and headers.null_count < n else [None] * n
        )
        raw_values = raw_value.to_pylist()
        columns, errors = self.value.decode(raw_values, header_rows)
        key = raw_key
        key_errors: list[str | None] = [None] * n
        if self.key is not None:
            keys, key_errors = self.key.decode(raw_key.to_pylist(), header_rows)
            key = (
                keys.column(0).combine_chunks()
                if keys.column_names == ["value"]
                else pa.StructArray.from_arrays(
                    [c.combine_chunks() for c in keys.columns], fields=list(keys.schema)
                )
            )
        # The value's columns; a change event unwrapped, a tombstone made a delete (.envelope).
        marks: list[str | None] = [None] * n
        values = (
            value_arrays(self.spec, columns, errors, raw_values, key, key_errors, marks)
            if self.spec.marks_ops
            else [columns.column(name).combine_chunks() for name in self.spec.value.reader.names]
        )
        errors = [
            e or (f"key: {k}" if k else None) for e, k in zip(errors, key_errors, strict=True)
        ]
        error = pa.array(errors, pa.string())
        mark = pa.array(marks, pa.string())
        failed = pc.or_(pc.is_valid(error), pc.is_valid(mark))
        none = pa.nulls(n, pa.binary())
        any_failed = error.null_count < n or mark.null_count < n
        arrays = [
            *values,
            key,
            error,
            pc.if_else(failed, raw_key, none) if any_failed else none,
            pc.if_else(failed, raw_value, none) if any_failed else none,
            *([mark] if self.spec.tombstone_keys else []),
        ]
        return [
            _as_column(a, decoded, f.type)
            for a, decoded, f in zip(arrays, self._part_types, self.part_fields, strict=True)
        ]


def _decoded_types(spec: DecodeSpec, output: pa.Schema) -> list[pa.DataType]:
    """Per output column, its type before the naming rule renamed fields inside it."""
    values = row_fields(spec)
    key = None
    if spec.key is not None:
        key = (
            spec.key.reader.field("value").type
            if spec.key.reader.names == ["value"]
            else pa.struct(list(spec.key.reader))
        )
    types = [f.type for f in output]
    types[: len(values)] = [f.type for f in values]
    if key is not None:
        types[len(values)] = key
    return types


def _as_column(array: pa.Array, decoded: pa.DataType, column: pa.DataType) -> pa.Array:
    if array.type != decoded:
        array = array.cast(decoded)
    return array.view(column) if decoded != column else array


@functools.lru_cache(maxsize=8)
def decoder_for(spec_json: str) -> Decoder:
    """The decoder of a spec, one per Python worker (its schema caches live as long)."""
    return Decoder(DecodeSpec.from_json(spec_json))
