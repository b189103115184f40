"""The decoder's output columns: their names (:func:`column_names`, :func:`distinct_type`), and
rows of a batch put back together after a decoder decoded them in groups by schema id
(:func:`assemble`, shared by :mod:`.avro_decoder`, :mod:`.json_decoder`,
:mod:`.protobuf_decoder`).

The naming rule. Spark and Delta compare column names without case (delta-rs refuses a schema
with ``id`` and ``Id``: "Duplicate field name (case-insensitive)"; delta-spark says
AMBIGUOUS_REFERENCE or DELTA_DUPLICATE_COLUMNS_FOUND), while Avro, Protobuf and JSON tell
``id`` from ``Id``. So a name is taken when it equals, ignoring case, a column the decoder adds
(``key``, ``offset``, ...) or the column of a field before it; a field whose name is taken lands
as ``value_<name>`` (:data:`~kafka_delta.contract.VALUE_FIELD_PREFIX`), prefixed again until
the name is free. The same inside records (struct fields, also in lists' and maps' values).
"Before" is the order of the reader schema, the union of the schema's versions in the order
fields first appear (:func:`.versions.union_schemas`): a later version only adds fields after
the ones there are, so a field keeps its column across batches, versions and restarts.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from kafka_delta.contract import VALUE_FIELD_PREFIX


def column_names(names: Iterable[str], taken: Iterable[str] = ()) -> list[str]:
    """The columns of fields ``names`` (in order) beside the columns ``taken``: each its own
    name unless that equals, ignoring case, one taken or one given before it, then
    ``value_<name>`` (again until free).

    >>> column_names(["id", "Id", "Offset", "ID"], taken=["offset"])
    ['id', 'value_Id', 'value_Offset', 'value_ID']
    """
    seen = {name.lower() for name in taken}
    out = []
    for name in names:
        column = name
        while column.lower() in seen:
            column = VALUE_FIELD_PREFIX + column
        seen.add(column.lower())
        out.append(column)
    return out


def distinct_type(t: pa.DataType) -> pa.DataType:
    """``t`` with the fields of its structs (nested ones too) named by :func:`column_names`."""
    if pa.types.is_struct(t):
        names = column_names(f.name for f in t)
        return pa.struct(
            [f.with_name(n).with_type(distinct_type(f.type)) for f, n in zip(t, names, strict=True)]
        )
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        value = t.value_field.with_type(distinct_type(t.value_type))
        return pa.list_(value) if pa.types.is_list(t) else pa.large_list(value)
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(distinct_type(t.key_type)),
            t.item_field.with_type(distinct_type(t.item_type)),
        )
    return t


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
