"""Reads the pipeline's newest stored offsets back from the Delta log (delta-rs)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from ..offsets import StoredOffsets, newest_stored_paged, stored_from_transactions

Partitions = Callable[[], Mapping[str, list[int]]]
"""Lazily lists the subscribed partitions (a Kafka metadata query, made only when needed)."""


def open_table(table_uri: str, storage_options: dict[str, str] | None) -> DeltaTable | None:
    """The table's latest snapshot, or None when there is no table yet."""
    try:
        return DeltaTable(table_uri, storage_options=storage_options or None)
    except TableNotFoundError:
        return None


def newest_stored_in(
    table: DeltaTable, pipeline_id: str, partitions: Partitions | None = None
) -> StoredOffsets | None:
    """Offsets of the newest commit tagged with ``pipeline_id`` in ``table``'s snapshot; when
    log cleanup removed every such commit, the offsets kept as txn actions for ``partitions``
    (see :mod:`..offsets`); None when the pipeline never committed to the table."""
    stored = newest_stored_paged(table.history, pipeline_id)
    if stored is not None or partitions is None:
        return stored
    return stored_from_transactions(table.transaction_version, pipeline_id, partitions())


class DeltaRsOffsetStore:
    def __init__(
        self, table_uri: str, pipeline_id: str, storage_options: dict[str, str] | None = None
    ) -> None:
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.storage_options = dict(storage_options or {})

    def read(self, partitions: Partitions | None = None) -> StoredOffsets | None:
        """Offsets of the newest commit tagged with this pipeline id (or, after log cleanup,
        of its txn actions for ``partitions``), or None (no table, or no commit of this
        pipeline)."""
        table = open_table(self.table_uri, self.storage_options)
        return None if table is None else newest_stored_in(table, self.pipeline_id, partitions)
