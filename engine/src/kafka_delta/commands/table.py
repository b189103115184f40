"""``<script> table maintain``: compaction, vacuum and a Delta checkpoint of the pipeline's
tables (the table and its dead-letter table), safe beside a running pipeline.

    orders-stream table maintain [--only compact,vacuum,checkpoint] [--no-compact]
                                 [--no-vacuum] [--no-checkpoint] [--retention-hours H]
                                 [--full] [--dry-run]

Each step runs on the engine of the config's sink, never by hand: delta-rs
(``optimize.compact()``, ``vacuum()``, ``create_checkpoint()``) for ``engine.sink: delta_rs``,
delta-spark through Spark alone (``OPTIMIZE``, ``VACUUM``; by name or path; I14) for
``delta_spark``, where the checkpoint step is delta-spark's own: it writes one every
``delta.checkpointInterval`` commits (10 by default) and offers Spark no call to force one.

Why it is safe while the pipeline commits:

- compaction commits only ``remove``/``add`` actions with ``dataChange=false``: both engines
  check such a commit at snapshot isolation, so the pipeline's appends never conflict with it
  (the delta-rs sink, which commits without retries, re-checks its batch and commits again on
  top; delta-spark's blind append is not affected). A compaction that loses to a commit that
  removed files it read is retried on a fresh snapshot
  (:data:`kafka_delta.delta.maintenance.ATTEMPTS` times in all, each one logged).
  Compaction rewrites data files only: the txn actions (offset txns, the fence) are log state,
  kept by every later snapshot and checkpoint, and the commits' ``userMetadata`` stays as it was;
- vacuum never goes below the table's ``delta.deletedFileRetentionDuration`` (7 days unless the
  table says otherwise): a restarted pipeline's replay, readers of recent versions and RESTORE
  targets need the files younger than that. By default it deletes only files a commit removed
  (VACUUM LITE), never files no commit names, so a batch whose data files are written but not
  yet committed is safe whatever the retention; ``--full`` also deletes files no commit names
  (left by crashed batches) once older than the retention;
- both engines' vacuum skip folders whose names start with ``_``: ``_delta_log`` and the
  delta-rs sink's ``_kafka_delta/`` (run leases) are never listed, let alone deleted (the
  delta-spark sink keeps its side files beside the checkpoint, not in the table);
- a checkpoint keeps the txn actions (the fence, and the topic ids a recreated topic is known
  by after log cleanup; the offsets then come from the rows).

Exit status: 0 done (or nothing to do), 1 a step failed (after its retries), 2 bad input or a
retention the command refuses (one sentence, nothing done).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from kafka_delta.commands.arguments import add_config_options, build_config, selected_tables
from kafka_delta.commands.table_log import CommandError, open_table
from kafka_delta.config import ConfigError, PipelineConfig
from kafka_delta.delta.maintenance import (
    DeltaSparkMaintainer,
    Maintainer,
    first_line,
    maintainer_for,
    with_retries,
)

log = logging.getLogger(__name__)

STEPS = ("compact", "vacuum", "checkpoint")
# Delta's default of delta.deletedFileRetentionDuration (both engines): one week.
DEFAULT_RETENTION_HOURS = 168.0


@dataclass(frozen=True)
class Plan:
    steps: tuple[str, ...]
    retention_hours: float | None  # None: each table's own floor
    full: bool
    dry_run: bool


@dataclass
class TableState:
    """One table as delta-rs reads it: what the steps and the dry run are planned from."""

    uri: str
    version: int
    configuration: dict[str, str]
    partition_columns: list[str]
    files: pa.Table = field(repr=False)

    @property
    def floor_hours(self) -> float:
        return retention_floor_hours(self.configuration)


# -- input --------------------------------------------------------------------------------------


def parse_steps(only: str | None, skipped: set[str]) -> tuple[str, ...]:
    """The steps to run, in their fixed order: ``--only`` names some, ``--no-*`` drop some."""
    chosen = list(STEPS)
    if only is not None:
        names = [n.strip().lower() for n in only.split(",") if n.strip()]
        unknown = [n for n in names if n not in STEPS]
        if unknown or not names:
            raise CommandError(
                f"--only {only!r}: unknown step {unknown[0]!r}; the steps are {', '.join(STEPS)}"
                if unknown
                else f"--only names no step; the steps are {', '.join(STEPS)}"
            )
        chosen = [s for s in STEPS if s in names]
    steps = tuple(s for s in chosen if s not in skipped)
    if not steps:
        raise CommandError("every step is skipped: nothing to do")
    return steps


_UNIT_HOURS = {
    "nanosecond": 1 / 3.6e12,
    "microsecond": 1 / 3.6e9,
    "millisecond": 1 / 3.6e6,
    "second": 1 / 3600,
    "minute": 1 / 60,
    "hour": 1.0,
    "day": 24.0,
    "week": 168.0,
}


def parse_interval_hours(text: str) -> float:
    """Hours of a Delta interval property such as ``interval 7 days`` or ``interval 1 day 12
    hours`` (the CalendarInterval strings both engines write)."""
    words = text.strip().lower().split()
    if words and words[0] == "interval":
        words = words[1:]
    if not words or len(words) % 2:
        raise ValueError(f"not an interval: {text!r}")
    hours = 0.0
    for amount, unit in zip(words[::2], words[1::2], strict=True):
        unit = unit.removesuffix("s")
        if unit not in _UNIT_HOURS or not re.fullmatch(r"-?\d+(\.\d+)?", amount):
            raise ValueError(f"not an interval: {text!r}")
        hours += float(amount) * _UNIT_HOURS[unit]
    return hours


def retention_floor_hours(configuration: dict[str, str]) -> float:
    """The shortest vacuum retention the table allows: its ``delta.deletedFileRetentionDuration``
    (one week when unset); a value neither engine could read counts as the default."""
    value = configuration.get("delta.deletedFileRetentionDuration")
    if value is None:
        return DEFAULT_RETENTION_HOURS
    try:
        return parse_interval_hours(value)
    except ValueError:
        log.warning("cannot read delta.deletedFileRetentionDuration %r: taking 168 h", value)
        return DEFAULT_RETENTION_HOURS


def _hours(value: float) -> str:
    return f"{value:g} h"


def check_retention(state: TableState, plan: Plan) -> float:
    """The retention vacuum uses on ``state``'s table; refuses one below the table's floor."""
    floor = state.floor_hours
    if plan.retention_hours is None:
        return floor
    if plan.retention_hours < floor:
        raise CommandError(
            f"vacuum retention {_hours(plan.retention_hours)} is below the floor of table "
            f"{state.uri}, its delta.deletedFileRetentionDuration of {_hours(floor)}: files "
            f"younger than that may still be read by readers of recent versions, a RESTORE or a "
            f"restarted pipeline's replay, and a running batch's data files are not committed "
            f"yet; nothing was done (use --retention-hours {floor:g} or more)"
        )
    return plan.retention_hours


def read_state(uri: str, config: PipelineConfig) -> TableState | None:
    """The table at ``uri`` (None when there is none yet); a path that is a file, or that holds
    something else than a Delta table, is bad input."""
    local = Path(uri[len("file://") :] if uri.startswith("file://") else uri)
    if "://" not in uri or uri.startswith("file://"):
        if local.is_file():
            raise CommandError(f"{uri} is a file, not a Delta table's folder")
    if config.engine.sink != "delta_rs":
        return _spark_state(uri, config)
    try:
        table = open_table(uri, config)
    except Exception as exc:
        raise CommandError(f"cannot open a Delta table at {uri}: {first_line(exc)}") from None
    if table is None:
        return None
    return TableState(
        uri,
        table.version(),
        dict(table.metadata().configuration),
        list(table.metadata().partition_columns),
        pa.table(table.get_add_actions(flatten=True)),
    )


def _spark_state(uri: str, config: PipelineConfig) -> TableState | None:
    """:class:`TableState` of a delta-spark table (by name or path), through Spark alone:
    ``DESCRIBE DETAIL`` (properties, partition columns), the history's newest version, and
    the live files' sizes from the rows' ``_metadata`` (Spark's file metadata column)."""
    from pyspark.sql import functions as F

    from kafka_delta.commands.table_log import command_spark
    from kafka_delta.delta.spark_table import SparkTable, TableAccessError

    spark = command_spark(config)
    table = SparkTable(spark, uri)
    try:
        if not table.exists():
            return None
        detail = spark.sql(f"DESCRIBE DETAIL {table.sql_name()}")
        detail = detail.select("properties", "partitionColumns").first()
    except TableAccessError as exc:
        raise CommandError(str(exc)) from None
    partitions = list(detail["partitionColumns"] or [])
    files = (
        table.frame()
        .select(
            F.col("_metadata.file_path").alias("path"),
            F.col("_metadata.file_size").alias("size_bytes"),
            *(F.col(f"`{c}`").alias(f"partition.{c}") for c in partitions),
        )
        .distinct()
        .toArrow()
    )
    return TableState(
        uri,
        int(table.history(1)[0]["version"]),  # type: ignore[call-overload]
        dict(detail["properties"] or {}),
        partitions,
        files,
    )


# -- the steps ------------------------------------------------------------------------------------


def compaction_candidates(state: TableState, small: int) -> tuple[int, int]:
    """(files, bytes) a compaction would rewrite, as both engines plan it: per partition, the
    files below ``small`` bytes, when there are at least two of them (one alone stays)."""
    files = state.files
    if files.num_rows == 0:
        return 0, 0
    sizes = files.column("size_bytes").to_pylist()
    keys = [
        files.column(f"partition.{c}").to_pylist()
        for c in state.partition_columns
        if f"partition.{c}" in files.column_names
    ]
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, size in enumerate(sizes):
        if size < small:
            groups.setdefault(tuple(k[i] for k in keys), []).append(size)
    chosen = [s for group in groups.values() if len(group) > 1 for s in group]
    return len(chosen), sum(chosen)


def maintain(
    state: TableState, engine: Maintainer, plan: Plan, retention: float, out: Callable[[str], None]
) -> None:
    """Run (or, dry, describe) the plan's steps on one table, printing one line per step."""
    uri = state.uri
    if plan.dry_run:
        out(f"table {uri} ({engine.name}, version {state.version}, {state.files.num_rows} files):")
        if "compact" in plan.steps:
            count, size = compaction_candidates(state, engine.small_file_size(state.configuration))
            out(f"  compact: would rewrite {count} files ({size} bytes) into fewer, larger ones")
        if "vacuum" in plan.steps:
            paths = engine.vacuum(uri, retention, plan.full, dry_run=True)
            out(
                f"  vacuum: would delete {len(paths)} files "
                f"({'full' if plan.full else 'lite'}, retention {_hours(retention)})"
            )
            for path in paths:
                out(f"    {path}")
        if "checkpoint" in plan.steps:
            out(f"  checkpoint: would write a checkpoint at version {state.version}")
        out("  dry run: nothing was written")
        return
    if "compact" in plan.steps:
        removed, size, added = with_retries(f"compaction of {uri}", lambda _: engine.compact(uri))
        out(f"table {uri}: compact: {removed} files ({size} bytes) rewritten into {added}")
    if "vacuum" in plan.steps:
        paths = with_retries(
            f"vacuum of {uri}",
            lambda _: engine.vacuum(uri, retention, plan.full, dry_run=False),
        )
        out(
            f"table {uri}: vacuum: {len(paths)} files deleted "
            f"({'full' if plan.full else 'lite'}, retention {_hours(retention)})"
        )
    if "checkpoint" in plan.steps:
        version = engine.checkpoint(uri)
        if isinstance(engine, DeltaSparkMaintainer):
            out(
                f"table {uri}: checkpoint: delta-spark's own, every delta.checkpointInterval "
                f"commits (Spark offers no call to force one; version {version})"
            )
        else:
            out(f"table {uri}: checkpoint: written at version {version}")


def run_maintain(config: PipelineConfig, plan: Plan, out: Callable[[str], None] = print) -> int:
    """Every check first (tables there, retention at or above each floor), then the steps."""
    tables = [("table", config.delta.table)]
    if config.dead_letter_table:
        tables.append(("dead-letter table", config.dead_letter_table))
    states: list[tuple[TableState, float]] = []
    for what, uri in tables:
        state = read_state(uri, config)
        if state is None:
            if what == "table":
                raise CommandError(f"there is no Delta table at {uri}")
            out(f"{what} {uri}: not there yet (no dead letters so far), skipped")
            continue
        retention = check_retention(state, plan) if "vacuum" in plan.steps else 0.0
        states.append((state, retention))
    engine = _engine(config, plan)
    for state, retention in states:
        maintain(state, engine, plan, retention, out)
    return 0


def _engine(config: PipelineConfig, plan: Plan) -> Maintainer:
    if config.engine.sink == "delta_rs":
        return maintainer_for("delta_rs", config.delta.storage_options, None)
    from kafka_delta.runtime.connectors import missing_connectors
    from kafka_delta.runtime.spark_session import build_spark

    conf = {**config.spark.conf, "spark.ui.showConsoleProgress": "false"}
    spark = build_spark(config.with_overrides(**{"spark.conf": conf}))
    if missing_connectors(spark, ["delta-spark"]):
        raise CommandError(
            "the table is written by delta-spark (engine.sink: delta_spark), and this Spark "
            "session has no delta-spark jars: on Databricks they are built in; locally put "
            "them on spark.jars (KAFKA_DELTA_JARS) or set spark.jars.packages in the config"
        )
    return maintainer_for("delta_spark", {}, spark)


# -- the command ----------------------------------------------------------------------------------


def parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=prog,
        description="Look after the pipeline's Delta tables.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    help_ = (
        "compact small files, vacuum files no version needs past the retention, and write a "
        "Delta checkpoint, on the table and its dead-letter table; safe while the pipeline runs"
    )
    maintain_ = commands.add_parser("maintain", allow_abbrev=False, help=help_, description=help_)
    add_config_options(maintain_)
    maintain_.add_argument(
        "--only", metavar="STEPS", help=f"only these steps, comma-separated: {','.join(STEPS)}"
    )
    for step in STEPS:
        maintain_.add_argument(f"--no-{step}", action="store_true", help=f"skip {step}")
    maintain_.add_argument(
        "--retention-hours",
        type=float,
        metavar="H",
        help="vacuum deletes files removed more than H hours ago (default and floor: the "
        "table's delta.deletedFileRetentionDuration, 168 h unless set)",
    )
    maintain_.add_argument(
        "--full",
        action="store_true",
        help="vacuum also deletes files no commit names (crashed batches), once older than the "
        "retention (default: only files a commit removed)",
    )
    maintain_.add_argument(
        "--dry-run",
        action="store_true",
        help="print what each step would do (files and bytes to compact, files to delete, the "
        "version to checkpoint) and write nothing",
    )
    maintain_.add_argument("--log-level", default="WARNING", help="default WARNING")
    return parser


def main(argv: list[str] | None = None, prog: str = "kafka-delta table") -> int:
    args = parser(prog).parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        if args.retention_hours is not None and not args.retention_hours >= 0:
            raise CommandError(f"--retention-hours {args.retention_hours:g} is negative")
        plan = Plan(
            steps=parse_steps(args.only, {s for s in STEPS if getattr(args, f"no_{s}")}),
            retention_hours=args.retention_hours,
            full=args.full,
            dry_run=args.dry_run,
        )
        config = build_config(args)
        # Of several tables (tables:), the one --table names, else each in turn.
        status = 0
        for view in selected_tables(config, args):
            if view.table_name is not None:
                print(f"table {view.table_name}:")
            status = max(status, run_maintain(view, plan))
        return status
    except (ConfigError, CommandError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"error: table maintenance failed: {first_line(exc)}", file=sys.stderr)
        log.debug("the failure in full", exc_info=exc)
        return 1
