"""What the pipeline reads from Spark's checkpoint: each batch's planned end offsets and the
query id. Both engines' sources write the same offset JSON there.

Spark writes ``offsets/<batch_id>`` *before* the batch runs, so it is the authoritative plan of
``[start, end)``, for a replayed batch too. Reading it, rather than ``max(offset) + 1`` of the
data, keeps the end offsets right across gaps left by transaction markers and compaction. Its
format depends on ``spark.sql.streaming.offsetLog.formatVersion`` (Spark's ``OffsetSeqLog``):

    v1                          v2 (Spark 4.2: named sources, an ``OffsetMap``)
    {metadata JSON}             {metadata JSON}
    {offset JSON of source 0}   0:{offset JSON of source "0"}   (sourceId, first ":", offset)
    ...                         ...

``-`` instead of an offset means the source has none. A checkpoint keeps the version it was
created with, so both occur side by side on one cluster.

A local path (or ``file:``, or a FUSE mount such as ``/Volumes/...`` or ``/dbfs/...`` on
Databricks) is read directly; any other URI (``s3://``, ``abfss://``, ``dbfs:/``) through Spark
itself, so the checkpoint may live wherever Spark can write it.
"""

from __future__ import annotations

import json

from pyspark.sql import SparkSession

from kafka_delta.delta.locations import local_path
from kafka_delta.offsets.model import Offsets, offsets_from_json

# First line of an ``offsets/<batch_id>`` file: the formats this module reads.
_OFFSET_LOG_VERSIONS = frozenset({"v1", "v2"})


class CheckpointMismatchError(RuntimeError):
    """The Spark checkpoint and the Delta table disagree in a way that would lose data."""


class CheckpointLog:
    """Read-only view of one streaming checkpoint."""

    def __init__(self, spark: SparkSession | None, location: str, lazy_spark: bool = False) -> None:
        """``spark`` may be None for a local checkpoint (tools and tests reading one), or,
        with ``lazy_spark``, until the caller sets it (the batch function under Spark
        Connect, which gets its session with its first batch)."""
        self.spark = spark
        self.location = location.rstrip("/")
        self._local = local_path(self.location)
        if self._local is None and spark is None and not lazy_spark:
            raise ValueError(f"reading checkpoint {location!r} needs a Spark session")

    def _read(self, relative: str) -> str | None:
        """The whole text of a checkpoint file, or None when it does not exist."""
        if self._local is not None:
            path = self._local / relative
            return path.read_text(encoding="utf-8") if path.is_file() else None
        assert self.spark is not None
        try:
            rows = self.spark.read.text(f"{self.location}/{relative}", wholetext=True).collect()
        except Exception as exc:  # AnalysisException [PATH_NOT_FOUND] and its Connect twin
            if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
                return None
            raise
        return rows[0][0] if rows else None

    def end_offsets(self, batch_id: int) -> Offsets:
        """End offsets Spark planned for ``batch_id`` (``{topic: {partition: next offset}}``)."""
        return offsets_from_json(json.loads(self.source_offset_json(batch_id)))

    def source_offset_json(self, batch_id: int) -> str:
        """The offset JSON text Spark planned for ``batch_id`` of the query's one source, as
        written in ``offsets/<batch_id>`` in either offset log format (v1 or v2)."""
        where = f"{self.location}/offsets/{batch_id}"
        text = self._read(f"offsets/{batch_id}")
        if text is None:
            raise CheckpointMismatchError(
                f"checkpoint {self.location} has no offset log entry for batch {batch_id}"
            )
        version, *rest = text.splitlines() or [""]
        if version.strip() not in _OFFSET_LOG_VERSIONS:
            raise CheckpointMismatchError(
                f"offset log entry {where} has format version {version.strip()[:20]!r}; this "
                f"pipeline reads {' and '.join(sorted(_OFFSET_LOG_VERSIONS))} (Spark's "
                "spark.sql.streaming.offsetLog.formatVersion 1 and 2)"
            )
        sources = [line for line in rest[1:] if line.strip()]
        if version.strip() == "v2":
            # One "sourceId:offset" line per source; Spark splits at the first colon.
            named = [line.partition(":") for line in sources]
            if any(not sep for _, sep, _ in named):
                raise CheckpointMismatchError(f"offset log entry {where} is not a v2 entry")
            sources = [offset for _, _, offset in named]
        if len(sources) != 1:
            raise CheckpointMismatchError(
                f"offset log entry {where} has {len(sources)} source offsets; the pipeline "
                "reads exactly one source"
            )
        if sources[0].strip() == "-":
            raise CheckpointMismatchError(f"offset log entry {where} has no offset for its source")
        return sources[0]

    def newest_planned(self) -> int | None:
        """The newest batch id Spark planned (``offsets/``), or None before the first plan."""
        batches = self._batch_ids("offsets")
        return max(batches) if batches else None

    def is_committed(self, batch_id: int) -> bool:
        """True when Spark recorded ``batch_id`` as completed (``commits/<batch_id>``)."""
        return batch_id in self._batch_ids("commits")

    def resume_position(self) -> tuple[int, bool, Offsets | None]:
        """(newest planned batch, whether Spark committed it, where the checkpoint resumes: that
        batch's end when committed, else its start; None when the start is not recorded). Only
        once Spark planned a batch (:meth:`has_plan`)."""
        planned = self.newest_planned()
        assert planned is not None
        if self.is_committed(planned):
            return planned, True, self.end_offsets(planned)
        if planned > 0:
            return planned, False, self.end_offsets(planned - 1)
        return planned, False, self.initial_offsets()

    def query_id(self) -> str | None:
        """The query id stored in the checkpoint's ``metadata`` file (None before the first
        start): stable across restarts of this checkpoint, new for a new one."""
        text = self._read("metadata")
        if not text:
            return None
        return str(json.loads(text.splitlines()[0])["id"])

    def has_progress(self) -> bool:
        """True once Spark recorded at least one completed batch in ``commits/``."""
        return self._has_entries("commits")

    def has_plan(self) -> bool:
        """True once Spark planned a batch (``offsets/``): from then on it ignores a source's
        starting offsets, even before the batch completes."""
        return self._has_entries("offsets")

    def initial_offsets(self) -> Offsets | None:
        """The initial offsets Spark's kafka source persisted for this checkpoint
        (``sources/0/0``: a zero byte, a version line, the offsets JSON), or None (another
        source, or nothing persisted yet). They are batch 0's real start: a restart re-plays
        batch 0 from them, whatever the table holds by then."""
        text = self._read("sources/0/0")
        if not text:
            return None
        lines = text.lstrip("\x00").splitlines()
        if len(lines) < 2 or not lines[0].startswith("v"):
            raise CheckpointMismatchError(
                f"{self.location}/sources/0/0 is not an initial-offsets file of Spark's kafka "
                "source"
            )
        return offsets_from_json(json.loads("\n".join(lines[1:])))

    def _has_entries(self, folder: str) -> bool:
        """True when ``folder`` of the checkpoint holds at least one batch file."""
        return bool(self._batch_ids(folder))

    def _batch_ids(self, folder: str) -> list[int]:
        """The batch ids of the files in ``folder`` of the checkpoint."""
        if self._local is not None:
            entries = self._local / folder
            if not entries.is_dir():
                return []
            return [int(p.name) for p in entries.iterdir() if p.name.isdigit()]
        assert self.spark is not None
        try:
            files = self.spark.read.format("binaryFile").load(f"{self.location}/{folder}")
            names = [row.path.rsplit("/", 1)[-1] for row in files.select("path").collect()]
            return [int(name) for name in names if name.isdigit()]
        except Exception as exc:
            if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
                return []
            raise
