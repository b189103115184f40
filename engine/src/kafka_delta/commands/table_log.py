"""What the offsets commands read from Delta and Kafka (confluent-kafka).

Both sinks write the same ``userMetadata`` record (:class:`..offsets.BatchCommit`), read by the
same reader (:mod:`kafka_delta.offsets.stored`). The table is reached the way its sink reaches
it (:func:`open_table`): with delta-rs, without Spark, for ``engine.sink: delta_rs``; through
Spark alone for ``delta_spark`` (:class:`SparkCommandTable`; by name or path, never delta-rs,
never a file the driver opens: I14), so a command works where the pipeline works, a Unity
Catalog table and a Spark Connect session included.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kafka_delta.config import PipelineConfig
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.offsets.history import live_history
from kafka_delta.offsets.model import (
    BatchCommit,
    StoredOffsets,
    parse_user_metadata,
    starting_offsets_option,
)
from kafka_delta.offsets.stored import HISTORY_PAGES, TableLog, read_stored

# Kafka metadata calls of a command: long enough for a loaded broker, short enough for a human.
KAFKA_TIMEOUT_S = 15.0


class CommandError(RuntimeError):
    """Bad input or a state the command cannot work on: one clear message, nothing written."""


@dataclass(frozen=True)
class PipelineCommit:
    """One commit of the pipeline in the Delta log."""

    version: int
    timestamp_ms: int | None
    record: BatchCommit

    @property
    def is_reset(self) -> bool:
        return self.record.reset is not None

    def stored(self) -> StoredOffsets:
        r = self.record
        return StoredOffsets(
            r.end_offsets, self.version, r.app_id, r.batch_id, seq=r.seq, reset=r.reset
        )


def _commits(history: Iterable[dict[str, object]], pipeline_id: str) -> list[PipelineCommit]:
    found = []
    for entry in history:
        record = parse_user_metadata(entry.get("userMetadata"), pipeline_id)
        if record is not None:
            stamp = entry.get("timestamp")
            found.append(
                PipelineCommit(
                    int(entry["version"]),  # type: ignore[call-overload]
                    int(stamp) if isinstance(stamp, int) else None,
                    record,
                )
            )
    return found


class SparkCommandTable:
    """A delta-spark sink's table as the commands read it: the few calls they make on
    delta-rs's ``DeltaTable`` (``history``, ``version``, ``schema().to_arrow()``,
    ``to_pyarrow_table``), answered through Spark alone."""

    def __init__(self, table: Any) -> None:
        self.table = table  # kafka_delta.delta.spark_table.SparkTable

    def history(self, limit: int | None = None) -> list[dict[str, object]]:
        return self.table.history(limit)

    def version(self) -> int:
        return int(self.history(1)[0]["version"])  # type: ignore[call-overload]

    def schema(self) -> SparkCommandTable:
        return self

    def to_arrow(self) -> pa.Schema:
        return self.table.frame().limit(0).toArrow().schema

    def to_pyarrow_table(self, columns: list[str]) -> pa.Table:
        return self.table.frame().select(*columns).toArrow()

    def count_rows(self) -> int:
        return int(self.table.frame().count())


def command_spark(config: PipelineConfig) -> Any:
    """The Spark session a command on a delta-spark table works through (the config's, as a
    run builds it); :class:`CommandError` when it lacks delta-spark's jars."""
    from kafka_delta.runtime.connectors import missing_connectors
    from kafka_delta.runtime.spark_session import build_spark

    spark = build_spark(config)
    if missing_connectors(spark, ["delta-spark"]):
        raise CommandError(
            "the table is written by delta-spark (engine.sink: delta_spark), and this Spark "
            "session has no delta-spark jars: run the command where the pipeline runs "
            "(Databricks, or locally with the jars on the session: spark.jars or "
            "spark.jars.packages in the config's spark: section)"
        )
    return spark


def open_table(uri: str, config: PipelineConfig) -> Any | None:
    """The table at ``uri`` (a path, or a catalog name on delta-spark) as its sink reaches it
    (see the module docstring); None when there is none."""
    if config.engine.sink == "delta_rs":
        from kafka_delta.delta.rs_offset_store import open_table as open_delta_rs

        return open_delta_rs(uri, config.delta.storage_options)
    from kafka_delta.delta.spark_table import SparkTable, TableAccessError

    table = SparkTable(command_spark(config), uri)
    try:
        exists = table.exists()
    except TableAccessError as exc:
        raise CommandError(str(exc)) from None
    return SparkCommandTable(table) if exists else None


def open_existing(uri: str, config: PipelineConfig, what: str = "table") -> Any:
    table = open_table(uri, config)
    if table is None:
        raise CommandError(f"there is no Delta {what} at {uri}")
    return table


def table_log(table: Any, config: PipelineConfig) -> TableLog:
    """The reader's view (:class:`kafka_delta.offsets.stored.TableLog`) of ``table`` (from
    :func:`open_table`), with the commit copies its sink keeps (delta-spark)."""
    if isinstance(table, SparkCommandTable):
        from kafka_delta.delta.commit_copies import CommitCopies
        from kafka_delta.delta.spark_offset_store import DeltaSparkLog

        copies = CommitCopies(
            config.delta.table, config.checkpoint, config.pipeline_id, config.delta.storage_options
        )
        return DeltaSparkLog(table.table, config.pipeline_id, copies)
    from kafka_delta.delta.rs_offset_store import DeltaRsLog

    return DeltaRsLog(table)


def newest_commit(table: Any, pipeline_id: str) -> PipelineCommit | None:
    """The pipeline's newest commit in effect in the retained log (a RESTORE hides the
    commits it undid), reading no more than it must."""
    for limit in HISTORY_PAGES:
        page = table.history(limit)
        found = _commits(live_history(page), pipeline_id)
        if found:
            return max(found, key=lambda c: c.version)
        if limit is None or len(page) < limit:
            return None
    return None


def commits_in(history: Iterable[dict[str, object]], pipeline_id: str) -> list[PipelineCommit]:
    """Every commit of the pipeline in ``history`` (a table's ``history()``), oldest first."""
    return sorted(_commits(history, pipeline_id), key=lambda c: c.version)


def stored_offsets(
    table: Any, config: PipelineConfig, partitions: dict[str, list[int]]
) -> tuple[StoredOffsets, PipelineCommit | None]:
    """The pipeline's stored offsets, read by the pipeline's own reader (RESTOREs, log cleanup:
    :mod:`kafka_delta.offsets.stored`), and the commit holding them (None when log cleanup
    removed it); no commit of the pipeline is an error."""
    pipeline_id = config.pipeline_id
    stored = read_stored(table_log(table, config), pipeline_id, lambda: partitions)
    if stored is None:
        starting = starting_offsets_option(config.kafka.starting_offsets)
        raise CommandError(
            f"table {config.delta.table} holds no commits of pipeline {config.pipeline_id!r} "
            f"(version {table.version()}): wrong table or --env? The pipeline's first run "
            f"starts at kafka.starting_offsets ({starting})."
        )
    if stored.delta_version is None or stored.expired:
        return stored, None
    return stored, newest_commit(table, pipeline_id)


def row_count(table: Any) -> int:
    """Rows in the table's current snapshot, from the file statistics when every file has
    them (no data read), else by scanning; through Spark for a delta-spark table."""
    if isinstance(table, SparkCommandTable):
        return table.count_rows()
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    counts = actions.column("num_records")
    if counts.null_count == 0:
        return int(pc.sum(counts).as_py() or 0)
    return int(table.to_pyarrow_dataset().count_rows())


def kafka_partitions(
    admin: KafkaAdmin, topics: Iterable[str]
) -> tuple[dict[str, list[int]], list[str]]:
    """(partitions of the topics that exist on Kafka, the topics that do not)."""
    found, missing = {}, []
    for topic in sorted(set(topics)):
        try:
            found.update(admin.partitions([topic]))
        except ValueError:
            missing.append(topic)
    return found, missing


def format_rows(header: list[str], rows: list[list[object]]) -> list[str]:
    """Rows as aligned text columns (None shows as '-')."""
    cells = [header] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]


def group_offsets_of(config: PipelineConfig) -> dict[str, dict[int, int]]:
    """What the consumer group holds for a pipeline: the table's stored offsets; of several
    tables (``tables:``), per partition the least any table reading it stores (as the run
    commits it back, :func:`kafka_delta.routing.group_offsets`). A table with no commit of the
    pipeline yet counts for nothing."""
    least: dict[str, dict[int, int]] = {}
    for view in config.table_configs():
        table = open_table(view.delta.table, view)
        if table is None:
            continue
        partitions, _ = kafka_partitions(admin_for(view), view.kafka.topics)
        try:
            stored, _ = stored_offsets(table, view, partitions)
        except CommandError:
            continue  # no commit of the pipeline in this table yet
        for t, parts in stored.offsets.items():
            if config.tables and t not in view.kafka.topics:
                continue
            for p, o in parts.items():
                least.setdefault(t, {})[p] = min(o, least.get(t, {}).get(p, o))
    return least


def admin_for(config: PipelineConfig) -> KafkaAdmin:
    return KafkaAdmin(config.kafka.client_config(), timeout_s=KAFKA_TIMEOUT_S)
