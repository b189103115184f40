"""Delta sink on delta-rs: one commit per micro-batch holding data, txn and end offsets."""

from __future__ import annotations

import logging

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError
from pyspark.sql import DataFrame

from ..engine import (
    FencingError,
    Materialized,
    Rows,
    SinkResult,
    WriteMode,
    check_contiguous,
    split_dead_letters,
)
from ..offsets import (
    BatchCommit,
    Offsets,
    StoredOffsets,
    newest_stored,
    offsets_to_json,
    partitions_of,
)
from .offset_store import newest_stored_in, open_table

__all__ = ["DeltaRsSink", "FencingError", "SinkResult", "check_contiguous"]

log = logging.getLogger(__name__)

# A lost commit race is retried this often before giving up (each retry re-checks the table).
_MAX_ATTEMPTS = 10


class DeltaRsSink:
    """Writes each batch to a Delta table in exactly one commit (append or upsert MERGE).

    The commit carries the rows, the batch's end offsets in ``userMetadata`` and the txn
    actions of :meth:`..offsets.BatchCommit.transactions`: ``(app_id, batch_id)``, the
    pipeline's fence ``seq`` and each partition's end offset (which Delta checkpoints keep, so
    the offsets survive log cleanup). Before committing, on one snapshot of the table:

    - replay (I2): delta-rs, unlike delta-spark, does not skip a write whose txn version is
      already recorded, so the sink checks ``transaction_version`` itself; a replayed batch
      writes nothing and still counts as success;
    - fencing (I6): the pipeline's stored offsets must equal the batch's start offsets.

    The commit is made with no automatic retry, so it only lands if no one committed since
    that snapshot; on a lost race both checks run again on the new snapshot. Two runs of one
    pipeline therefore cannot both commit a batch, while other writers (OPTIMIZE, other
    pipelines) merely cost a retry. An upsert is a delta-rs MERGE with the same commit
    properties, so it is as atomic, idempotent and fenced as an append.
    """

    def __init__(
        self,
        table_uri: str,
        pipeline_id: str,
        storage_options: dict[str, str] | None = None,
        mode: WriteMode | None = None,
    ) -> None:
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.storage_options = dict(storage_options or {})
        self.mode = mode or WriteMode()
        # (version, this pipeline's newest offsets as of that version): spares re-reading the
        # log when nobody else committed since our own last commit.
        self._known: tuple[int, StoredOffsets | None] | None = None

    def _table(self) -> DeltaTable | None:
        return open_table(self.table_uri, self.storage_options)

    def materialize(self, out: DataFrame) -> Materialized:
        """One ``toArrow`` of the batch to the driver, split in Arrow (no second Spark job)."""
        rows, dead = split_dead_letters(out.toArrow())
        return Materialized(rows, dead)

    def _append(
        self, table: DeltaTable | None, data: pa.Table, properties: CommitProperties | None
    ) -> int:
        """Append ``data`` in one commit (creating the table if needed); the new version."""
        write_deltalake(
            table if table is not None else self.table_uri,
            data,
            mode="append",
            storage_options=self.storage_options or None,
            commit_properties=properties,
        )
        written = table if table is not None else self._table()
        assert written is not None
        return written.version()

    def _write(self, table: DeltaTable | None, data: pa.Table, properties: CommitProperties) -> int:
        """Apply the batch in one commit as the mode says; the new version."""
        # An upsert's first batch (nothing to merge into) is an append, and so is an empty one:
        # a MERGE without source rows may commit nothing, and the offsets must still advance.
        if self.mode.kind != "upsert" or table is None or data.num_rows == 0:
            return self._append(table, data, properties)
        merger = table.merge(
            source=data,
            predicate=self.mode.merge_predicate(),
            source_alias="s",
            target_alias="t",
            commit_properties=properties,
        )
        merger = merger.when_matched_update_all(predicate=self.mode.update_predicate())
        merger.when_not_matched_insert_all().execute()
        return table.version()

    def stored_offsets(
        self, table: DeltaTable, commit: BatchCommit | None = None, start: Offsets | None = None
    ) -> StoredOffsets | None:
        """This pipeline's newest stored offsets as of ``table``'s snapshot (after log cleanup,
        from the txn actions of the partitions ``commit`` and ``start`` name)."""
        version = table.version()
        if self._known is not None and self._known[0] <= version:
            known_version, known = self._known
            newer = (
                newest_stored(table.history(version - known_version), self.pipeline_id)
                if version > known_version
                else None
            )
            stored = newer if newer is not None else known
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

    def check(self, commit: BatchCommit, start: Offsets | None = None) -> bool:
        """True when the batch is already in the table (a replay); raises
        :class:`FencingError` when it does not start where the table ends. Writes nothing."""
        table = self._table()
        if self._replayed(table, commit) is not None:
            return True
        stored = self.stored_offsets(table, commit, start) if table is not None else None
        check_contiguous(stored, start, commit)
        return False

    def append_unprotected(self, rows: Rows) -> SinkResult:
        """Plain append: no txn, no offsets, no fencing. Only for measuring what the
        exactly-once machinery costs (scripts/bench); a pipeline never uses it."""
        data = _arrow(rows)
        version = self._append(self._table(), data, None)
        return SinkResult(written=True, rows=data.num_rows, delta_version=version)

    def commit_batch(
        self, rows: Rows, commit: BatchCommit, start: Offsets | None = None
    ) -> SinkResult:
        """Commit ``rows`` as batch ``commit``; ``start`` (the batch's start offsets) enables
        the fencing check."""
        data = _arrow(rows)
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
            check_contiguous(stored, start, commit)
            commit = commit.on_top_of(stored)
            properties = CommitProperties(
                app_transactions=[Transaction(a, v) for a, v in commit.transactions()],
                custom_metadata={"userMetadata": commit.user_metadata()},
                max_commit_retries=0,
            )
            try:
                version = self._write(table, data, properties)
            except CommitFailedError as exc:
                log.info(
                    "batch %d: another commit landed first (%s); re-checking (attempt %d)",
                    commit.batch_id,
                    exc,
                    attempt,
                )
                continue
            self._known = (
                version,
                StoredOffsets(
                    commit.end_offsets, version, commit.app_id, commit.batch_id, commit.seq
                ),
            )
            log.debug(
                "batch %d committed at version %d: %s",
                commit.batch_id,
                version,
                offsets_to_json(commit.end_offsets),
            )
            return SinkResult(written=True, rows=data.num_rows, delta_version=version)
        raise FencingError(
            f"batch {commit.batch_id}: lost the commit race {_MAX_ATTEMPTS} times in a row on "
            f"{self.table_uri}; too many concurrent writers"
        )


def _arrow(rows: Rows) -> pa.Table:
    return rows if isinstance(rows, pa.Table) else rows.toArrow()
