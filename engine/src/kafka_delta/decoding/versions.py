"""Versions of one schema, as Arrow schemas: the union of every version a topic's producers
registered (the reader schema, the table's columns), and how one writer schema compares to it.
Each format maps its schemas to Arrow in its own module (:mod:`.avro_types`,
:mod:`.protobuf_types`, :mod:`.json_types`); what they share is here.

The rules, the same for every format (Avro's reader-writer resolution, as far as a table can
follow it):

- A field in any version is a column; every column is nullable: a field a version lacks (added
  later, removed since, required or not) reads null in that version's records.
- A field whose type changed by a promotion (int -> long -> float/double, an integer -> double,
  float -> double) gets the wider type: int32 + int64 -> int64; an integer + a floating
  type -> float64; float32 + float64 -> float64. Nested records merge field by field, lists and
  maps by their values.
- Any other change keeps the type the field had first (what the table holds): a writer whose
  values cannot be put into it has its records set aside as dead letters (see
  :func:`compare_writer`, :func:`fit_column`), never a stop.

Putting a writer's column into the reader's (:func:`fit_column`): equal types as they are; a
promotion by a cast; and, where each value must be checked (``checked=True``: the Avro
decoder), a narrower column (a long value into an int column: kept when it fits exactly),
bytes into a string column (kept when UTF-8), a multi-type union (``member0, member1, ...``)
into the column of one of its branches (kept when the value is of that branch), a single type
into a union column (its branch's member). A value that does not fit makes its record a dead
letter naming the field, the value's type and the column's.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from kafka_delta.decoding.spec import SchemaIncompatibleError
from kafka_delta.delta.schema import all_nullable, arrow_rank, loose_type, narrowable, promotes

TIMESTAMP = pa.timestamp("us", tz="UTC")


def union_schemas(schemas: Iterable[pa.Schema]) -> pa.Schema:
    """Every field of every version, in the order fields first appear, all nullable, each
    with the type that holds every version's (the module's rules) and the field metadata of the
    last version that has it (an Avro field's default: the newest's); never raises."""
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for f in schema:
            seen = fields.get(f.name)
            fields[f.name] = (
                f
                if seen is None
                else seen.with_type(merge_types(seen.type, f.type)).with_metadata(f.metadata)
            )
    return pa.schema([f.with_nullable(True) for f in fields.values()])


def is_union(t: pa.DataType) -> bool:
    """A multi-type union's column: struct<member0, member1, ...>."""
    return (
        pa.types.is_struct(t)
        and t.num_fields > 0
        and [f.name for f in t] == [f"member{i}" for i in range(t.num_fields)]
    )


def merge_types(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """The type that holds ``a``'s values and ``b``'s by the module's rules; ``a`` when none
    does (the earlier type stays; values that do not fit it are dead letters)."""
    if a == b:
        return a
    if arrow_rank(a) is not None and arrow_rank(b) is not None:
        low, high = sorted((a, b), key=arrow_rank)
        if pa.types.is_integer(low) and pa.types.is_floating(high):
            return pa.float64()
        return high
    if pa.types.is_struct(a) and pa.types.is_struct(b) and not (is_union(a) or is_union(b)):
        theirs = {f.name: f for f in b}
        merged = []
        for f in a:
            other = theirs.pop(f.name, None)
            if other is None:
                merged.append(f.with_nullable(True))
            else:
                merged.append(
                    f.with_type(merge_types(f.type, other.type)).with_nullable(
                        f.nullable or other.nullable
                    )
                )
        merged += [f.with_nullable(True) for f in theirs.values()]
        return pa.struct(merged)
    if pa.types.is_list(a) and pa.types.is_list(b):
        value = a.value_field
        return pa.list_(
            value.with_type(merge_types(value.type, b.value_type)).with_nullable(
                value.nullable or b.value_field.nullable
            )
        )
    if pa.types.is_map(a) and pa.types.is_map(b) and a.key_type == b.key_type:
        item = a.item_field
        return pa.map_(
            a.key_field,
            item.with_type(merge_types(item.type, b.item_type)).with_nullable(
                item.nullable or b.item_field.nullable
            ),
        )
    if is_union(a) and is_union(b) and b.num_fields > a.num_fields:
        # A union widened by branches appended: the members so far stay, the new ones join.
        if all(loose_type(x.type) == loose_type(y.type) for x, y in zip(a, b, strict=False)):
            return b
    return a


def fit_rule(
    writer: pa.DataType, reader: pa.DataType, where: str, checked: bool, new: list[str]
) -> str | None:
    """None when a writer column of type ``writer`` goes into a reader column of type
    ``reader`` (collecting nested fields the reader lacks into ``new``), else why not."""
    if loose_type(writer) == loose_type(reader) or promotes(writer, reader):
        return None
    if checked and (
        narrowable(writer, reader)
        or (pa.types.is_binary(writer) and pa.types.is_string(reader))
        or (pa.types.is_string(writer) and pa.types.is_binary(reader))
    ):
        return None
    if is_union(writer) and checked and not is_union(reader):
        if any(fit_rule(m.type, reader, where, checked, []) is None for m in writer):
            return None
    if is_union(reader) and not is_union(writer):
        if any(fit_rule(writer, m.type, where, False, []) is None for m in reader):
            return None
    if pa.types.is_struct(writer) and pa.types.is_struct(reader):
        if is_union(writer) != is_union(reader):
            return f"{where} is {writer} in the writer's schema but {reader} in the table's"
        names = [x.name for x in reader]
        for f in writer:
            if f.name not in names:
                new.append(f"{where}.{f.name}")
                continue
            why = fit_rule(f.type, reader.field(f.name).type, f"{where}.{f.name}", checked, new)
            if why:
                return why
        return None
    if pa.types.is_list(writer) and pa.types.is_list(reader):
        return fit_rule(writer.value_type, reader.value_type, f"{where}[]", checked, new)
    if pa.types.is_map(writer) and pa.types.is_map(reader) and writer.key_type == reader.key_type:
        return fit_rule(writer.item_type, reader.item_type, where + "{}", checked, new)
    return f"{where} is {writer} in the writer's schema but {reader} in the table's"


def compare_writer(
    reader: pa.Schema, writer: pa.Schema, schema_id: int | str, checked: bool = False
) -> list[str]:
    """The writer's fields the reader lacks (nested ones as ``parent.child``); raises
    :class:`SchemaIncompatibleError` when a shared field's values cannot go into the reader's
    column by the module's rules (``checked``: also those that fit value by value)."""
    new: list[str] = []
    for f in writer:
        if f.name not in reader.names:
            new.append(f.name)
            continue
        why = fit_rule(f.type, reader.field(f.name).type, f"field {f.name!r}", checked, new)
        if why:
            raise SchemaIncompatibleError(
                f"schema id {schema_id} cannot be written to the table: {why}, and no rule "
                "turns one into the other"
            )
    return new


# -- putting a writer's column into the reader's, value by value where it must --------------


def fit_column(
    array: pa.Array, reader: pa.DataType, where: str
) -> tuple[pa.Array, pa.Array | None, str]:
    """(``array`` as a column of type ``reader``, a boolean mask of the values that did not
    fit or None, why they did not). ``compare_writer(checked=True)`` said the types meet."""
    writer = array.type
    if writer == reader:
        return array, None, ""
    if loose_type(writer) == loose_type(reader):
        return _retype(array, reader), None, ""
    if promotes(writer, reader) or (pa.types.is_string(writer) and pa.types.is_binary(reader)):
        return array.cast(reader), None, ""
    if narrowable(writer, reader):
        cast = array.cast(reader, safe=False)
        back = cast.cast(writer, safe=False)
        bad = pc.fill_null(pc.not_equal(back, array), False)
        if writer in (pa.float32(), pa.float64()):
            bad = pc.and_(bad, pc.invert(pc.fill_null(pc.is_nan(array), False)))
        if pc.any(bad).as_py():
            why = f"{where}: a {writer} value does not fit the table's {reader} column exactly"
            return pc.if_else(bad, pa.nulls(len(cast), reader), cast), bad, why
        return cast, None, ""
    if pa.types.is_binary(writer) and pa.types.is_string(reader):
        try:
            return array.cast(reader), None, ""
        except pa.ArrowInvalid:
            good = [v is None or _utf8(v) for v in array.to_pylist()]
            bad = pc.invert(pa.array(good, pa.bool_()))
            cleaned = pc.if_else(bad, pa.nulls(len(array), writer), array).cast(reader)
            return (
                cleaned,
                bad,
                f"{where}: bytes that are not UTF-8 text do not fit a string column",
            )
    if is_union(writer) and not is_union(reader):
        return _from_union(array, reader, where)
    if is_union(reader) and not is_union(writer):
        for i, m in enumerate(reader):
            if fit_rule(writer, m.type, where, False, []) is None:
                member, _, _ = fit_column(array, m.type, where)
                children = [
                    member if j == i else pa.nulls(len(array), f.type) for j, f in enumerate(reader)
                ]
                return (
                    pa.StructArray.from_arrays(children, fields=list(reader), mask=array.is_null()),
                    None,
                    "",
                )
    if pa.types.is_struct(writer) and pa.types.is_struct(reader):
        return _struct(array, reader, where)
    if pa.types.is_list(writer) and pa.types.is_list(reader):
        values, bad, why = fit_column(array.values, reader.value_type, f"{where}[]")
        fitted = pa.ListArray.from_arrays(
            array.offsets, values, type=reader, mask=array.is_null() if array.null_count else None
        )
        return fitted, None if bad is None else _any_per_list(array, bad), why
    if pa.types.is_map(writer) and pa.types.is_map(reader):
        items, bad, why = fit_column(array.items, reader.item_type, where + "{}")
        fitted = pa.MapArray.from_arrays(
            array.offsets,
            array.keys,
            items,
            type=reader,
            mask=array.is_null() if array.null_count else None,
        )
        return fitted, None if bad is None else _any_per_list(array, bad), why
    return array.cast(reader), None, ""


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _any_per_list(lists: pa.Array, bad_values: pa.Array) -> pa.Array:
    """Per list (or map) of ``lists``: whether any of its values is marked bad."""
    offsets = lists.offsets.to_pylist()
    marks = bad_values.to_pylist()
    return pa.array(
        [any(marks[offsets[i] : offsets[i + 1]]) for i in range(len(lists))], pa.bool_()
    )


def _struct(
    array: pa.Array, reader: pa.DataType, where: str
) -> tuple[pa.Array, pa.Array | None, str]:
    present = {f.name: i for i, f in enumerate(array.type)}
    children, bads, why = [], [], ""
    for f in reader:
        if f.name not in present:
            children.append(pa.nulls(len(array), f.type))
            continue
        child, bad, reason = fit_column(array.field(present[f.name]), f.type, f"{where}.{f.name}")
        children.append(child)
        if bad is not None:
            bads.append(pc.and_(bad, array.is_valid()))
            why = why or reason
    fitted = pa.StructArray.from_arrays(
        children,
        fields=[f.with_nullable(True) for f in reader],
        mask=array.is_null() if array.null_count else None,
    )
    fitted = _retype(fitted, reader)
    if not bads:
        return fitted, None, ""
    bad = bads[0]
    for b in bads[1:]:
        bad = pc.or_(bad, b)
    return fitted, bad, why


def _from_union(
    array: pa.Array, reader: pa.DataType, where: str
) -> tuple[pa.Array, pa.Array | None, str]:
    """A union's values into the column of one type: the first member that fits supplies
    them; a value in another member does not fit."""
    chosen = next(
        i for i, m in enumerate(array.type) if fit_rule(m.type, reader, where, True, []) is None
    )
    value, bad, why = fit_column(array.field(chosen), reader, where)
    others = [pc.is_valid(array.field(i)) for i in range(array.type.num_fields) if i != chosen]
    if others:
        elsewhere = others[0]
        for o in others[1:]:
            elsewhere = pc.or_(elsewhere, o)
        elsewhere = pc.and_(elsewhere, array.is_valid())
        if pc.any(elsewhere).as_py():
            kinds = [
                str(array.type[i].type)
                for i in range(array.type.num_fields)
                if i != chosen and array.field(i).null_count < len(array)
            ]
            why = why or (
                f"{where}: a value of the union's {'/'.join(kinds)} branch does not fit the "
                f"table's {reader} column"
            )
            bad = elsewhere if bad is None else pc.or_(bad, elsewhere)
    value = pc.if_else(array.is_valid(), value, pa.nulls(len(array), reader))
    return value, bad, why


def _retype(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` (of ``target``'s type up to nested nullability) as ``target``."""
    try:
        return array.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return array.cast(all_nullable(target))
