"""Parquet data files of a Delta table, written where the rows are (a Spark task's Python
worker, or the driver for small Arrow tables), and described by Delta ``add`` actions.

The delta-rs sink commits the files in ONE commit on the driver (:mod:`.sink`); this module
only writes them and says what they hold. A file that no commit names is invisible to every
reader, and ``VACUUM`` deletes it, so a task that fails, a batch whose commit never comes, or a
commit that loses a race leaves nothing behind that a reader sees.

What is written must read back the same through delta-rs and delta-spark with the table's
schema:

- the rows are cast to the table's own Arrow types (:func:`delta_arrow_schema`: what delta-rs
  itself writes, e.g. ``timestamp[us, tz=UTC]`` where Spark hands ``timestamp[us, tz=<session
  zone>]``, plain ``string``/``binary`` where Spark may hand large ones);
- files are named like Spark's and delta-rs's, ``part-<task>-<uuid>-c<n>.snappy.parquet``, so
  concurrent writers (tasks, retried tasks, other runs) never collide;
- statistics (``numRecords`` always; ``nullCount`` and ``minValues``/``maxValues`` only where
  they are exact, see :class:`ColumnStats`): readers skip files on them, so a wrong bound would
  silently drop rows from query results, while a missing one only makes a query slower.
"""

from __future__ import annotations

import datetime
import decimal
import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from kafka_delta.delta.schema import SchemaMismatchError, all_nullable, narrowable
from kafka_delta.delta.table_storage import open_filesystem

log = logging.getLogger(__name__)

# One row per data file, what a task returns to the driver.
FILE_METADATA_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("size", pa.int64()),
        ("partition_values", pa.string()),
        ("modification_time", pa.int64()),
        ("stats", pa.string()),
        ("num_records", pa.int64()),
    ]
)

# A file is closed and the next one started past this size (delta-rs writes ~100 MiB files).
TARGET_FILE_BYTES = 128 * 1024 * 1024
# Rows buffered into one Parquet row group (Spark hands Arrow batches of 10k rows).
ROW_GROUP_ROWS = 128 * 1024
# Delta's delta.dataSkippingNumIndexedCols default: statistics for the first 32 columns.
DEFAULT_STATS_COLUMNS = 32
# Longest string kept as a min/max bound. Delta truncates longer bounds (and pads the max);
# a short bound written exactly needs no such rule from any reader.
MAX_STRING_STAT_CHARS = 32


class UnsupportedTableError(ValueError):
    """The table uses a Delta feature the executor-side writer cannot honour (partitioning,
    column mapping, generated or identity columns, constraints): nothing was written."""


def _delta_type(dtype: pa.DataType) -> pa.DataType:
    """``dtype`` as delta-rs stores it: timestamps in microseconds, zoned ones in UTC (an
    instant is the same instant in any zone, so the cast only relabels)."""
    if pa.types.is_timestamp(dtype):
        return pa.timestamp("us", tz=None if dtype.tz is None else "UTC")
    if pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return pa.string()
    if pa.types.is_large_binary(dtype) or pa.types.is_binary_view(dtype):
        return pa.binary()
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        value = dtype.value_field
        return pa.list_(value.with_type(_delta_type(value.type)).with_name("element"))
    if pa.types.is_map(dtype):
        return pa.map_(
            dtype.key_field.with_type(_delta_type(dtype.key_type)),
            dtype.item_field.with_type(_delta_type(dtype.item_type)),
        )
    if pa.types.is_struct(dtype):
        return pa.struct([f.with_type(_delta_type(f.type)) for f in dtype])
    return dtype


def delta_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """The Arrow schema delta-rs gives a table created from ``schema`` (raises
    :class:`SchemaMismatchError` for a type Delta cannot store, e.g. an interval)."""
    from deltalake import Schema

    converted = pa.schema([f.with_type(_delta_type(f.type)).remove_metadata() for f in schema])
    try:
        return pa.schema(Schema.from_arrow(converted).to_arrow())
    except Exception as exc:
        raise SchemaMismatchError(
            f"the batch's schema cannot be stored in a Delta table: {exc}".splitlines()[0]
        ) from exc


def check_table_supported(table: Any) -> None:
    """Raise :class:`UnsupportedTableError` unless plain Parquet files of the table's columns
    are all a commit needs (``table`` is a delta-rs ``DeltaTable``)."""
    metadata = table.metadata()
    reasons = []
    if metadata.partition_columns:
        reasons.append(f"it is partitioned by {metadata.partition_columns}")
    config = metadata.configuration or {}
    if (config.get("delta.columnMapping.mode") or "none") != "none":
        reasons.append("it uses column mapping")
    if any(key.startswith("delta.constraints.") for key in config):
        reasons.append("it has CHECK constraints")
    fields = json.loads(table.schema().to_json())["fields"]
    for f in fields:
        keys = set(f.get("metadata") or {})
        if any(k.startswith("delta.identity.") for k in keys):
            reasons.append(f"column {f['name']!r} is an identity column")
        if "delta.generationExpression" in keys:
            reasons.append(f"column {f['name']!r} is a generated column")
        if "delta.invariants" in keys:
            reasons.append(f"column {f['name']!r} has an invariant")
    features = set(getattr(table.protocol(), "writer_features", None) or ())
    unknown = sorted(features - _WRITER_FEATURES_OK)
    if unknown:
        reasons.append(f"it needs the writer features {unknown}")
    if reasons:
        raise UnsupportedTableError(
            f"the delta-rs sink cannot append to table {table.table_uri}: {'; '.join(reasons)}. "
            "Its executors write plain Parquet files of the table's columns. Nothing was "
            "written; use a table without these features, or the delta_spark sink."
        )


# Writer features under which a blind append of plain Parquet files is a valid commit (those
# that constrain appends, like invariants or generated columns, are checked where used above).
_WRITER_FEATURES_OK = {
    "appendOnly",
    "invariants",
    "checkConstraints",
    "generatedColumns",
    "changeDataFeed",
    "timestampNtz",
    "deletionVectors",
    "v2Checkpoint",
    "vacuumProtocolCheck",
    "checkpointProtection",
    "domainMetadata",
}


# -- where the files go -------------------------------------------------------------------


def discard_files(target: FileTarget, names: list[str]) -> None:
    """Delete data files of ``target``'s table that no commit names; a local table folder they
    leave empty (a table that never got a commit) goes too."""
    fs, root = open_filesystem(target.table_uri, target.storage_options, target.via_delta_rs)
    for name in names:
        fs.delete_file(f"{root}/{name}" if root else name)
    if root and isinstance(fs, pafs.LocalFileSystem):
        if not fs.get_file_info(pafs.FileSelector(root)):
            fs.delete_dir(root)


# -- statistics ----------------------------------------------------------------------------


def _json_float(value: float) -> bool:
    return value == value and value not in (float("inf"), float("-inf"))


@dataclass
class ColumnStats:
    """Exact statistics of one top-level column over the batches of one file.

    - ``nullCount`` for every non-nested column;
    - min/max for integers and dates (exact by construction);
    - for floats only while no NaN or infinity was seen: Spark orders NaN above every number,
      so ``max`` without it would let ``x > 10`` skip a file holding NaN; JSON has no infinity;
    - for strings only when the bound is ASCII and at most 32 characters: then it is the exact
      value, compared the same way (bytewise) by every reader, with no truncation rule involved;
    - none for timestamps (Delta keeps millisecond bounds; a microsecond max truncated to the
      millisecond would fall below the data), decimals, binaries, booleans and nested columns.
    """

    name: str
    dtype: pa.DataType
    nulls: int = 0
    low: Any = None
    high: Any = None
    bounded: bool = True  # False once a value made min/max unsafe for the file

    @property
    def kind(self) -> str | None:
        t = self.dtype
        if pa.types.is_integer(t):
            return "int"
        if pa.types.is_floating(t):
            return "float"
        if pa.types.is_date32(t):
            return "date"
        if pa.types.is_string(t):
            return "string"
        return None

    @property
    def counts_nulls(self) -> bool:
        return not pa.types.is_nested(self.dtype)

    def add(self, column: pa.ChunkedArray | pa.Array) -> None:
        if self.counts_nulls:
            self.nulls += column.null_count
        kind = self.kind
        if kind is None or not self.bounded or column.null_count == len(column):
            return
        if kind == "float" and (
            pc.any(pc.is_nan(column)).as_py() or pc.any(pc.is_inf(column)).as_py()
        ):
            self.bounded = False
            return
        extremes = pc.min_max(column)
        low, high = extremes["min"].as_py(), extremes["max"].as_py()
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def bounds(self) -> tuple[Any, Any]:
        """(min, max) as JSON values, each None where it would not be exact."""
        if not self.bounded or self.low is None:
            return None, None
        kind = self.kind
        if kind == "date":
            return self.low.isoformat(), self.high.isoformat()
        if kind == "float":
            return (
                self.low if _json_float(self.low) else None,
                self.high if _json_float(self.high) else None,
            )
        if kind == "string":
            return tuple(  # type: ignore[return-value]
                v if v.isascii() and len(v) <= MAX_STRING_STAT_CHARS else None
                for v in (self.low, self.high)
            )
        return self.low, self.high


def stats_json(rows: int, columns: list[ColumnStats]) -> str:
    stats: dict[str, Any] = {"numRecords": rows}
    nulls = {c.name: c.nulls for c in columns if c.counts_nulls}
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    if rows:
        for c in columns:
            low, high = c.bounds()
            if low is not None:
                lows[c.name] = low
            if high is not None:
                highs[c.name] = high
    if lows:
        stats["minValues"] = lows
    if highs:
        stats["maxValues"] = highs
    if nulls:
        stats["nullCount"] = nulls
    return json.dumps(stats, separators=(",", ":"))


# -- writing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileTarget:
    """Where and how one batch's files are written: sent to every task (picklable)."""

    table_uri: str
    schema: pa.Schema  # the table's Arrow schema (Delta types)
    storage_options: dict[str, str] = field(default_factory=dict)
    stats_columns: int = DEFAULT_STATS_COLUMNS
    target_file_bytes: int = TARGET_FILE_BYTES
    row_group_rows: int = ROW_GROUP_ROWS
    via_delta_rs: bool = False


class _OpenFile:
    def __init__(self, fs: pafs.FileSystem, root: str, name: str, target: FileTarget) -> None:
        self.name = name
        self.path = f"{root}/{name}" if root else name
        self.stream = fs.open_output_stream(self.path)
        self.writer = pq.ParquetWriter(
            self.stream, target.schema, compression="snappy", version="2.6"
        )
        self.rows = 0
        self.stats = [
            ColumnStats(f.name, f.type) for f in list(target.schema)[: target.stats_columns]
        ]

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table)
        self.rows += table.num_rows
        for s in self.stats:
            s.add(table.column(s.name))

    def size_so_far(self) -> int:
        return self.stream.tell()

    def close(self) -> dict[str, Any]:
        self.writer.close()
        size = self.stream.tell()
        self.stream.close()
        return {
            "path": self.name,
            "size": size,
            "partition_values": "{}",
            "modification_time": int(time.time() * 1000),
            "stats": stats_json(self.rows, self.stats),
            "num_records": self.rows,
        }


def _conform(batch: pa.RecordBatch | pa.Table, target: FileTarget) -> pa.Table:
    """The rows in the table's column order and types; a null in a non-null column fails the
    task (a reader would otherwise find one where the schema promises none)."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    table = table.select(target.schema.names)
    for f in target.schema:
        if not f.nullable and table.column(f.name).null_count:
            raise SchemaMismatchError(
                f"column {f.name!r} of table {target.table_uri} is declared non-null, but the "
                f"batch holds {table.column(f.name).null_count} null(s) in it"
            )
    columns = [
        _as_table_type(table.column(f.name).combine_chunks(), f, target.table_uri)
        for f in target.schema
    ]
    return pa.Table.from_arrays(columns, schema=target.schema)


# -- a batch's values in the table's column types ---------------------------------------------
#
# Promotions (the producers' int became long, float became double): with schema evolution the
# sink widens the table's column before the batch's files are written
# (:func:`kafka_delta.delta.schema.wider_arrow_type`,
# ``DeltaRsSink._widen_columns``). With ``delta.schema_evolution: fail`` the table keeps its
# column and each value goes into it when it fits exactly (a long 7 into an int column); a value
# that does not fit (2**40, 1.5 into an int column) makes its record a dead letter naming the
# column, the value and both types (:func:`misfits`), and the rest of the batch lands.


def misfits(batch: pa.RecordBatch, schema: pa.Schema) -> tuple[pa.Array | None, pa.Array | None]:
    """(a mask of the rows with a value the table's narrower column cannot hold, the reason
    of each) or (None, None) when every value fits."""
    bad, reasons = None, None
    for f in schema:
        if f.name not in batch.schema.names:
            continue
        column = batch.column(f.name)
        if not narrowable(column.type, f.type):
            continue
        mine = _misfit_mask(column, f.type)
        if mine is None:
            continue
        texts = [
            None
            if not m
            else f"column {f.name!r}: the value {v!r} ({column.type}) does not fit the table's "
            f"{f.type} column exactly (delta.schema_evolution is fail)"
            for m, v in zip(mine.to_pylist(), column.to_pylist(), strict=True)
        ]
        text = pa.array(texts, pa.string())
        bad = mine if bad is None else pc.or_(bad, mine)
        reasons = text if reasons is None else pc.coalesce(reasons, text)
    return bad, reasons


def _misfit_mask(column: pa.Array, table_type: pa.DataType) -> pa.Array | None:
    narrowed = column.cast(table_type, safe=False)
    back = narrowed.cast(column.type, safe=False)
    bad = pc.fill_null(pc.not_equal(back, column), False)
    if pa.types.is_floating(column.type):
        bad = pc.and_(bad, pc.invert(pc.fill_null(pc.is_nan(column), False)))
    return bad if pc.any(bad).as_py() else None


def _as_table_type(column: pa.Array, f: pa.Field, table_uri: str) -> pa.Array:
    """``column`` as the table's column ``f``: types cast (a narrower number only when every
    value fits, see :func:`misfits`), and nested fields the table declares non-null filled in
    where their parent is null (a null ``["null", record]`` with required fields: Parquet
    stores nothing there, but Arrow wants no null in a non-null child)."""
    if narrowable(column.type, f.type):
        bad = _misfit_mask(column, f.type)
        if bad is not None:
            value = column.filter(bad)[0].as_py()
            raise SchemaMismatchError(
                f"column {f.name!r} of table {table_uri} is {f.type}, but the batch holds "
                f"{value!r} ({column.type}), which does not fit it; nothing was written"
            )
        return column.cast(f.type, safe=False)
    loose = all_nullable(f.type)
    column = column.cast(loose)
    return column if loose == f.type else _strict(column, f.type, f.name, table_uri)


def _strict(array: pa.Array, t: pa.DataType, where: str, table_uri: str) -> pa.Array:
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(t):
        children = []
        for i, f in enumerate(t):
            child = _strict(array.field(i), f.type, f"{where}.{f.name}", table_uri)
            if not f.nullable and child.null_count:
                if pc.any(pc.and_(child.is_null(), array.is_valid())).as_py():
                    _refuse(f"{where}.{f.name}", table_uri)
                child = child.fill_null(pa.scalar(_zero(f.type), f.type))
            children.append(child)
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if pa.types.is_list(t):
        values = _strict(array.values, t.value_type, f"{where}[]", table_uri)
        if not t.value_field.nullable and values.null_count:
            _refuse(f"{where}[]", table_uri)
        return pa.ListArray.from_arrays(array.offsets, values, type=t, mask=mask)
    if pa.types.is_map(t):
        items = _strict(array.items, t.item_type, where + "{}", table_uri)
        if not t.item_field.nullable and items.null_count:
            _refuse(where + "{}", table_uri)
        return pa.MapArray.from_arrays(array.offsets, array.keys, items, type=t, mask=mask)
    return array


def _refuse(where: str, table_uri: str) -> None:
    raise SchemaMismatchError(
        f"field {where} of table {table_uri} is declared non-null, but the batch holds nulls in it"
    )


def _zero(t: pa.DataType) -> Any:
    """A value of type ``t`` for the slots under a null parent (never read)."""
    if pa.types.is_struct(t):
        return {f.name: _zero(f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_map(t):
        return []
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return ""
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return b""
    if pa.types.is_fixed_size_binary(t):
        return bytes(t.byte_width)
    if pa.types.is_boolean(t):
        return False
    if pa.types.is_date(t):
        return datetime.date(1970, 1, 1)
    if pa.types.is_timestamp(t):
        return 0
    if pa.types.is_decimal(t):
        return decimal.Decimal(0)
    return 0


def write_files(
    batches: Iterable[pa.RecordBatch | pa.Table], target: FileTarget, task: int = 0
) -> list[dict[str, Any]]:
    """Write ``batches`` as Parquet files of at most ~``target_file_bytes`` into the table's
    folder; one metadata dict per file (``FILE_METADATA_SCHEMA``), none for no rows."""
    fs, root = open_filesystem(target.table_uri, target.storage_options, target.via_delta_rs)
    prefix = f"part-{task:05d}-{uuid.uuid4()}"
    written: list[dict[str, Any]] = []
    current: _OpenFile | None = None
    pending: list[pa.Table] = []
    pending_rows = 0

    def flush() -> None:
        nonlocal current, pending, pending_rows
        if not pending:
            return
        if current is None:
            current = _OpenFile(fs, root, f"{prefix}-c{len(written):03d}.snappy.parquet", target)
        current.write(pa.concat_tables(pending))
        pending, pending_rows = [], 0
        if current.size_so_far() >= target.target_file_bytes:
            written.append(current.close())
            current = None

    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(_conform(batch, target))
        pending_rows += batch.num_rows
        if pending_rows >= target.row_group_rows:
            flush()
    flush()
    if current is not None:
        written.append(current.close())
    return written


# What a task returns: one row per data file it wrote, and one per dead letter it set aside (the
# file columns null): the dead letters' positions and errors, never their rows.
DEAD_LETTER_FIELDS = [
    ("dead_topic", pa.string()),
    ("dead_partition", pa.int32()),
    ("dead_offset", pa.int64()),
    ("dead_error", pa.string()),
]
TASK_OUTPUT_SCHEMA = pa.schema([*FILE_METADATA_SCHEMA, *DEAD_LETTER_FIELDS])


def _dead_letter_rows(batch: pa.RecordBatch, marked: pa.Array, error_column: str) -> pa.Table:
    """The positions and errors of ``batch``'s marked rows, as task output rows (a position
    column the transform dropped comes back null; the driver then refuses the batch)."""
    dead = batch.filter(marked)
    n = dead.num_rows
    names = dead.schema.names
    columns = {f.name: pa.nulls(n, f.type) for f in FILE_METADATA_SCHEMA}
    for (name, dtype), source in zip(
        DEAD_LETTER_FIELDS, ("topic", "partition", "offset", error_column), strict=True
    ):
        columns[name] = dead.column(source).cast(dtype) if source in names else pa.nulls(n, dtype)
    return pa.table(columns, schema=TASK_OUTPUT_SCHEMA)


class TaskWriter:
    """The function ``DataFrame.mapInArrow`` runs in each task's Python worker: writes the
    task's rows as files and yields their metadata (the rows themselves never leave).

    With ``error_column`` (the transform's dead-letter column), rows where it is set are not
    written: their positions and errors are returned instead, so one pass over the batch (one
    read of Kafka) both writes the table's files and finds the dead letters.
    """

    def __init__(self, target: FileTarget, error_column: str | None = None) -> None:
        self.target = target
        self.error_column = error_column

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        dead: list[pa.Table] = []

        def good_rows() -> Iterator[pa.RecordBatch]:
            for batch in batches:
                if self.error_column is not None and batch.num_rows:
                    bad, reasons = misfits(batch, self.target.schema)
                    if bad is not None:
                        at = batch.schema.get_field_index(self.error_column)
                        merged = pc.coalesce(batch.column(at), reasons)
                        batch = batch.set_column(at, batch.schema.field(at), merged)
                    errors = batch.column(self.error_column)
                    if errors.null_count < batch.num_rows:
                        marked = pc.is_valid(errors)
                        dead.append(_dead_letter_rows(batch, marked, self.error_column))
                        batch = batch.filter(pc.invert(marked))
                yield batch

        files = write_files(good_rows(), self.target, task)
        if files:
            rows = [{**f, **dict.fromkeys(n for n, _ in DEAD_LETTER_FIELDS)} for f in files]
            yield pa.RecordBatch.from_pylist(rows, schema=TASK_OUTPUT_SCHEMA)
        for table in dead:
            yield from table.to_batches()
