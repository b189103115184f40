"""What the engine and a project's transform agree on: the columns a batch arrives with, the
column that marks a dead letter, and how the config names the transform.

A transform is a pure ``DataFrame -> DataFrame``. It receives, per micro-batch:

- with ``decoding.value.format: raw``, Spark's Kafka columns as they are (:data:`KAFKA_SCHEMA`:
  key, value, topic, partition, offset, timestamp, timestampType, headers);
- with a decoder (json, avro, protobuf), the value's own columns (a field named like one of the
  columns below, or like an earlier field, ignoring case, as ``value_<name>``,
  :data:`VALUE_FIELD_PREFIX`), then ``key``, the Kafka
  columns but ``value``, :data:`DEAD_LETTER_COLUMN` (set by the decoder on a record it could
  not decode) and the original bytes of such records (``_raw_key``, ``_raw_value``); with a
  Debezium envelope unwrapped (or tombstones as deletes), the row's columns and
  :data:`OP_COLUMN` before ``key``.

It returns the rows for the table. A row whose :data:`DEAD_LETTER_COLUMN` is not null is not
written to the table: the original Kafka record goes to the dead-letter table with that error,
found again by its ``topic``, ``partition`` and ``offset`` (keep them on such rows).

The config names the transform as ``module:function`` (``transform:`` in ``conf/*.yaml``), the
way Dagster and kedro find a project's code: the engine never imports a project module by a
fixed name. Without one, the records land as they arrive (:func:`passthrough`).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# The engine's warnings of a transform's rows are the pipeline's (log configs select them).
log = logging.getLogger("kafka_delta.pipeline")

Transform = Callable[["DataFrame"], "DataFrame"]

DEAD_LETTER_COLUMN = "_error"
"""A row with this column set is a dead letter: its record goes to the dead-letter table."""

OP_COLUMN = "_op"
"""A row's change kind, from a change-data-capture record (``decoding.value.envelope:
debezium``: Debezium's ``op``, ``c`` ``u`` ``r`` or ``d``) or a tombstone (``d``, with
``delta.tombstones: delete``). In upsert mode ``d`` deletes the row of its merge key and any
other value upserts it; the column itself is never written to an upsert table (a transform may
set it too). In append mode it is a column like any other: the table keeps every change."""

KEY_DELETE_COLUMN = "_key_delete"
"""The engine's own mark, never seen by a transform: the decoder sets it (when a table of the
pipeline has ``tombstones: delete``) on each row it read as a delete of its key (a tombstone, or
a Debezium delete without ``before``), holding the error that row is a dead letter with for a
table whose ``tombstones`` is ``dead_letter``. The records are decoded once for every table;
before a table's transform runs, the table's own setting decides (:func:`kafka_delta.routing.
key_deletes`) and the column is dropped."""

VALUE_FIELD_PREFIX = "value_"
"""A value's field named, ignoring case as Spark and Delta do, like a column the decoder adds
(``key``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``, ``headers``,
``_error``, ``_raw_key``, ``_raw_value``; ``_op`` when ops are marked) or like an earlier field
arrives as ``value_<name>``: a value's ``timestamp`` is the column ``value_timestamp``, beside
Kafka's ``timestamp`` (:mod:`kafka_delta.decoding.columns`)."""

RAW_KEY, RAW_VALUE = "_raw_key", "_raw_value"
"""The original bytes of a record the decoder could not decode (kept on such rows only)."""

KAFKA_ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
"""Spark's kafka source's columns (``includeHeaders``), which both sources deliver."""

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int, headers array<struct<key: string, value: binary>>"
)
""":data:`KAFKA_ARROW_SCHEMA` as Spark DDL (a raw batch's schema)."""

KAFKA_COLUMNS = tuple(KAFKA_ARROW_SCHEMA.names)

POSITION_COLUMNS = ("topic", "partition", "offset")
"""A record's Kafka position. Kept in the transform's rows (the engine warns at a run's first
batch when they are not), they let ``offsets verify`` audit the table and a lost checkpoint
resume after Delta log cleanup without an ``offsets reset``."""

# What a decoded batch carries besides the value's columns (the decoder's output, in order).
RECORD_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestampType", "headers")


class TransformNotFoundError(ValueError):
    """The config's ``transform`` does not name a function that can be imported."""


def load_transform(reference: str) -> Transform:
    """The function ``reference`` (``package.module:function``) names.

    >>> load_transform("kafka_delta.contract:passthrough") is passthrough
    True
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise TransformNotFoundError(
            f"transform {reference!r} must name a function as module:function, e.g. "
            "orders_stream.transform:transform"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TransformNotFoundError(
            f"transform {reference!r}: module {module_name!r} cannot be imported ({exc}); is the "
            "project installed (pip install -e .) or its src/ on PYTHONPATH?"
        ) from None
    found = module
    for name in attribute.split("."):
        found = getattr(found, name, None)
        if found is None:
            raise TransformNotFoundError(
                f"transform {reference!r}: module {module_name!r} has no {attribute!r}"
            )
    if not callable(found):
        raise TransformNotFoundError(f"transform {reference!r} is not a function")
    return found


def passthrough(df: DataFrame) -> DataFrame:
    """The transform of a config that names none: every record lands as it arrives (a decoded
    batch's value columns and where each record came from; a raw batch's Kafka columns)."""
    return df.drop(RAW_KEY, RAW_VALUE) if RAW_VALUE in df.columns else df


def warn_without_positions(columns: Sequence[str], table: str | None = None) -> None:
    """Warn when the transform's rows (their ``columns``; of ``table``) lack ``topic``,
    ``partition`` or ``offset``; the pipeline asks at a run's first batch. Exactly once does
    not rest on them (the offsets ride in the commit), and a table of aggregates or of one row
    per key may rightly drop them, so this warns rather than refuses; but without them
    ``offsets verify`` cannot audit the rows, and once Delta log cleanup removed the commits
    that name the stored offsets, a lost checkpoint resumes only after ``offsets reset
    --to-offsets`` (offsets.stored)."""
    missing = [c for c in POSITION_COLUMNS if c not in columns]
    if missing:
        of = f" for table {table}" if table else ""
        log.warning(
            "the transform's rows%s lack %s: they carry no Kafka position, so `offsets "
            "verify` cannot audit them, and after Delta log cleanup a lost checkpoint "
            "resumes only with `offsets reset --to-offsets`; keep %s in the transform's "
            "output unless the table is meant to hold none (aggregates)",
            of,
            ", ".join(missing),
            "them" if len(missing) > 1 else "it",
        )
