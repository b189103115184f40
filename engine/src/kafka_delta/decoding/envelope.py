"""Change events into rows, in the decoder, so both engines hand the transform the same rows:
Debezium's envelope unwrapped (``decoding.value.envelope: debezium``) and tombstones read as
deletes of their key (``delta.tombstones: delete``).

A Debezium change event (JSON with schemas disabled, or Avro or Protobuf through the registry)
has ``before`` and ``after`` (the row, each a nullable record), ``source`` (where the change was
read: lsn, file and pos, ts_ms...), ``op`` and ``ts_ms``. Unwrapped, a record becomes the row:

- ``c`` (insert), ``u`` (update), ``r`` (a snapshot read): ``after``'s fields;
- ``d`` (delete): ``before``'s fields (what identifies the row), or, when ``before`` is null (a
  table without a replica identity), the merge keys from the decoded key, as for a tombstone;
- ``t`` (truncate), ``m`` (a logical decoding message), no ``op``, or the record a change needs
  missing: a dead letter with the reason. A record never truncates a table.

Each row carries its ``op`` in :data:`~kafka_delta.contract.OP_COLUMN`; a tombstone's row is a
``d`` whose merge keys come from the key's fields of the same names (a primitive key fills the
one merge key) and whose other columns are null. Upsert mode then keeps the latest change of
each key (by Kafka offset: Debezium keys records by the primary key, so a row's changes share a
partition, in the order the database made them) and MERGEs it: ``d`` deletes, anything else
upserts (:mod:`kafka_delta.upsert`).

The records are decoded once for every table of the pipeline, and ``tombstones`` is each
table's own: when a table deletes by tombstones, the decoder reads every row whose key names it
(a tombstone, a delete without ``before``) as a delete, and marks it with the error it has where
tombstones are dead letters (:data:`~kafka_delta.contract.KEY_DELETE_COLUMN`); each table then
takes it as a delete or as that dead letter (:func:`kafka_delta.routing.key_deletes`).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from kafka_delta.contract import OP_COLUMN
from kafka_delta.decoding.spec import DecodeSpec, SchemaFileError

UPSERTS = frozenset({"c", "u", "r"})
DELETE = "d"
_ENVELOPE = ("before", "after", "op")


def row_fields(spec: DecodeSpec) -> list[pa.Field]:
    """The value's columns in the decoder's output: the reader's, or with the envelope
    unwrapped the row's (``after``'s fields); then :data:`OP_COLUMN` when ops are marked."""
    fields = list(spec.value.reader)
    if spec.envelope == "debezium":
        fields = [f.with_nullable(True) for f in _row_type(spec.value.reader)]
    if spec.marks_ops:
        fields.append(pa.field(OP_COLUMN, pa.string()))
    return fields


def _row_type(reader: pa.Schema) -> pa.StructType:
    missing = [name for name in _ENVELOPE if name not in reader.names]
    if missing:
        raise SchemaFileError(
            f"decoding.value.envelope debezium: the value's schema has no {', '.join(missing)}, "
            f"so it is not a Debezium change event (fields {', '.join(reader.names)}); decode "
            "it without the envelope"
        )
    for name in ("before", "after"):
        if not pa.types.is_struct(reader.field(name).type):
            raise SchemaFileError(
                f"decoding.value.envelope debezium: {name} is {reader.field(name).type}, not a "
                "record of the row's fields"
            )
    return reader.field("after").type


def _children(array: pa.Array) -> dict[str, pa.Array]:
    """A struct array's fields by name, null where the struct is null."""
    struct = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
    return {struct.type.field(i).name: c for i, c in enumerate(struct.flatten())}


def _pick(first: pa.Array, second: pa.Array, from_second: list[bool]) -> pa.Array:
    """Per row, ``second``'s value where ``from_second`` else ``first``'s (any type)."""
    n = len(first)
    if not any(from_second):
        return first
    if second.type != first.type:
        second = second.cast(first.type)
    both = pa.concat_arrays([first, second])
    return both.take(pa.array([n + i if s else i for i, s in enumerate(from_second)], pa.int64()))


def value_arrays(
    spec: DecodeSpec,
    columns: pa.Table,
    errors: list[str | None],
    values: list[bytes | None],
    key: pa.Array,
    key_errors: list[str | None],
    marks: list[str | None] | None = None,
) -> list[pa.Array]:
    """The value's output arrays, in :func:`row_fields` order, for the reader's ``columns``
    of the records ``values``; sets ``errors`` of the records that make no row. ``key``: the
    decoded keys (``key_errors``: why one failed). ``marks`` (with ``tombstone_keys``): set,
    for each row read as a delete of its key, to the error it has where tombstones are dead
    letters."""
    n = columns.num_rows
    fields = row_fields(spec)
    names = [f.name for f in fields if f.name != OP_COLUMN]
    ops: list[Any] = [None] * n
    from_key = [False] * n
    marks = [None] * n if marks is None else marks
    if spec.envelope == "debezium":
        arrays = _unwrap(spec, columns, errors, ops, from_key, marks)
    else:
        arrays = {name: columns.column(name).combine_chunks() for name in names}
    if spec.tombstone_keys:
        for i, value in enumerate(values):
            if value is not None:
                continue
            if key_errors[i] is not None or not key[i].is_valid:
                errors[i] = f"tombstone without a usable key ({key_errors[i] or 'key is null'})"
                continue
            # Where tombstones are dead letters, the value decoder's error ("value is null").
            marks[i] = errors[i] or "value is null"
            errors[i], ops[i], from_key[i] = None, DELETE, True
        arrays = _keys_from_key(spec, arrays, key, from_key, errors)
    out = [arrays[name] for name in names]
    if spec.marks_ops:
        out.append(pa.array(ops, pa.string()))
    return out


def _unwrap(
    spec: DecodeSpec,
    columns: pa.Table,
    errors: list[str | None],
    ops: list[Any],
    from_key: list[bool],
    marks: list[str | None],
) -> dict[str, pa.Array]:
    row = _row_type(spec.value.reader)
    after = _children(columns.column("after"))
    before = _children(columns.column("before"))
    after_valid = columns.column("after").is_valid().to_pylist()
    before_valid = columns.column("before").is_valid().to_pylist()
    deletes = [False] * len(ops)
    for i, op in enumerate(columns.column("op").to_pylist()):
        if errors[i] is not None:
            continue
        ops[i] = op
        if op in UPSERTS:
            if not after_valid[i]:
                errors[i] = f"Debezium change op {op!r} without after: no row to write"
        elif op == DELETE:
            deletes[i] = True
            if not before_valid[i]:
                reason = (
                    "Debezium delete without before: decode the key and set "
                    "delta.tombstones: delete to delete by the key"
                )
                if spec.tombstone_keys and spec.key is not None:
                    from_key[i] = True  # the key names the row (a table without replica identity)
                    marks[i] = reason
                else:
                    errors[i] = reason
        elif op == "t":
            errors[i] = (
                "Debezium truncate (op 't') is not applied: a record never truncates the table; "
                "truncate it yourself if that is meant"
            )
        elif op is None:
            errors[i] = "Debezium change event without op"
        else:
            errors[i] = f"Debezium op {op!r} is not a row change (c, u, r or d)"
    arrays: dict[str, pa.Array] = {}
    for i in range(row.num_fields):
        field = row.field(i)
        old = before.get(field.name)
        if old is None:
            old = pa.nulls(len(ops), field.type)
        arrays[field.name] = _pick(after[field.name], old, deletes)
    return arrays


def _keys_from_key(
    spec: DecodeSpec,
    arrays: dict[str, pa.Array],
    key: pa.Array,
    from_key: list[bool],
    errors: list[str | None],
) -> dict[str, pa.Array]:
    """The merge-key columns of the rows ``from_key`` (tombstones, deletes without before)
    taken from the decoded key: its field of the same name, or a primitive key itself."""
    if not any(from_key):
        return arrays
    fields = _children(key) if pa.types.is_struct(key.type) else None
    for name in spec.tombstone_keys:
        if name not in arrays:
            continue  # not a column: the upsert step names it
        if fields is None and len(spec.tombstone_keys) == 1:
            source = key
        elif fields is not None and name in fields:
            source = fields[name]
        else:
            reason = (
                f"tombstone: its key has no field {name!r} (delta.merge_keys)"
                if fields is not None
                else f"tombstone: a primitive key fills one merge key, not {spec.tombstone_keys}"
            )
            for i, taken in enumerate(from_key):
                if taken:
                    errors[i] = reason
            continue
        try:
            source = source.cast(arrays[name].type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaFileError(
                f"the key's {name} ({source.type}) cannot fill the column {name} "
                f"({arrays[name].type}): {exc}"
            ) from None
        arrays[name] = _pick(arrays[name], source, from_key)
    return arrays
