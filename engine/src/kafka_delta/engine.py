"""The engine interface: a source, a sink and an offset store, chosen in config. This module
names the contract alone; :mod:`.engine_factory` builds the implementations.

Two implementations sit behind it (docs/design.md section 5), and any mix of them works:

============  ==========================================  ==================================
part          embedded (no JVM connector jars)             cluster (Databricks, --packages)
============  ==========================================  ==================================
source        ``embedded``: Python data source on          ``spark_kafka``: Spark's ``kafka``
              confluent-kafka (:mod:`.sources.embedded`)   (:mod:`.sources.spark_kafka`)
sink          ``delta_rs``: Parquet files written by       ``delta_spark``: delta-spark writer
              the tasks, one delta-rs commit               options / MERGE session confs
offset store  :mod:`.offsets.stored` on a delta-rs log     the same, on delta-spark's history
============  ==========================================  ==================================

Both sinks keep one contract, proven by ``engine/tests/test_engine_contract.py`` over every mix:

- one Delta commit per batch holds the rows, a ``txn(app_id, batch_id)`` action and the end
  offsets in ``userMetadata`` (:class:`.offsets.model.BatchCommit`);
- a replayed batch (its txn version already recorded) writes nothing and reports success (I2);
- a batch commits only where the pipeline's stored offsets end (:mod:`.offsets.fencing`, I6);
- ``append`` adds every row; ``upsert`` MERGEs on the key columns, idempotently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from kafka_delta.offsets.model import BatchCommit, Offsets, StoredOffsets

if TYPE_CHECKING:
    from kafka_delta.decoding.spec import DecodeSpec

log = logging.getLogger(__name__)


class StagedRows(Protocol):
    """A batch's rows a sink already wrote as data files of its table (invisible to readers),
    waiting for the batch's commit."""

    num_rows: int


Rows = pa.Table | DataFrame | StagedRows
"""A batch's rows: a Spark DataFrame (the delta-spark sink writes it from the executors), data
files the delta-rs sink's tasks already wrote (:class:`StagedRows`), or Arrow on the driver (an
upsert's MERGE source, the dead-letter records)."""


@dataclass(frozen=True)
class SinkResult:
    """Outcome of one batch: ``delta_version`` is the commit that holds it (None when replayed);
    ``read_back_s``: of the commit's time, the seconds spent reading the table's log back to
    prove the commit is this batch's (the delta-spark sink; 0.0 where the commit itself returns
    its version), so the batch's progress can tell the log reads from the write."""

    written: bool
    rows: int
    delta_version: int | None
    read_back_s: float = 0.0


@dataclass(frozen=True)
class WriteMode:
    """How a sink applies a batch: ``append``, or ``upsert`` MERGE on ``keys``."""

    kind: str = "append"
    keys: tuple[str, ...] = ()
    order_by: str | None = None
    # Columns the batch has and the table lacks are added (nullable) with the batch's commit,
    # or before it where the engine cannot do both in one (``delta.schema_evolution``).
    add_columns: bool = True

    def merge_predicate(self, source: str = "s", target: str = "t") -> str:
        """SQL join condition of the MERGE (Spark and delta-rs both read backtick quoting)."""
        return " AND ".join(f"{target}.`{k}` = {source}.`{k}`" for k in self.keys)

    def update_predicate(self, source: str = "s", target: str = "t") -> str | None:
        """With ``order_by``, a stored row is only replaced by a version at least as new."""
        if self.order_by is None:
            return None
        o = self.order_by
        return f"{target}.`{o}` IS NULL OR {source}.`{o}` >= {target}.`{o}`"


@dataclass
class Materialized:
    """The transform's output of one batch, computed once: the rows for the table (without
    ``_error``), the dead letters' positions and errors (small, always Arrow) and a hook that
    frees what materializing held (a cached DataFrame)."""

    rows: Rows
    dead: pa.Table | None
    release: Callable[[], None] = lambda: None


class DeadLettersFound(RuntimeError):
    """A batch the sink wrote as clean (:meth:`Sink.materialize` without ``split``) held a dead
    letter: the write failed before its commit, so nothing was committed. The pipeline checks
    the batch again, materializes it with its dead letters split off (``split=True``), sends
    them, then commits (:meth:`kafka_delta.pipeline.Pipeline._write_table`)."""


class Sink(Protocol):
    table_uri: str

    def materialize(self, out: DataFrame, split: bool = False) -> Materialized:
        """Compute ``out`` once, in the form this sink writes, and split off dead letters. A
        sink may instead hand back ``out`` to be written as clean, in the commit's own job,
        when no dead letter is expected (``split`` False): a dead letter then fails that write
        before its commit (:class:`DeadLettersFound`), and the batch is materialized again
        with ``split=True``, which always splits."""
        ...

    def check(
        self, commit: BatchCommit, start: Offsets | None = None, first_reads: Offsets | None = None
    ) -> bool:
        """The fencing check alone, before anything is written (dead letters go to their table
        only after it): True when the batch is already in the table (a replay), raises
        :class:`FencingError` when it does not start where the table ends (``first_reads``: how far
        the first read of a partition the table stores nothing for may begin, see
        :func:`.offsets.fencing.check_contiguous`)."""
        ...

    def commit_batch(
        self,
        rows: Rows,
        commit: BatchCommit,
        start: Offsets | None = None,
        first_reads: Offsets | None = None,
        *,
        expected_seq: int | None = None,
    ) -> SinkResult:
        """Commit ``rows`` as batch ``commit`` in one Delta commit; ``start`` (the batch's
        start offsets) enables the fencing check, with ``first_reads`` as in :meth:`check`; a replay
        writes nothing. The checks run again here, atomically with the commit.
        ``expected_seq``: the pipeline's newest commit number in the table when the caller read
        what it holds (0: none); the commit lands only on top of it, else
        :class:`~.offsets.fencing.TableMovedError` and nothing is written (the dead-letter
        table's fence, :func:`~.offsets.fencing.check_unmoved`)."""
        ...

    def worker_modules(self) -> tuple[str, ...]:
        """Modules this sink's Spark tasks import in their Python workers (warmed before the
        first batch, :mod:`.runtime.python_workers`); () when its tasks run no Python."""
        ...

    def columns(self) -> tuple[str, ...] | None:
        """The table's column names as they are now; None when there is no table yet."""
        ...

    def positions_held(
        self,
        table_uri: str,
        storage_options: dict[str, str] | None,
        dead: pa.Table,
        topic_ids: Mapping[str, str] | None = None,
    ) -> set[tuple[str, int, int]]:
        """The positions ``(topic, partition, offset)`` of ``dead`` (dead letters) that the
        table at ``table_uri`` (this sink's: the dead-letter table) already holds for the same
        topic (``topic_ids``: the batch's), read the way this sink reads its table; see
        :mod:`kafka_delta.dead_letters`, whose queue asks."""
        ...


class OffsetStore(Protocol):
    def read(
        self, partitions: Callable[[], Mapping[str, list[int]]] | None = None
    ) -> StoredOffsets | None:
        """Offsets of this pipeline's newest commit in effect in the table; when log cleanup
        removed every commit of the pipeline, recomputed from the rows the table holds
        (:func:`kafka_delta.offsets.stored.from_the_rows`); ``partitions()`` (a lazy Kafka
        metadata query) names the partitions the run reads, so those the newest commit does
        not name are found too. None when the pipeline never committed to the table."""
        ...

    def commit_version(self, app_id: str) -> int | None:
        """The Delta version of the newest commit made under ``app_id`` (one checkpoint) in the
        retained log, whether a RESTORE undid it or not; None when the log holds none."""
        ...


class Source(Protocol):
    # Where a partition new to the checkpoint (a topic added to the subscription, partitions
    # added to a topic) starts: True, at the offset the table stores for it (else its
    # earliest); False, always at its earliest (Spark's kafka source).
    new_partitions_start_at_stored_offsets: bool
    # Whether a checkpoint that planned batches can take topics out of its subscription and
    # resume a re-added one at the offset the table stores (the embedded source); where not
    # (Spark's kafka source: data loss, or a re-read from the earliest offset), the pipeline
    # starts a new checkpoint from the table instead.
    follows_subscription_changes: bool
    # Whether the source's planning holds the topics' Kafka ids (``stream``'s ``topic_ids``)
    # against each batch's metadata and stops on a topic recreated since (the embedded
    # source); where not, the pipeline's batch function asks Kafka for the ids every batch.
    checks_topic_ids: bool

    def stream(
        self,
        spark: SparkSession,
        stored: StoredOffsets | None,
        resuming: bool = False,
        decode: DecodeSpec | None = None,
        topic_ids: Mapping[str, str] | None = None,
    ) -> DataFrame:
        """The streaming DataFrame of Spark's kafka columns (key, value, topic, partition,
        offset, timestamp, timestampType, headers), starting at ``stored`` when the checkpoint
        is new; ``resuming``: the checkpoint already holds a plan (Spark ignores starting
        offsets then). With ``decode``, the records decoded by it (:mod:`.decoding`): typed
        value columns, the Kafka columns, ``_error`` and the original bytes of bad records.
        ``topic_ids``: Kafka's ids of the topics as the run found them at start."""
        ...

    def worker_modules(self, decode: DecodeSpec | None = None) -> tuple[str, ...]:
        """Modules this source's Spark tasks import in their Python workers (warmed before
        the first batch, :mod:`.runtime.python_workers`), ``decode``'s decoders included."""
        ...


@dataclass
class Engine:
    source: Source
    sink: Sink
    offset_store: OffsetStore
    dead_letter_sink: Sink | None
    # Offsets stored in the dead-letter table (same tag and rules as the main table's).
    dead_letter_offsets: OffsetStore | None = None
