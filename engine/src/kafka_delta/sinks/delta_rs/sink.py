"""Delta sink on delta-rs: one commit per micro-batch holding data, txn and end offsets.

What runs where (append, the default):

1. driver (:meth:`DeltaRsSink.check`, called by the pipeline first): the replay check and the
   fencing check (below). A replay or a fenced batch stops here: no task runs, nothing is read
   from Kafka, no file is written. Then (:meth:`DeltaRsSink.materialize`) the table's features
   and the batch's schema against the table's; a bad schema stops here too.
2. executors, in ONE Spark job (one read of Kafka), either writer:

   - ``delta.file_writer: spark``, a table on the local file system: Spark's own Parquet
     writer (:mod:`.jvm_writer`) writes the rows into a staging folder of the table's, the dead
     letters' positions and errors gathered by ``DataFrame.observe`` in the same job; the
     driver reads each file's footer (size, rows, statistics) and moves the files into the
     table's folder. The rows never cross from the JVM into Python. Measured against pyarrow
     (below): even on 200k-record batches, slower on 10k ones, so it is not the default;
   - otherwise (the default; object stores, where Spark has no connector here; a batch Spark's
     writer cannot write as the table wants, :func:`.jvm_writer.can_write`):
     ``DataFrame.mapInArrow`` runs :class:`.file_writer.TaskWriter` in every task's Python
     worker; it writes the task's rows as Parquet files into the table's folder with pyarrow
     and returns one small row per file (path, size, statistics) and one per row the transform
     marked as a dead letter (its position and error; not written).

   Either way the rows never reach the driver, so its memory does not grow with the batch.
3. driver: the dead letters, if any, are committed to their table first (the pipeline), then
   ONE delta-rs commit of the ``add`` actions with the txn actions and the offsets
   (``create_write_transaction``; ``create_table_with_add_actions`` for the first batch).

The driver keeps ONE ``DeltaTable`` across batches and brings it up to date with
``update_incremental`` (the commits since, nothing more), so its work per batch does not grow
with the table's versions or files; it reads the table afresh only when the log it was read
from is gone or changed (the table deleted, or re-created: see :meth:`DeltaRsSink._table`).

Files no commit names (a crash between 2 and 3, a lost race that then fails the fencing check,
a failed task) are invisible to readers; ``VACUUM`` deletes them. A batch that stops before
its commit is attempted (a dead letter with dead letters disabled) deletes its files itself.

Upsert stays on the driver: delta-rs's MERGE takes its source in the driver process, so an
upsert batch is collected to the driver as Arrow (after the checks of step 1) and MERGEd there
with the same commit properties. Arrow tables handed to :meth:`DeltaRsSink.commit_batch`
(the dead-letter table's few records, tests) are written by the driver with the same file
writer and committed the same way.
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, Schema, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import (
    AddAction,
    PostCommitHookProperties,
    create_table_with_add_actions,
)
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

import kafka_delta.crash_points as crash_points
from kafka_delta.contract import DEAD_LETTER_COLUMN
from kafka_delta.dead_letters import (
    POSITION,
    TOPIC_ID,
    TopicIds,
    held_among,
    require_dead_letter_positions,
    split_dead_letters,
)
from kafka_delta.delta.rs_offset_store import newest_stored_in, open_table
from kafka_delta.delta.schema import (
    SchemaMismatchError,
    check_batch_schema,
    check_not_widened_since,
    wider_arrow_type,
    with_nested_fields,
)
from kafka_delta.delta.table_storage import join, open_filesystem
from kafka_delta.engine import Materialized, Rows, SinkResult, WriteMode
from kafka_delta.offsets.fencing import FencingError, check_contiguous, check_unmoved
from kafka_delta.offsets.history import is_restore
from kafka_delta.offsets.model import (
    BatchCommit,
    Offsets,
    StoredOffsets,
    offsets_to_json,
    partitions_of,
)
from kafka_delta.offsets.stored import newest_stored
from kafka_delta.sinks.delta_rs.file_writer import (
    DEAD_LETTER_FIELDS,
    DEFAULT_STATS_COLUMNS,
    FILE_METADATA_SCHEMA,
    TASK_OUTPUT_SCHEMA,
    FileTarget,
    TaskWriter,
    UnsupportedTableError,
    check_table_supported,
    delta_arrow_schema,
    discard_files,
    write_files,
)
from kafka_delta.sinks.delta_rs.jvm_writer import can_write, write_with_spark
from kafka_delta.upsert import merge_clauses, upserted_arrow, upserted_frame

# Properties of the tables this sink creates. A Delta checkpoint every 10 commits, as delta-spark
# does by default (delta-rs: 100): every open of the table (three per batch) replays at most 10
# JSON commits. Measured over 150 batches of 10k records: the driver's RSS grew 0.06 MB per
# batch after the first checkpoint, against 0.4 MB per batch until a checkpoint every 100.
# Tables that already exist keep their own properties.
NEW_TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}
# After a batch's commit: the Delta checkpoint when its interval says so, never the log cleanup.
# delta-rs cleans up expired log entries after every commit by default
# (delta.enableExpiredLogCleanup), listing the whole _delta_log folder to find them: measured on
# the sink's append, 3.2 -> 10.5 ms a commit from 100 to 1,000 versions (2.1 -> 3.7 ms without
# it), growing with every version, thousands an hour on a low-latency trigger. The cleanup is
# maintenance's: `table maintain`'s checkpoint step applies the table's
# delta.logRetentionDuration (delta.maintenance.DeltaRsMaintainer.checkpoint).
BATCH_COMMIT_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)

__all__ = [
    "DeltaRsSink",
    "FencingError",
    "SchemaMismatchError",
    "SinkResult",
    "UnsupportedTableError",
    "check_contiguous",
]

log = logging.getLogger(__name__)

# A lost commit race is retried this often before giving up (each retry re-checks the table).
_MAX_ATTEMPTS = 10


class StagedFiles:
    """The data files of one batch, written once (not yet part of the table), committed by one
    (possibly retried) commit."""

    def __init__(self, schema: pa.Schema, rows: list[dict], target: FileTarget) -> None:
        self.schema = schema
        self.target = target
        # Set once a commit naming the files is attempted: from then on they may be in the
        # table, even when the attempt raised, and only VACUUM may delete them.
        self.handed_to_commit = False
        self.adds = [
            AddAction(
                r["path"],
                r["size"],
                json.loads(r["partition_values"]),
                r["modification_time"],
                True,
                r["stats"],
            )
            for r in rows
        ]
        self.num_rows = sum(r["num_records"] for r in rows)

    def discard_unless_committed(self) -> None:
        """Delete the files when no commit naming them was ever attempted (the batch stopped
        before its commit, e.g. on a dead letter with dead letters disabled): nothing is left
        for VACUUM, and a table that never got a commit leaves no folder behind."""
        if not self.handed_to_commit:
            discard_files(self.target, [add.path for add in self.adds])


class DeltaRsSink:
    """Writes each batch to a Delta table in exactly one commit (append or upsert MERGE).

    The commit carries the rows, the batch's end offsets in ``userMetadata`` and the txn
    actions of :meth:`..offsets.BatchCommit.transactions`: ``(app_id, batch_id)``, the
    pipeline's fence ``seq`` and each partition's end offset (which Delta checkpoints keep, so
    the offsets survive log cleanup). Before any data file is written, on one snapshot:

    - replay (I2): delta-rs, unlike delta-spark, does not skip a write whose txn version is
      already recorded, so the sink checks ``transaction_version`` itself; a replayed batch
      writes nothing (not even a data file) and still counts as success;
    - fencing (I6): the pipeline's stored offsets must equal the batch's start offsets.

    The commit is made with no automatic retry, so it only lands if no one committed since
    that snapshot; on a lost race both checks run again on the new snapshot and the files
    already written are committed again (never written twice). Two runs of one pipeline
    therefore cannot both commit a batch, while other writers (OPTIMIZE, other pipelines)
    merely cost a retry. An upsert is a delta-rs MERGE with the same commit properties, so it
    is as atomic, idempotent and fenced as an append.
    """

    def __init__(
        self,
        table_uri: str,
        pipeline_id: str,
        storage_options: dict[str, str] | None = None,
        mode: WriteMode | None = None,
        spark_writes_files: bool = False,
    ) -> None:
        """``spark_writes_files``: append batches' files written by Spark's own Parquet writer
        where it can (:mod:`.jvm_writer`; config ``delta.file_writer: spark``), else by pyarrow
        in the tasks' Python workers."""
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.storage_options = dict(storage_options or {})
        self.mode = mode or WriteMode()
        # (version, this pipeline's newest offsets as of that version): spares re-reading the
        # log when nobody else committed since our own last commit.
        self._known: tuple[int, StoredOffsets | None] | None = None
        # Tests: route local tables through delta-rs's object store as remote ones are.
        self.write_via_delta_rs = False
        # Spark's own Parquet writer for the batches it can write (a local table), else pyarrow's.
        self.spark_writes_files = spark_writes_files
        # The table as last read (kept across batches), and its newest log entry as seen then:
        # (version, size, modification time) of _delta_log/<version>.json.
        self._open: DeltaTable | None = None
        self._mark: tuple[int, int, int | None] | None = None
        self._log_fs: tuple[pafs.FileSystem, str] | None = None
        # How often the table was read from scratch (tests: once per run, not per batch).
        self.opens = 0

    def columns(self) -> tuple[str, ...] | None:
        table = self._table()
        return None if table is None else tuple(f.name for f in table.schema().fields)

    def positions_held(
        self,
        table_uri: str,
        storage_options: dict[str, str] | None,
        dead: pa.Table,
        topic_ids: TopicIds = None,
    ) -> set[tuple[str, int, int]]:
        """As :meth:`kafka_delta.engine.Sink.positions_held`, for this sink's table (the
        dead-letter table), read with delta-rs: only the position columns, filtered."""
        table = open_table(table_uri, storage_options)
        if table is None or dead.num_rows == 0:
            return set()
        offsets = pa.array(sorted(set(dead.column("offset").to_pylist())), pa.int64())
        dataset = table.to_pyarrow_dataset()
        with_ids = TOPIC_ID in dataset.schema.names
        found = dataset.to_table(
            columns=[*POSITION, TOPIC_ID] if with_ids else POSITION,
            filter=pc.field("offset").isin(offsets),
        )
        return held_among(found.to_pylist(), dead, topic_ids)

    def _table(self) -> DeltaTable | None:
        """The table's latest snapshot, or None when there is no table.

        One ``DeltaTable`` serves every batch: ``update_incremental`` reads the commits since
        the last call and nothing else. It is called only when the commit file of the version
        after the table's exists (one file's metadata; Delta's versions are contiguous): on a
        local disk it lists the whole log folder (1.7 ms at 100 versions, 3.6 ms at 2,000), and
        a batch looks at the table three times (its check, its files' schema, its commit).

        It cannot see a table deleted, or deleted and created again (versions start over, the
        newer commits it would read are another table's): so the log entry of the version it
        stands on is checked first, one file's metadata, and when it is gone or changed the
        table is read afresh, as a new run would read it. A RESTORE, an
        OPTIMIZE or another writer's commit are commits like any other: read incrementally
        (:meth:`stored_offsets` finds a RESTORE in the history since)."""
        table = self._open
        if table is not None:
            if self._mark is not None and self._log_entry(self._mark[0]) == self._mark:
                if self._log_entry(table.version() + 1) is not None:  # commits since
                    table.update_incremental()
                    if table.version() != self._mark[0]:  # stand on the newest
                        self._mark = self._log_entry(table.version())
                return table
            log.info(
                "table %s was deleted or created again since version %s: reading it afresh",
                self.table_uri,
                self._mark[0] if self._mark is not None else "?",
            )
            # What this run knew of the old table's offsets is no truth of the new one's.
            self._known = None
        table = self._open = open_table(self.table_uri, self.storage_options)
        self.opens += 1
        if table is None:
            self._known, self._mark = None, None
        else:
            self._mark = self._log_entry(table.version())
        return table

    def _log_entry(self, version: int) -> tuple[int, int, int | None] | None:
        """(version, size, modification time) of the version's commit file; None without one."""
        if self._log_fs is None:
            self._log_fs = open_filesystem(self.table_uri, self.storage_options, create=False)
        fs, root = self._log_fs
        info = fs.get_file_info(join(root, "_delta_log", f"{version:020d}.json"))
        if info.type == pafs.FileType.NotFound:
            return None
        return version, info.size, info.mtime_ns

    def worker_modules(self) -> tuple[str, ...]:
        """The write task's (``mapInArrow`` of :class:`.file_writer.TaskWriter`)."""
        return (TaskWriter.__module__, "pyarrow.parquet")

    def materialize(self, out: DataFrame, split: bool = False) -> Materialized:
        """Always split (``split`` changes nothing). Append: ONE Spark job in which every task
        writes its rows as data files of the table and returns their metadata and the
        positions of its dead letters; neither the rows nor the dead letters' records come to
        the driver. The files stay invisible until :meth:`commit_batch` commits them. The
        pipeline calls this only once the batch passed :meth:`check`, so a replay or a fenced
        run writes no file.

        Upsert: delta-rs's MERGE takes its source in the driver process, so the batch is
        collected to the driver as Arrow, once, and split there."""
        if self.mode.kind == "upsert":
            rows, dead = split_dead_letters(out.toArrow())
            return Materialized(rows, dead)
        files, dead = self._write_frame(self._table(), out, DEAD_LETTER_COLUMN)
        return Materialized(files, dead, release=files.discard_unless_committed)

    # -- data files -------------------------------------------------------------------------

    def _schema_for(self, table: DeltaTable | None, rows: Rows | StructType) -> pa.Schema:
        """The Arrow schema the files are written in: the table's, once the batch is checked
        against it and the table against what plain appended files can honour; for a new
        table, the batch's own in Delta's types (``rows``: the batch, or its Spark schema)."""
        if isinstance(rows, DataFrame | StructType):
            from pyspark.sql.pandas.types import to_arrow_schema

            spark_schema = rows if isinstance(rows, StructType) else rows.schema
            # Any zone: zoned timestamps are stored in UTC whatever Spark labels them with.
            batch = delta_arrow_schema(to_arrow_schema(spark_schema, timezone="UTC"))
        else:
            batch = delta_arrow_schema(rows.schema)
        if table is None:
            return batch
        check_table_supported(table)
        schema = pa.schema(table.schema().to_arrow())
        if self.mode.add_columns:
            table, schema = self._widen_columns(table, batch, schema)
            schema = self._add_columns(table, batch, schema)
        check_batch_schema(batch, schema, self.table_uri)
        return schema

    def _widen_columns(
        self, table: DeltaTable, batch: pa.Schema, schema: pa.Schema, check: bool = True
    ) -> tuple[DeltaTable, pa.Schema]:
        """(the table, its schema) with each column the batch holds wider by a promotion of the
        producers' schema (int -> long, float -> double, an integer -> double: what a Schema
        Registry accepts, see :func:`kafka_delta.delta.schema.wider_arrow_type`) widened, by a
        commit of its own before the batch's files are written, like :meth:`_add_columns`.

        delta-rs 1.6.6 cannot widen a column in place: it has no type widening (it neither
        reads nor writes a table with Delta's ``typeWidening`` feature), and a schema commit
        alone would leave files whose Parquet type is not the column's. So the table is
        rewritten: ONE overwrite commit of every row cast to the wider types, on the snapshot
        read, with no retry: a commit that landed since (another writer's rows) makes it fail,
        and it is made again on the newer snapshot, so no row is lost. The txn actions, the
        table's id and properties are log state the overwrite keeps, and the rows keep their
        Kafka positions, so the stored offsets are as they were. Idempotent: once the column
        is wide a replayed or restarted batch finds nothing to widen. It costs a read and a
        write of the whole table, once per promotion (measured: docs/design.md). ``check``:
        the batch must otherwise fit the table first (an append; a MERGE's source is checked
        by the MERGE)."""
        from deltalake import write_deltalake

        widened: list[str] = []
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            wider = {
                f.name: t
                for f in schema
                if f.name in batch.names
                and (t := wider_arrow_type(f.type, batch.field(f.name).type)) is not None
            }
            if not wider:
                break  # nothing to widen, or another run widened it first
            target = pa.schema([f.with_type(wider.get(f.name, f.type)) for f in schema])
            # The rest of the batch must fit first: a batch refused for another column leaves
            # the table as it was.
            if check:  # with the columns and nested fields _add_columns adds next
                new = [f for f in batch if f.name not in target.names]
                added = [
                    f.with_type(with_nested_fields(f.type, batch.field(f.name).type))
                    if f.name in batch.names
                    else f
                    for f in target
                ]
                check_batch_schema(batch, pa.schema([*added, *new]), self.table_uri)
            rows = (b.cast(target) for b in table.to_pyarrow_dataset().to_batches())
            try:
                write_deltalake(
                    table,
                    pa.RecordBatchReader.from_batches(target, rows),
                    mode="overwrite",
                    schema_mode="overwrite",
                    commit_properties=CommitProperties(max_commit_retries=0),
                )
            except CommitFailedError as exc:
                log.info("widening lost a commit race (%s); again (attempt %d)", exc, attempt)
            else:
                widened = [f"{n} {schema.field(n).type} -> {t}" for n, t in wider.items()]
            table = self._table()
            assert table is not None
            schema = pa.schema(table.schema().to_arrow())
            if widened:
                break
        else:
            raise FencingError(
                f"widening columns of {self.table_uri} lost the commit race {_MAX_ATTEMPTS} "
                "times in a row; too many concurrent writers"
            )
        if not widened:
            return table, schema
        log.info(
            "table %s: column(s) %s widened as the producers' schema did (the table rewritten "
            "in one commit: delta-rs has no type widening)",
            self.table_uri,
            ", ".join(widened),
        )
        crash_points.reached("after_widen_columns")
        return table, schema

    def _add_columns(self, table: DeltaTable, batch: pa.Schema, schema: pa.Schema) -> pa.Schema:
        """The table's schema with the batch's new columns added (nullable), by a commit of
        its own before the batch's files are written: delta-rs's append commit cannot change
        the schema (its Metadata action is only written on overwrite). The commit is
        idempotent: a crash between it and the batch's commit leaves columns that the rerun
        finds in place, and rows written before read null in them. A column the table has
        and the batch lacks is left to :func:`check_batch_schema`.

        Fields new inside a column's structs (a producer added a field to a nested record, in
        a list's or a map's values too) are added the same way, by a commit of their own:
        delta-rs's ``alter.add_columns`` adds top-level columns only, so it is an append of no
        rows in the table's schema with the new nested fields (nullable), ``schema_mode="merge"``
        (a Metadata action and no file). Neither commit carries offsets or a txn: the batch's
        own commit, after them, still holds its rows, offsets and txn alone."""
        new = [f for f in batch if f.name not in schema.names]
        widened = pa.schema(
            [
                f.with_type(with_nested_fields(f.type, batch.field(f.name).type))
                if f.name in batch.names
                else f
                for f in schema
            ]
        )
        nested = [f for f, was in zip(widened, schema, strict=True) if f.type != was.type]
        if not new and not nested:
            return schema
        # The rest of the batch must fit first: a batch refused for another column leaves the
        # table's schema as it was.
        check_batch_schema(batch, pa.schema([*widened, *new]), self.table_uri)
        from deltalake import Field, write_deltalake

        if nested:
            write_deltalake(table, widened.empty_table(), mode="append", schema_mode="merge")
            log.info(
                "table %s: nested field(s) added to %s (delta.schema_evolution: add_columns)",
                self.table_uri,
                ", ".join(f"{f.name} {f.type}" for f in nested),
            )
        if new:
            table.alter.add_columns([Field.from_arrow(f.with_nullable(True)) for f in new])
            log.info(
                "table %s gains column(s) %s (delta.schema_evolution: add_columns)",
                self.table_uri,
                ", ".join(f"{f.name} {f.type}" for f in new),
            )
        crash_points.reached("after_add_columns")
        table.update_incremental()
        return pa.schema(table.schema().to_arrow())

    def _target(self, table: DeltaTable | None, schema: pa.Schema) -> FileTarget:
        stats_columns = DEFAULT_STATS_COLUMNS
        if table is not None:
            configured = table.metadata().configuration.get("delta.dataSkippingNumIndexedCols")
            stats_columns = int(configured) if configured else DEFAULT_STATS_COLUMNS
            if stats_columns < 0:  # -1: every column
                stats_columns = len(schema)
        return FileTarget(
            self.table_uri,
            schema,
            self.storage_options,
            stats_columns=stats_columns,
            via_delta_rs=self.write_via_delta_rs,
        )

    def _write_frame(
        self, table: DeltaTable | None, out: DataFrame, marks: str | None = None
    ) -> tuple[StagedFiles, pa.Table | None]:
        """Spark's tasks write ``out`` as data files of the table, in one job: (the files, the
        positions and errors of the rows column ``marks`` set aside as dead letters)."""
        # The batch's schema, asked of Spark once (each DataFrame operation is a py4j round
        # trip, and this runs every batch).
        out_schema = out.schema
        marks = marks if marks in out_schema.names else None
        written = StructType([f for f in out_schema.fields if f.name != marks])
        schema = self._schema_for(table, written)
        target = self._target(table, schema)
        plan = can_write(target, out_schema, marks) if self.spark_writes_files else None
        if plan is not None:
            written, dead = write_with_spark(out, target, plan)
            files = StagedFiles(schema, written, target)
            log.debug(
                "%d data file(s) of %d rows written to %s by Spark",
                len(files.adds),
                files.num_rows,
                self.table_uri,
            )
            crash_points.reached("after_data_files")
            if dead is not None:
                require_dead_letter_positions(out.columns)
            return files, dead
        writer = TaskWriter(target, marks)
        returned = out.mapInArrow(writer, from_arrow_schema(TASK_OUTPUT_SCHEMA)).toArrow()
        is_file = pc.is_valid(returned.column("path"))
        names = FILE_METADATA_SCHEMA.names
        files = StagedFiles(schema, returned.filter(is_file).select(names).to_pylist(), target)
        log.debug(
            "%d data file(s) of %d rows written to %s",
            len(files.adds),
            files.num_rows,
            self.table_uri,
        )
        crash_points.reached("after_data_files")
        marked = returned.filter(pc.invert(is_file))
        if marked.num_rows == 0:
            return files, None
        require_dead_letter_positions(out.columns)
        dead = marked.select([name for name, _ in DEAD_LETTER_FIELDS]).rename_columns(
            ["topic", "partition", "offset", DEAD_LETTER_COLUMN]
        )
        return files, dead

    def _write_files(self, table: DeltaTable | None, rows: Rows) -> StagedFiles:
        """Write the batch's data files: by Spark's tasks for a DataFrame, here for Arrow;
        files :meth:`materialize` already wrote are taken as they are."""
        if isinstance(rows, StagedFiles):
            rows.handed_to_commit = True
            return rows
        if isinstance(rows, DataFrame):
            return self._write_frame(table, rows)[0]
        schema = self._schema_for(table, rows)
        target = self._target(table, schema)
        files = StagedFiles(schema, write_files(rows.to_batches(), target), target)
        crash_points.reached("after_data_files")
        return files

    def _commit_files(
        self, table: DeltaTable | None, files: StagedFiles, properties: CommitProperties | None
    ) -> int:
        """Commit the written files in one commit on ``table``'s snapshot (creating the table
        when there is none); the new version. Raises ``CommitFailedError`` on a lost race."""
        if table is None:
            try:
                create_table_with_add_actions(
                    self.table_uri,
                    Schema.from_arrow(files.schema),
                    files.adds,
                    mode="error",
                    configuration=NEW_TABLE_CONFIGURATION,
                    storage_options=self.storage_options or None,
                    commit_properties=properties,
                )
            except DeltaError as exc:
                if self._table() is None:
                    raise
                # Another writer created the table first: a lost race like any other.
                raise CommitFailedError(f"the table was created concurrently: {exc}") from exc
            return 0
        # Appends never change the schema: the batch was checked against the table's.
        table.create_write_transaction(
            files.adds,
            "append",
            files.schema,
            commit_properties=properties,
            post_commithook_properties=BATCH_COMMIT_HOOKS,
        )
        # Without retries the commit can only land right on top of the snapshot it was made on.
        return table.version() + 1

    def _merge(self, table: DeltaTable, data: pa.Table, properties: CommitProperties) -> int:
        """One MERGE of the batch's latest change per key (:func:`kafka_delta.upsert.merge_clauses`:
        ``_op`` d deletes, anything else upserts, ``_op`` itself is not written)."""
        clauses = merge_clauses(self.mode, data.column_names)
        merger = table.merge(
            source=data,
            predicate=self.mode.merge_predicate(),
            merge_schema=self.mode.add_columns,
            source_alias="s",
            target_alias="t",
            commit_properties=properties,
            post_commithook_properties=BATCH_COMMIT_HOOKS,
        )
        if clauses.delete is not None:
            merger = merger.when_matched_delete(predicate=clauses.delete)
        but = list(clauses.except_cols) or None
        merger = merger.when_matched_update_all(predicate=clauses.update, except_cols=but)
        merger.when_not_matched_insert_all(predicate=clauses.insert, except_cols=but).execute()
        return table.version()

    # -- the checks -------------------------------------------------------------------------

    def stored_offsets(
        self, table: DeltaTable, commit: BatchCommit | None = None, start: Offsets | None = None
    ) -> StoredOffsets | None:
        """This pipeline's newest stored offsets as of ``table``'s snapshot (after log cleanup
        removed its commits, recomputed from the rows; ``commit`` and ``start`` name the
        partitions the batch reads)."""
        version = table.version()
        newer = (
            table.history(version - self._known[0])
            if self._known is not None and self._known[0] < version
            else []
        )
        # A RESTORE since the last read can undo our own commits: read the log afresh.
        restored = any(is_restore(e) for e in newer)
        if self._known is not None and self._known[0] <= version and not restored:
            found = newest_stored(newer, self.pipeline_id) if newer else None
            stored = found if found is not None else self._known[1]
        else:
            names = partitions_of(commit.end_offsets if commit else {}, start or {})
            stored = newest_stored_in(table, self.pipeline_id, lambda: names)
        self._known = (version, stored)
        return stored

    @staticmethod
    def _replayed(table: DeltaTable | None, commit: BatchCommit) -> int | None:
        """The txn version recorded for the batch's checkpoint when it covers the batch."""
        done = table.transaction_version(commit.app_id) if table is not None else None
        return done if done is not None and done >= commit.batch_id else None

    def check(
        self, commit: BatchCommit, start: Offsets | None = None, first_reads: Offsets | None = None
    ) -> bool:
        """True when the batch is already in the table (a replay); raises
        :class:`FencingError` when it does not start where the table ends. Writes nothing."""
        table = self._table()
        if self._replayed(table, commit) is not None:
            return True
        stored = self.stored_offsets(table, commit, start) if table is not None else None
        check_contiguous(stored, start, commit, first_reads)
        return False

    # -- committing -------------------------------------------------------------------------

    def commit_batch(
        self,
        rows: Rows,
        commit: BatchCommit,
        start: Offsets | None = None,
        first_reads: Offsets | None = None,
        *,
        expected_seq: int | None = None,
    ) -> SinkResult:
        """Commit ``rows`` (a DataFrame, written by Spark's tasks, or Arrow, written here) as
        batch ``commit``; ``start`` (the batch's start offsets) enables the fencing check;
        ``expected_seq`` (the dead-letter table's fence) lets it land only on top of that
        commit of the pipeline (:func:`..offsets.fencing.check_unmoved`): checked on every
        snapshot a commit is attempted on (the first time before any file is written), so a
        lost race (the table created, or committed to, by another run) is judged as afresh."""
        files = rows if isinstance(rows, StagedFiles) else None
        if files is not None:
            files.handed_to_commit = True
        merge_source: pa.Table | None = None
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            table = self._table()
            done = self._replayed(table, commit)
            if done is not None:
                log.info(
                    "batch %d of %s is already in the table (txn version %d): replay skipped",
                    commit.batch_id,
                    commit.app_id,
                    done,
                )
                return SinkResult(written=False, rows=0, delta_version=None)
            stored = self.stored_offsets(table, commit, start) if table is not None else None
            check_unmoved(stored, expected_seq, commit, self.table_uri)
            check_contiguous(stored, start, commit, first_reads)
            commit = commit.on_top_of(stored)
            properties = CommitProperties(
                app_transactions=[Transaction(a, v) for a, v in commit.transactions()],
                custom_metadata={"userMetadata": commit.user_metadata()},
                max_commit_retries=0,
            )
            try:
                written = rows
                if self.mode.kind == "upsert" and files is None:
                    if table is not None:
                        # MERGE needs its source in this process (delta-rs): collected once.
                        if merge_source is None:
                            merge_source = _arrow(rows)
                        if merge_source.num_rows:
                            if self.mode.add_columns:
                                table, _ = self._widen_columns(
                                    table,
                                    delta_arrow_schema(merge_source.schema),
                                    pa.schema(table.schema().to_arrow()),
                                    check=False,
                                )
                            version = self._merge(table, merge_source, properties)
                            rows_written = merge_source.num_rows
                            return self._committed(commit, version, rows_written)
                        written = merge_source  # an empty upsert still commits its offsets
                    # Appended (a first batch, no table yet): its deletes delete nothing, and
                    # `_op` is not a column of the table.
                    written = (
                        upserted_arrow(written)
                        if isinstance(written, pa.Table)
                        else upserted_frame(written)
                    )
                if files is None:
                    files = self._write_files(table, written)
                elif table is not None:
                    # Written for an older snapshot: still the table's schema?
                    check_table_supported(table)
                    now = pa.schema(table.schema().to_arrow())
                    check_batch_schema(files.schema, now, self.table_uri)
                    check_not_widened_since(files.schema, now, self.table_uri)
                version = self._commit_files(table, files, properties)
            except CommitFailedError as exc:
                log.info(
                    "batch %d: another commit landed first (%s); re-checking (attempt %d)",
                    commit.batch_id,
                    exc,
                    attempt,
                )
                continue
            return self._committed(commit, version, files.num_rows)
        raise FencingError(
            f"batch {commit.batch_id}: lost the commit race {_MAX_ATTEMPTS} times in a row on "
            f"{self.table_uri}; too many concurrent writers"
        )

    def _committed(self, commit: BatchCommit, version: int, rows: int) -> SinkResult:
        self._known = (
            version,
            StoredOffsets(
                commit.end_offsets,
                version,
                commit.app_id,
                commit.batch_id,
                commit.seq,
                topic_ids=commit.topic_ids,
            ),
        )
        log.debug(
            "batch %d committed at version %d: %s",
            commit.batch_id,
            version,
            offsets_to_json(commit.end_offsets),
        )
        return SinkResult(written=True, rows=rows, delta_version=version)


def _arrow(rows: Rows) -> pa.Table:
    return rows if isinstance(rows, pa.Table) else rows.toArrow()
