"""Delta sink on delta-rs: one commit per micro-batch holding data, txn and end offsets."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from ..offsets import BatchCommit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkResult:
    """Outcome of one batch: ``delta_version`` is the commit that holds it (None when replayed)."""

    written: bool
    rows: int
    delta_version: int | None


class DeltaRsSink:
    """Appends each batch to a Delta table in exactly one commit.

    The commit carries the rows, a ``txn`` action ``(app_id, batch_id)`` and the batch's end
    offsets in ``userMetadata``. delta-rs, unlike delta-spark, does not skip a write whose txn
    version is already recorded, so the sink checks ``transaction_version`` itself first; a
    replayed batch then writes nothing and still counts as success (I2).
    """

    def __init__(self, table_uri: str, storage_options: dict[str, str] | None = None) -> None:
        self.table_uri = table_uri
        self.storage_options = dict(storage_options or {})

    def _table(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.table_uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None

    def committed_version(self, app_id: str) -> int | None:
        """Highest batch id recorded for ``app_id``, or None."""
        table = self._table()
        return None if table is None else table.transaction_version(app_id)

    def commit_batch(self, data: pa.Table, commit: BatchCommit) -> SinkResult:
        table = self._table()
        if table is not None:
            done = table.transaction_version(commit.app_id)
            if done is not None and done >= commit.batch_id:
                log.info(
                    "batch %d of %s is already in the table (txn version %d): replay skipped",
                    commit.batch_id,
                    commit.app_id,
                    done,
                )
                return SinkResult(written=False, rows=0, delta_version=None)
        write_deltalake(
            table if table is not None else self.table_uri,
            data,
            mode="append",
            storage_options=self.storage_options or None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(commit.app_id, commit.batch_id)],
                custom_metadata={"userMetadata": commit.user_metadata()},
            ),
        )
        version = DeltaTable(self.table_uri, storage_options=self.storage_options or None).version()
        return SinkResult(written=True, rows=data.num_rows, delta_version=version)
