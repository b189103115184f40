"""The engine interface: a source, a sink and an offset store, chosen in config.

Two implementations sit behind it (DESIGN.md section 5), and any mix of them works:

============  =========================================  ========================================
part          embedded (no JVM connector jars)            cluster (Databricks, or --packages)
============  =========================================  ========================================
source        ``embedded``: Python data source on         ``spark_kafka``: Spark's built-in
              confluent-kafka (:mod:`.embedded.source`)   ``kafka`` format (:mod:`.cluster.source`)
sink          ``delta_rs``: Parquet files written by      ``delta_spark``: delta-spark writer
              the tasks, one delta-rs commit              options / MERGE session confs
offset store  delta-rs table history                      ``DeltaTable.history()``
============  =========================================  ========================================

Both sinks keep one contract, proven by ``tests/test_engine_contract.py`` over every mix:

- one Delta commit per batch holds the rows, a ``txn(app_id, batch_id)`` action and the end
  offsets in ``userMetadata`` (:class:`.offsets.BatchCommit`);
- a replayed batch (its txn version already recorded) writes nothing and reports success (I2);
- a batch commits only where the pipeline's stored offsets end (fencing, I6);
- ``append`` adds every row; ``upsert`` MERGEs on the key columns, idempotently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from .offsets import BatchCommit, Offsets, StoredOffsets
from .transform import DEAD_LETTER_COLUMN

if TYPE_CHECKING:
    from .config import PipelineConfig

log = logging.getLogger(__name__)


class StagedRows(Protocol):
    """A batch's rows a sink already wrote as data files of its table (invisible to readers),
    waiting for the batch's commit."""

    num_rows: int


Rows = pa.Table | DataFrame | StagedRows
"""A batch's rows: a Spark DataFrame (the delta-spark sink writes it from the executors), data
files the delta-rs sink's tasks already wrote (:class:`StagedRows`), or Arrow on the driver (an
upsert's MERGE source, the dead-letter records)."""

# Classes whose presence on the JVM classpath tells that a connector's jars are there.
CONNECTOR_CLASSES = {
    "delta-spark": "org.apache.spark.sql.delta.DeltaLog",
    "spark-sql-kafka": "org.apache.spark.sql.kafka010.KafkaSourceProvider",
}
# Session confs delta-spark needs outside Databricks (where they are preset).
DELTA_SESSION_CONFS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def connector_packages() -> list[str]:
    """Maven coordinates of the cluster engine's connectors matching the installed pyspark and
    delta-spark (Spark 4 is built for Scala 2.13), for ``spark-submit --packages``."""
    from importlib.metadata import version

    spark = version("pyspark")
    # delta-spark's own rule (delta/pip_utils.py, configure_spark_with_delta_pip, 4.4.1): the
    # artifact carries the Spark major.minor it is built for, io.delta:delta-spark_4.2_2.13 for
    # pyspark 4.2.x. That helper only hands back a SparkSession builder, so the rule is repeated.
    spark_major_minor = ".".join(spark.split(".")[:2])
    return [
        f"io.delta:delta-spark_{spark_major_minor}_2.13:{version('delta-spark')}",
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark}",
    ]


def connectors_missing_reason(missing: list[str]) -> str:
    """What a test skipped for lack of connector jars reports, e.g. ``spark-sql-kafka jars not
    on the classpath``: it names exactly the connectors this session lacks."""
    return f"{' and '.join(missing)} jars not on the classpath"


def local_connector_jars(folder: str) -> list[str]:
    """Absolute paths of every ``*.jar`` in ``folder``: connectors installed by hand (an
    air-gapped machine, a mirror), for ``spark.jars`` / ``spark-submit --jars``."""
    from pathlib import Path

    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ConnectorMissingError(f"connector jar folder {folder!r} is not a directory")
    jars = sorted(str(j.resolve()) for j in path.glob("*.jar"))
    if not jars:
        raise ConnectorMissingError(f"connector jar folder {folder!r} holds no .jar file")
    return jars


class FencingError(RuntimeError):
    """The table's stored offsets are not where this batch starts: another run of the same
    pipeline committed in between (or the table was restored). Committing would duplicate or
    skip records, so this run stops."""


class DeadLetterError(RuntimeError):
    """A record cannot be processed and dead letters are disabled."""


class ConnectorMissingError(RuntimeError):
    """The configured engine needs JVM connector jars that this Spark session does not have."""


@dataclass(frozen=True)
class SinkResult:
    """Outcome of one batch: ``delta_version`` is the commit that holds it (None when replayed)."""

    written: bool
    rows: int
    delta_version: int | None


@dataclass(frozen=True)
class WriteMode:
    """How a sink applies a batch: ``append``, or ``upsert`` MERGE on ``keys``."""

    kind: str = "append"
    keys: tuple[str, ...] = ()
    order_by: str | None = None

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


class Sink(Protocol):
    table_uri: str

    def materialize(self, out: DataFrame) -> Materialized:
        """Compute ``out`` once, in the form this sink writes, and split off dead letters."""
        ...

    def check(self, commit: BatchCommit, start: Offsets | None = None) -> bool:
        """The fencing check alone, before anything is written (dead letters go to their table
        only after it): True when the batch is already in the table (a replay), raises
        :class:`FencingError` when it does not start where the table ends."""
        ...

    def commit_batch(
        self, rows: Rows, commit: BatchCommit, start: Offsets | None = None
    ) -> SinkResult:
        """Commit ``rows`` as batch ``commit`` in one Delta commit; ``start`` (the batch's
        start offsets) enables the fencing check; a replay writes nothing. The checks run
        again here, atomically with the commit."""
        ...

    def append_unprotected(self, rows: Rows) -> SinkResult:
        """Plain append, no txn/offsets/fencing: only for measuring their cost (scripts/bench)."""
        ...


class OffsetStore(Protocol):
    def read(
        self, partitions: Callable[[], Mapping[str, list[int]]] | None = None
    ) -> StoredOffsets | None:
        """Offsets of this pipeline's newest commit in the table; when log cleanup removed it,
        the offsets kept as txn actions for ``partitions()`` (a lazy Kafka metadata query);
        None when the pipeline never committed to the table."""
        ...


class Source(Protocol):
    # Where a partition new to the checkpoint (a topic added to the subscription, partitions
    # added to a topic) starts: True, at the offset the table stores for it (else its
    # earliest); False, always at its earliest (Spark's kafka source).
    new_partitions_start_at_stored_offsets: bool

    def stream(
        self, spark: SparkSession, stored: StoredOffsets | None, resuming: bool = False
    ) -> DataFrame:
        """The streaming DataFrame of Spark's kafka columns (key, value, topic, partition,
        offset, timestamp, timestampType, headers), starting at ``stored`` when the checkpoint
        is new; ``resuming``: the checkpoint already holds a plan (Spark ignores starting
        offsets then)."""
        ...


@dataclass
class Engine:
    source: Source
    sink: Sink
    offset_store: OffsetStore
    dead_letter_sink: Sink | None
    # Offsets stored in the dead-letter table (same tag and rules as the main table's).
    dead_letter_offsets: OffsetStore | None = None


# -- shared sink rules ------------------------------------------------------------------------


def check_contiguous(
    stored: StoredOffsets | None, start: Offsets | None, commit: BatchCommit
) -> None:
    """Raise :class:`FencingError` unless the batch starts exactly where the table ends, and
    never when it would move a stored offset backwards.

    ``start`` is the batch's real start, as Spark persisted it (the previous batch's planned
    end; for batch 0 the source's initial offsets). ``start`` None skips that comparison; ``{}``
    means the table must hold no offsets of this pipeline yet (first batch of a first run).
    Only partitions present on both sides are compared: a partition added to a topic, or a
    topic added to the subscription, has no stored offset yet, and a topic dropped from the
    subscription keeps its old one.

    The backwards rule holds whatever ``start`` says: a checkpoint whose batch was planned
    before another run moved the table on (a retried job, a second checkpoint) re-plays a range
    the table already holds; committing it would duplicate records or rewind the offsets.
    """
    if stored is not None:
        behind = [
            (t, p, end, stored.offsets[t][p])
            for t, parts in commit.end_offsets.items()
            for p, end in parts.items()
            if p in stored.offsets.get(t, {})
            and end < stored.offsets[t][p]
            and (t, p) not in commit.rewound
        ]
        if behind:
            detail = "; ".join(f"{t}[{p}] stored {o}, batch ends at {e}" for t, p, e, o in behind)
            raise FencingError(
                f"batch {commit.batch_id} of pipeline {commit.pipeline_id!r} would move the "
                f"table's stored offsets backwards: {detail} (stored at {stored.describe()}). "
                "This checkpoint planned the batch before another run of the pipeline moved the "
                "table on (a retried or concurrent job). Nothing was written. Delete this "
                f"checkpoint ({commit.app_id}); the pipeline then resumes from the table's "
                "offsets."
            )
    if start is None:
        return
    if stored is None:
        if not any(start.values()):
            return
        problem = "the table holds no offsets of this pipeline"
    else:
        moved = [
            (t, p, o, start[t][p])
            for t, parts in stored.offsets.items()
            for p, o in parts.items()
            if p in start.get(t, {}) and start[t][p] != o
        ]
        if not moved and (any(start.values()) or not any(stored.offsets.values())):
            return
        detail = "; ".join(f"{t}[{p}] stored {o}, batch starts at {s}" for t, p, o, s in moved)
        problem = f"{detail or 'the table already holds offsets'} (stored at {stored.describe()})"
    cause = (
        "An operator reset the table's offsets while this checkpoint was in use: move the "
        "checkpoint aside (a new one starts at the reset offsets)"
        if stored is not None and stored.reset is not None
        else "Another run of this pipeline is writing to the same table, or the table was "
        "restored to another point"
    )
    raise FencingError(
        f"batch {commit.batch_id} of pipeline {commit.pipeline_id!r} does not start where the "
        f"table ends: {problem}. {cause}; this run stops without committing, so nothing is "
        "duplicated or skipped."
    )


def require_dead_letter_positions(columns: list[str]) -> None:
    missing = {"topic", "partition", "offset"} - set(columns)
    if missing:
        raise DeadLetterError(
            f"the transform marked rows with {DEAD_LETTER_COLUMN} but dropped {sorted(missing)}; "
            "dead letters need the Kafka position to find the original record"
        )


def split_dead_letters(data: pa.Table) -> tuple[pa.Table, pa.Table | None]:
    """(rows for the table without the ``_error`` column, rows marked as dead letters)."""
    if DEAD_LETTER_COLUMN not in data.column_names:
        return data, None
    marked = pc.is_valid(data.column(DEAD_LETTER_COLUMN))
    good = data.filter(pc.invert(marked)).drop_columns([DEAD_LETTER_COLUMN])
    if not pc.any(marked).as_py():
        return good, None
    require_dead_letter_positions(data.column_names)
    dead = data.filter(marked).select(["topic", "partition", "offset", DEAD_LETTER_COLUMN])
    return good, dead


def unsent_dead_letters(dead: pa.Table, sent: Offsets) -> pa.Table:
    """The dead letters at positions the dead-letter table's stored offsets do not cover yet.

    Dead letters are committed before the batch's main commit (so a crash between the two
    loses none). When that main commit never happens and another checkpoint, or a new one,
    re-reads the range, its dead letters below the dead-letter table's stored offsets are
    already there: sending them again would duplicate them.
    """
    if not sent or dead.num_rows == 0:
        return dead
    keep = [
        offset >= sent.get(topic, {}).get(partition, -1)
        for topic, partition, offset in zip(
            dead.column("topic").to_pylist(),
            dead.column("partition").to_pylist(),
            dead.column("offset").to_pylist(),
            strict=True,
        )
    ]
    return dead.filter(pa.array(keep, pa.bool_()))


def split_dead_letters_df(out: DataFrame) -> Materialized:
    """:func:`split_dead_letters` for a sink that writes DataFrames: ``out`` is cached so the
    dead-letter check, the row count and the write compute the transform (and read Kafka)
    once; only the dead letters' positions and errors come to the driver."""
    cached = out.persist()
    if DEAD_LETTER_COLUMN not in out.columns:
        return Materialized(cached, None, release=cached.unpersist)
    marked = F.col(DEAD_LETTER_COLUMN).isNotNull()
    dead_rows = cached.filter(marked)
    dead: pa.Table | None = None
    positions = ["topic", "partition", "offset"]
    if set(positions) <= set(out.columns):
        # One job computes (and caches) every partition and brings back only the dead letters'
        # positions; an isEmpty() first would scan the partitions in several growing jobs.
        found = dead_rows.select(*positions, DEAD_LETTER_COLUMN).toArrow()
        dead = found if found.num_rows else None
    elif not dead_rows.isEmpty():
        require_dead_letter_positions(out.columns)
    good = cached.filter(~marked).drop(DEAD_LETTER_COLUMN)
    return Materialized(good, dead, release=cached.unpersist)


def latest_per_key(keys: tuple[str, ...], order_by: str | None) -> Callable[[DataFrame], DataFrame]:
    """Factory: keep, per key, only the newest row of the batch, newest by ``order_by`` (when
    given) and then by Kafka position; dead-letter rows (``_error`` set) all pass through.

    A MERGE must see each key at most once per batch (delta-spark refuses several source rows
    matching one target row), and within a partition the later record is the newer one.

    >>> df.transform(latest_per_key(("id",), "event_time"))  # doctest: +SKIP
    """

    def _latest(df: DataFrame) -> DataFrame:
        missing = [k for k in (*keys, *([order_by] if order_by else [])) if k not in df.columns]
        if missing:
            raise ValueError(
                f"upsert columns {missing} are not in the transform's output {df.columns}"
            )
        # A row without its key cannot be merged: it is a dead letter, not a silent insert.
        error = F.col(DEAD_LETTER_COLUMN) if DEAD_LETTER_COLUMN in df.columns else F.lit(None)
        for key in keys:
            error = F.when(
                error.isNull() & F.col(key).isNull(), F.lit(f"merge key {key!r} is null")
            ).otherwise(error)
        df = df.withColumn(DEAD_LETTER_COLUMN, error.cast("string"))
        order = [F.col(order_by).desc_nulls_last()] if order_by else []
        order += [F.col(c).desc() for c in ("offset", "partition") if c in df.columns]
        # Ranked among good rows only: a dead letter never displaces a good row of its key.
        good = F.col(DEAD_LETTER_COLUMN).isNull()
        rank = F.row_number().over(Window.partitionBy(good, *keys).orderBy(*order))
        # Dead letters keep every row: each bad record must reach the dead-letter table.
        # (Spark refuses a window function inside a filter, hence the helper column.)
        keep = ~good | (rank == 1)
        return df.withColumn("_keep", keep).filter("_keep").drop("_keep")

    return _latest


# -- choosing the engine ----------------------------------------------------------------------


def missing_connectors(spark: SparkSession, needed: list[str]) -> list[str]:
    """Which of the ``needed`` connectors (keys of :data:`CONNECTOR_CLASSES`) this session's
    JVM cannot load. Under Spark Connect (no JVM access; Databricks) nothing is reported."""
    try:
        jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
        utils = jvm.org.apache.spark.util.Utils
    except Exception:
        return []
    return [name for name in needed if not utils.classIsLoadable(CONNECTOR_CLASSES[name])]


def required_connectors(source: str, sink: str) -> list[str]:
    """The JVM connectors an engine mix needs (keys of :data:`CONNECTOR_CLASSES`)."""
    needed = []
    if sink == "delta_spark":
        needed.append("delta-spark")
    if source == "spark_kafka":
        needed.append("spark-sql-kafka")
    return needed


def build_engine(spark: SparkSession, config: PipelineConfig) -> Engine:
    """The source, sink, offset store and dead-letter sink ``config.engine`` names; fails
    before any work when the session lacks the connector jars they need."""
    missing = missing_connectors(
        spark, required_connectors(config.engine.source, config.engine.sink)
    )
    if missing:
        raise ConnectorMissingError(
            f"engine {config.engine.name!r} needs the {' and '.join(missing)} jars, which this "
            "Spark session does not have. On Databricks they are built in; locally run "
            "scripts/run_cluster_local.sh (spark-submit --packages, or --jars from the folder "
            "KAFKA_DELTA_JARS names), or use engine: embedded."
        )
    mode = WriteMode(config.delta.mode, config.delta.merge_keys, config.delta.order_by)
    dead_table = config.dead_letter_table
    source: Source
    if config.engine.source == "embedded":
        from .embedded.stream import EmbeddedSource

        source = EmbeddedSource(config.kafka)
    else:
        from .cluster.source import SparkKafkaSource

        source = SparkKafkaSource(config.kafka)

    if config.engine.sink == "delta_rs":
        from .embedded.offset_store import DeltaRsOffsetStore
        from .embedded.sink import DeltaRsSink

        options = config.delta.storage_options
        return Engine(
            source=source,
            sink=DeltaRsSink(config.delta.table, config.pipeline_id, options, mode=mode),
            offset_store=DeltaRsOffsetStore(config.delta.table, config.pipeline_id, options),
            dead_letter_sink=(
                DeltaRsSink(dead_table, config.pipeline_id, options) if dead_table else None
            ),
            dead_letter_offsets=(
                DeltaRsOffsetStore(dead_table, config.pipeline_id, options) if dead_table else None
            ),
        )
    from .cluster.offset_store import DeltaSparkOffsetStore
    from .cluster.sink import DeltaSparkSink

    return Engine(
        source=source,
        sink=DeltaSparkSink(spark, config.delta.table, config.pipeline_id, mode=mode),
        offset_store=DeltaSparkOffsetStore(spark, config.delta.table, config.pipeline_id),
        dead_letter_sink=(
            DeltaSparkSink(spark, dead_table, config.pipeline_id) if dead_table else None
        ),
        dead_letter_offsets=(
            DeltaSparkOffsetStore(spark, dead_table, config.pipeline_id) if dead_table else None
        ),
    )


if __name__ == "__main__":  # scripts/run_cluster_local.sh asks for the coordinates
    print(",".join(connector_packages()))
