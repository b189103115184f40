"""Delta sink on delta-rs: one commit per micro-batch holding data, txn and end offsets."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from ..offsets import BatchCommit, Offsets, StoredOffsets, newest_stored, offsets_to_json
from .offset_store import newest_stored_in, open_table

log = logging.getLogger(__name__)

# A lost commit race is retried this often before giving up (each retry re-checks the table).
_MAX_ATTEMPTS = 10


class FencingError(RuntimeError):
    """The table's stored offsets are not where this batch starts: another run of the same
    pipeline committed in between (or the table was restored). Committing would duplicate or
    skip records, so this run stops."""


@dataclass(frozen=True)
class SinkResult:
    """Outcome of one batch: ``delta_version`` is the commit that holds it (None when replayed)."""

    written: bool
    rows: int
    delta_version: int | None


def check_contiguous(
    stored: StoredOffsets | None, start: Offsets | None, commit: BatchCommit
) -> None:
    """Raise :class:`FencingError` unless the batch starts exactly where the table ends.

    ``start`` None skips the check; ``{}`` means the table must hold no offsets of this
    pipeline yet (first batch of a first run). Only partitions present on both sides are
    compared: a partition added to a topic, or a topic added to the subscription, has no
    stored offset yet, and a topic dropped from the subscription keeps its old one.
    """
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
        problem = (
            f"{detail or 'the table already holds offsets'} (written by {stored.app_id} batch "
            f"{stored.batch_id} at Delta version {stored.delta_version})"
        )
    raise FencingError(
        f"batch {commit.batch_id} of pipeline {commit.pipeline_id!r} does not start where the "
        f"table ends: {problem}. Another run of this pipeline is writing to the same table, or "
        "the table was restored to another point; this run stops without committing, so "
        "nothing is duplicated or skipped."
    )


class DeltaRsSink:
    """Appends each batch to a Delta table in exactly one commit.

    The commit carries the rows, a ``txn`` action ``(app_id, batch_id)`` and the batch's end
    offsets in ``userMetadata``. Before committing, on one snapshot of the table:

    - replay (I2): delta-rs, unlike delta-spark, does not skip a write whose txn version is
      already recorded, so the sink checks ``transaction_version`` itself; a replayed batch
      writes nothing and still counts as success;
    - fencing (I6): the pipeline's stored offsets must equal the batch's start offsets.

    The commit is made with no automatic retry, so it only lands if no one committed since
    that snapshot; on a lost race both checks run again on the new snapshot. Two runs of one
    pipeline therefore cannot both commit a batch, while other writers (OPTIMIZE, other
    pipelines) merely cost a retry.
    """

    def __init__(
        self,
        table_uri: str,
        pipeline_id: str,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.storage_options = dict(storage_options or {})
        # (version, this pipeline's newest offsets as of that version): spares re-reading the
        # log when nobody else committed since our own last commit.
        self._known: tuple[int, StoredOffsets | None] | None = None

    def _table(self) -> DeltaTable | None:
        return open_table(self.table_uri, self.storage_options)

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

    def stored_offsets(self, table: DeltaTable) -> StoredOffsets | None:
        """This pipeline's newest stored offsets as of ``table``'s snapshot."""
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
            stored = newest_stored_in(table, self.pipeline_id)
        self._known = (version, stored)
        return stored

    def append_unprotected(self, data: pa.Table) -> SinkResult:
        """Plain append: no txn, no offsets, no fencing. Only for measuring what the
        exactly-once machinery costs (scripts/bench); a pipeline never uses it."""
        version = self._append(self._table(), data, None)
        return SinkResult(written=True, rows=data.num_rows, delta_version=version)

    def commit_batch(
        self, data: pa.Table, commit: BatchCommit, start: Offsets | None = None
    ) -> SinkResult:
        """Commit ``data`` as batch ``commit``; ``start`` (the batch's start offsets) enables
        the fencing check."""
        properties = CommitProperties(
            app_transactions=[Transaction(commit.app_id, commit.batch_id)],
            custom_metadata={"userMetadata": commit.user_metadata()},
            max_commit_retries=0,
        )
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            table = self._table()
            done = table.transaction_version(commit.app_id) if table is not None else None
            if done is not None and done >= commit.batch_id:
                log.info(
                    "batch %d of %s is already in the table (txn version %d): replay skipped",
                    commit.batch_id,
                    commit.app_id,
                    done,
                )
                return SinkResult(written=False, rows=0, delta_version=None)
            stored = self.stored_offsets(table) if table is not None else None
            check_contiguous(stored, start, commit)
            try:
                version = self._append(table, data, properties)
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
                StoredOffsets(commit.end_offsets, version, commit.app_id, commit.batch_id),
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
