"""Rows of a batch put back together after a decoder decoded them in groups (by schema id),
shared by the format decoders (:mod:`.avro_decoder`, :mod:`.json_decoder`,
:mod:`.protobuf_decoder`)."""

from __future__ import annotations

import pyarrow as pa


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
