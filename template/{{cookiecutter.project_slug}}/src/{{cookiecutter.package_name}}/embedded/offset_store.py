"""Reads the pipeline's newest stored offsets back from the Delta log (delta-rs)."""

from __future__ import annotations

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from ..offsets import StoredOffsets, newest_stored

# History is read newest first in growing pages: the pipeline's own commit is normally the
# newest, but other writers and maintenance (OPTIMIZE, VACUUM) may have committed since.
_PAGES = (20, 500, None)


class DeltaRsOffsetStore:
    def __init__(
        self, table_uri: str, pipeline_id: str, storage_options: dict[str, str] | None = None
    ) -> None:
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.storage_options = dict(storage_options or {})

    def read(self) -> StoredOffsets | None:
        """Offsets of the newest commit tagged with this pipeline id, or None (no table, or no
        commit of this pipeline in the retained log)."""
        try:
            table = DeltaTable(self.table_uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None
        for limit in _PAGES:
            history = table.history(limit)
            stored = newest_stored(history, self.pipeline_id)
            if stored is not None or limit is None or len(history) < limit:
                return stored
        return None
