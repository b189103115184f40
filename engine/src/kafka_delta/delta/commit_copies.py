"""Copies of the delta-spark sink's commit records beside the checkpoint, so that Delta log
cleanup cannot take everything the pipeline recorded.

Why they exist
--------------
The offsets ride in each commit's ``userMetadata`` (:mod:`kafka_delta.offsets.model`). Delta
checkpoints do not keep ``commitInfo``, and log cleanup deletes JSON commits older than
``delta.logRetentionDuration``: a pipeline idle that long while other writers committed finds no
commit of its own in the log. delta-spark's writer carries exactly ONE txn per commit (the
fence), and Spark has no reader of txn actions at all.

So after every commit it has confirmed as its own, the delta-spark sink writes that commit's
record (the very ``userMetadata`` JSON, its Delta version and the table it was made on) to
``<checkpoint>.kafka_delta/<pipeline_id>/commits/<table key>/<seq>.json`` (the side folder,
:mod:`kafka_delta.delta.side_folder`: never the table's folder, which is Spark's alone on Unity
Catalog): written to a temporary name and moved (a crash never leaves half a copy under its
name), and written again at start-up from the log's own commit when a crash came between the
commit and the copy. ``<table key>`` is a digest of the table's location (a name or a path), so
the tables of one pipeline (``tables:``, one checkpoint) keep their copies apart.

What a copy is worth
--------------------
A hint, never the truth about offsets: a Delta RESTORE reverts no copy, so once log cleanup
removed the RESTORE's own commit, the newest copy may be of a batch the table no longer holds.
After cleanup the offsets are therefore recomputed from the rows the table holds
(:func:`kafka_delta.offsets.stored.from_the_rows`); the newest copy lends its topic ids (a topic
deleted and created again is still recognised) and the offsets it names past the rows (the run
says so rather than reading them again silently). A copy of another pipeline, another table or
a damaged file is ignored, never trusted.

The files go through pyarrow (:func:`kafka_delta.delta.side_folder.open_side`): the driver
reaches the checkpoint's location as files (a Unity Catalog volume on Databricks), never
through delta-rs nor Spark's JVM (neither exists on the cluster path under Spark Connect).
"""

from __future__ import annotations

import json
import logging
import uuid

import pyarrow.fs as pafs

from kafka_delta.delta import side_folder
from kafka_delta.delta.side_folder import table_key
from kafka_delta.offsets.model import StoredOffsets, parse_user_metadata

log = logging.getLogger(__name__)

# Copies older than this many commits of the pipeline are deleted; only the newest is ever
# read, the others serve whoever inspects them.
KEEP = 100


def parse_copy(text: str, pipeline_id: str, table: str | None = None) -> StoredOffsets | None:
    """The stored offsets a copy holds; None when it is no copy of a commit of
    ``pipeline_id`` on ``table`` (a foreign or damaged file is ignored, never trusted)."""
    try:
        body = json.loads(text)
        record = parse_user_metadata(body["userMetadata"], pipeline_id)
        version = int(body["delta_version"])
    except (ValueError, KeyError, TypeError):
        return None
    if record is None or (table is not None and body.get("table", table) != table):
        return None
    return StoredOffsets(
        record.end_offsets,
        version,
        record.app_id,
        record.batch_id,
        record.seq,
        expired=True,
        reset=record.reset,
        topic_ids=record.topic_ids,
    )


class CommitCopies:
    """The copies of one pipeline's commits on one table (see the module docstring)."""

    def __init__(
        self,
        table: str,
        checkpoint: str,
        pipeline_id: str,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.table = table
        self.pipeline_id = pipeline_id
        self.location = side_folder.side_location("delta_spark", table, checkpoint)
        self.storage_options = dict(storage_options or {})
        self._opened: tuple[pafs.FileSystem, str] | None = None

    def _folder(self) -> tuple[pafs.FileSystem, str]:
        if self._opened is None:
            filesystem, root = side_folder.open_side(self.location, self.storage_options)
            self._opened = filesystem, f"{root}/{self.pipeline_id}/commits/{table_key(self.table)}"
        return self._opened

    def write(self, seq: int, user_metadata: str, delta_version: int) -> None:
        """Keep a copy of the pipeline's commit ``seq``: its ``userMetadata`` as committed at
        ``delta_version``. Idempotent."""
        body = json.dumps(
            {"delta_version": delta_version, "table": self.table, "userMetadata": user_metadata},
            separators=(",", ":"),
        ).encode()
        filesystem, folder = self._folder()
        filesystem.create_dir(folder, recursive=True)
        temporary = f"{folder}/.{seq}.{uuid.uuid4().hex}.tmp"
        with filesystem.open_output_stream(temporary) as stream:
            stream.write(body)
        filesystem.move(temporary, f"{folder}/{seq}.json")
        if seq % KEEP == 0:
            self._prune(seq - KEEP)

    def _seqs(self) -> list[int]:
        filesystem, folder = self._folder()
        try:
            infos = filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        except OSError as exc:  # a hint: none to be had is no failure
            log.warning("cannot list the commit copies in %s: %s", folder, exc)
            return []
        stems = (i.base_name.removesuffix(".json") for i in infos if i.base_name.endswith(".json"))
        return sorted(int(stem) for stem in stems if stem.isdigit())

    def _read(self, seq: int) -> StoredOffsets | None:
        filesystem, folder = self._folder()
        try:
            with filesystem.open_input_stream(f"{folder}/{seq}.json") as stream:
                text = stream.read().decode("utf-8")
        except (FileNotFoundError, OSError):
            return None
        copy = parse_copy(text, self.pipeline_id, self.table)
        return copy if copy is not None and copy.seq == seq else None

    def read(self, seq: int | None = None) -> StoredOffsets | None:
        """The newest copy of a commit numbered ``seq`` or lower (any, when None); None when
        there is none. Lower too: after log cleanup the fence's seq is known only as a bound
        (:class:`.spark_offset_store.DeltaSparkLog`), and the copy of the newest commit the
        pipeline confirmed is the hint wanted."""
        for found in reversed(self._seqs()):
            if seq is None or found <= seq:
                copy = self._read(found)
                if copy is not None:
                    return copy
        return None

    def ensure(self, stored: StoredOffsets) -> None:
        """Write the copy of the commit ``stored`` was read from, when a crash between that
        commit and its copy left none (at start-up, while the log still holds the commit)."""
        if stored.user_metadata is None or stored.delta_version is None:
            return  # not read from a commit in the log
        if self._read(stored.seq) is not None:
            return
        log.info("keeping the copy of commit %d of pipeline %r", stored.seq, self.pipeline_id)
        self.write(stored.seq, stored.user_metadata, stored.delta_version)

    def _prune(self, below: int) -> None:
        filesystem, folder = self._folder()
        for seq in self._seqs():
            if seq < below:
                filesystem.delete_file(f"{folder}/{seq}.json")
