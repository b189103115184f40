"""Delta's own maintenance of a table, on the engine that writes it: compaction, vacuum and a
checkpoint, each retried on a lost commit race. ``table maintain``
(:mod:`kafka_delta.commands.table`) runs them on an operator's word; a run compacts its own
tables with them on a schedule (:mod:`kafka_delta.runtime.compaction`,
``delta.compact_every_seconds``).

Nothing here imports ``deltalake`` or delta-spark at module level: each engine's calls are made
where the engine is the table's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

log = logging.getLogger(__name__)

# A compaction (or vacuum commit) that loses a commit race is tried this often in all.
ATTEMPTS = 5
RETRY_PAUSE_S = 1.0
# What each engine's compaction takes as a small file, when the table and session say nothing:
# delta-rs compacts files below delta.targetFileSize (100 MiB), delta-spark's OPTIMIZE files
# below spark.databricks.delta.optimize.minFileSize (1 GiB).
DELTA_RS_TARGET_SIZE = 100 * 1024 * 1024
DELTA_SPARK_MIN_FILE_SIZE = 1024 * 1024 * 1024


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class Maintainer(Protocol):
    """One engine's steps on one table."""

    name: str

    def small_file_size(self, configuration: Mapping[str, str]) -> int:
        """The size below which a file counts as small, for the table's ``configuration``."""
        ...

    def exists(self, uri: str) -> bool: ...

    def compact(self, uri: str) -> tuple[int, int, int]:
        """(files removed, their bytes, files added)."""
        ...

    def vacuum(self, uri: str, hours: float, full: bool, dry_run: bool) -> list[str]: ...

    def checkpoint(self, uri: str) -> int: ...


class DeltaRsMaintainer:
    """delta-rs 1.6: ``optimize.compact()``, ``vacuum()``, ``create_checkpoint()`` and
    ``cleanup_metadata()``."""

    name = "delta-rs"

    def __init__(self, storage_options: dict[str, str]) -> None:
        self.storage_options = dict(storage_options) or None

    def _open(self, uri: str) -> Any:
        from deltalake import DeltaTable

        return DeltaTable(uri, storage_options=self.storage_options)

    def small_file_size(self, configuration: Mapping[str, str]) -> int:
        configured = configuration.get("delta.targetFileSize")
        return int(configured) if configured else DELTA_RS_TARGET_SIZE

    def exists(self, uri: str) -> bool:
        from deltalake import DeltaTable

        return bool(DeltaTable.is_deltatable(uri, storage_options=self.storage_options))

    def compact(self, uri: str) -> tuple[int, int, int]:
        metrics = self._open(uri).optimize.compact()
        removed = _json(metrics.get("filesRemoved"))
        return (
            int(metrics.get("numFilesRemoved", 0)),
            int(removed.get("totalSize", 0)),
            int(metrics.get("numFilesAdded", 0)),
        )

    def vacuum(self, uri: str, hours: float, full: bool, dry_run: bool) -> list[str]:
        # delta-rs takes whole hours; the floor was checked on the exact value, so rounding
        # up never goes below it.
        return self._open(uri).vacuum(
            retention_hours=_whole_hours(hours),
            dry_run=dry_run,
            enforce_retention_duration=True,
            full=full,
        )

    def checkpoint(self, uri: str) -> int:
        """A Delta checkpoint, then the log entries past ``delta.logRetentionDuration`` (30 days
        by default) deleted: the delta-rs sink's batch commits leave that cleanup to
        maintenance (``sinks.delta_rs.sink.BATCH_COMMIT_HOOKS``)."""
        table = self._open(uri)
        table.create_checkpoint()
        table.cleanup_metadata()
        return table.version()


def _whole_hours(hours: float) -> int:
    whole = int(hours)
    return whole if whole == hours else whole + 1


def _json(value: object) -> dict[str, Any]:
    import json

    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(str(value)) if value else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


class DeltaSparkMaintainer:
    """delta-spark through Spark alone: ``DeltaTable.optimize().executeCompaction()``, ``VACUUM``
    (SQL, for its LITE and DRY RUN forms), by name or by path; the checkpoint is delta-spark's
    own (see the module docstring)."""

    name = "delta-spark"

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def small_file_size(self, configuration: Mapping[str, str]) -> int:
        configured = self.spark.conf.get("spark.databricks.delta.optimize.minFileSize", None)
        return int(configured) if configured else DELTA_SPARK_MIN_FILE_SIZE

    def exists(self, uri: str) -> bool:
        from kafka_delta.delta.spark_table import SparkTable

        return SparkTable(self.spark, uri).exists()

    def compact(self, uri: str) -> tuple[int, int, int]:
        from kafka_delta.delta.spark_table import SparkTable

        table = SparkTable(self.spark, uri).sql_name()
        row = self.spark.sql(f"OPTIMIZE {table}").first()
        metrics = row["metrics"] if row is not None else None
        if metrics is None:
            return 0, 0, 0
        removed = metrics["filesRemoved"]
        return (
            int(metrics["numFilesRemoved"]),
            int(removed["totalSize"]) if removed is not None else 0,
            int(metrics["numFilesAdded"]),
        )

    def vacuum(self, uri: str, hours: float, full: bool, dry_run: bool) -> list[str]:
        from kafka_delta.delta.spark_table import SparkTable

        table = SparkTable(self.spark, uri).sql_name()
        mode = "FULL" if full else "LITE"
        listed = self.spark.sql(f"VACUUM {table} {mode} RETAIN {hours:g} HOURS DRY RUN")
        paths = [str(r[0]) for r in listed.collect()]
        if not dry_run and paths:
            self.spark.sql(f"VACUUM {table} {mode} RETAIN {hours:g} HOURS").collect()
        return paths

    def checkpoint(self, uri: str) -> int:
        """delta-spark writes checkpoints itself (every ``delta.checkpointInterval`` commits)
        and gives Spark's APIs no call to force one: nothing is written; the table's version."""
        from kafka_delta.delta.spark_table import SparkTable

        return int(SparkTable(self.spark, uri).history(1)[0]["version"])  # type: ignore[call-overload]


def is_commit_conflict(exc: BaseException) -> bool:
    """A lost commit race of either engine (delta-rs ``CommitFailedError``, delta-spark's
    ``Concurrent...Exception``), which a retry on a fresh snapshot resolves."""
    if type(exc).__name__ == "CommitFailedError":  # delta-rs's (deltalake.exceptions)
        return True
    text = f"{type(exc).__name__}: {exc}"
    return "Concurrent" in text or "CONCURRENT" in text


def with_retries(what: str, step: Callable[[int], Any]) -> Any:
    """``step(attempt)``, tried again on a lost commit race, at most :data:`ATTEMPTS` times."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return step(attempt)
        except Exception as exc:
            if not is_commit_conflict(exc) or attempt == ATTEMPTS:
                raise
            log.warning(
                "%s lost a commit race (attempt %d of %d), trying again on the new snapshot: %s",
                what,
                attempt,
                ATTEMPTS,
                first_line(exc),
            )
            time.sleep(RETRY_PAUSE_S * attempt)
    raise AssertionError("unreachable")


def maintainer_for(sink: str, storage_options: Mapping[str, str], spark: Any) -> Maintainer:
    """The maintenance of the tables ``engine.sink`` writes: delta-rs's, or delta-spark's
    through ``spark`` (a session with Delta's jars)."""
    if sink == "delta_rs":
        return DeltaRsMaintainer(dict(storage_options))
    return DeltaSparkMaintainer(spark)
