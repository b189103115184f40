"""Versions of one schema, as Arrow schemas: the union of every version a topic's producers
registered (the reader schema, the table's columns), and how one writer schema compares to it.
Each format maps its schemas to Arrow in its own module (:mod:`.avro_types`,
:mod:`.protobuf_types`, :mod:`.json_types`); what they share is here."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from kafka_delta.decoding.spec import SchemaIncompatibleError

TIMESTAMP = pa.timestamp("us", tz="UTC")


def union_schemas(schemas: Iterable[pa.Schema]) -> pa.Schema:
    """Every field of every version, in the order fields first appear, all nullable. A field
    whose type differs between versions, or one required (not nullable) in a version and
    missing from another, is an incompatible change."""
    versions = list(schemas)
    fields: dict[str, pa.Field] = {}
    for schema in versions:
        for f in schema:
            seen = fields.get(f.name)
            if seen is None:
                fields[f.name] = f
            elif not _same_type(seen.type, f.type):
                raise SchemaIncompatibleError(
                    f"field {f.name!r} changed type from {seen.type} to {f.type} between "
                    "versions of the producers' schema: the table cannot hold both"
                )
    for name, f in fields.items():
        if not f.nullable and any(name not in s.names for s in versions):
            raise SchemaIncompatibleError(
                f"required field {name!r} ({f.type}) was removed in a version of the producers' "
                "schema (or renamed): old and new records cannot share the table's column"
            )
    return pa.schema([f.with_nullable(True) for f in fields.values()])


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal types, nested nullability aside."""
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return [f.name for f in a] == [f.name for f in b] and all(
            _same_type(x.type, y.type) for x, y in zip(a, b, strict=True)
        )
    if pa.types.is_list(a) and pa.types.is_list(b):
        return _same_type(a.value_type, b.value_type)
    return a == b


def compare_writer(reader: pa.Schema, writer: pa.Schema, schema_id: int | str) -> list[str]:
    """The writer's fields the reader lacks; raises when a shared field changed type."""
    new = []
    for f in writer:
        if f.name not in reader.names:
            new.append(f.name)
            continue
        mine = reader.field(f.name).type
        if not _same_type(mine, f.type):
            raise SchemaIncompatibleError(
                f"field {f.name!r} is {f.type} in writer schema {schema_id} but {mine} in the "
                "table's schema: a type change the table cannot follow; nothing was written"
            )
    return new
