"""The pipeline's stored offsets in a table read with delta-rs (tables of either sink), and the
table opened with delta-rs (:func:`open_table`) for the delta-rs sink, its offset store and the
commands on its tables. The embedded engine's alone: the cluster path never imports this module
(I14)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from kafka_delta.offsets.model import StoredOffsets
from kafka_delta.offsets.stored import Partitions, newest_commit_version, read_stored

# The columns that say where a row came from in Kafka (the transform keeps them).
POSITION = ("topic", "partition", "offset")


def open_table(table_uri: str, storage_options: dict[str, str] | None) -> DeltaTable | None:
    """The table's latest snapshot, or None when there is no table yet."""
    try:
        return DeltaTable(table_uri, storage_options=storage_options or None)
    except TableNotFoundError:
        return None


class DeltaRsLog:
    """A table's log as :func:`kafka_delta.offsets.stored.read_stored` reads it, through one
    delta-rs snapshot; ``copies(seq)`` reads the copy of a delta-spark commit record, when the
    caller can (see :mod:`kafka_delta.delta.commit_copies`)."""

    def __init__(
        self,
        table: DeltaTable,
        copies: Callable[[int], StoredOffsets | None] | None = None,
    ) -> None:
        self.table = table
        self._copies = copies

    def history(self, limit: int | None) -> Sequence[Mapping[str, object]]:
        return self.table.history(limit)

    def transaction_version(self, app_id: str) -> int | None:
        return self.table.transaction_version(app_id)

    def commit_copy(self, seq: int) -> StoredOffsets | None:
        return self._copies(seq) if self._copies is not None else None

    def row_positions(
        self, topics: Collection[str] | None = None
    ) -> dict[tuple[str, int], int] | None:
        names = set(pa.schema(self.table.schema().to_arrow()).names)
        if not set(POSITION) <= names:
            return None
        wanted = None if topics is None else pc.field("topic").isin(sorted(topics))
        rows = self.table.to_pyarrow_dataset().to_table(columns=list(POSITION), filter=wanted)
        highest = rows.group_by(["topic", "partition"]).aggregate([("offset", "max")])
        return {
            (t, int(p)): int(o)
            for t, p, o in zip(
                highest["topic"].to_pylist(),
                highest["partition"].to_pylist(),
                highest["offset_max"].to_pylist(),
                strict=True,
            )
            if t is not None and p is not None and o is not None
        }


def newest_stored_in(
    table: DeltaTable, pipeline_id: str, partitions: Partitions | None = None
) -> StoredOffsets | None:
    """This pipeline's stored offsets in ``table``'s snapshot (read by
    :mod:`kafka_delta.offsets.stored`)."""
    return read_stored(DeltaRsLog(table), pipeline_id, partitions)


class DeltaRsOffsetStore:
    def __init__(
        self, table_uri: str, pipeline_id: str, storage_options: dict[str, str] | None = None
    ) -> None:
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.storage_options = dict(storage_options or {})

    def read(self, partitions: Partitions | None = None) -> StoredOffsets | None:
        """This pipeline's stored offsets, or None (no table, or no commit of this pipeline)."""
        table = open_table(self.table_uri, self.storage_options)
        return None if table is None else newest_stored_in(table, self.pipeline_id, partitions)

    def commit_version(self, app_id: str) -> int | None:
        """The Delta version of the newest commit ``app_id`` (one checkpoint) made here."""
        table = open_table(self.table_uri, self.storage_options)
        if table is None:
            return None
        return newest_commit_version(table.history, self.pipeline_id, app_id)
