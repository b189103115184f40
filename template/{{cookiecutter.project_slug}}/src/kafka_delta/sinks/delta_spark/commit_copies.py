"""Copies of the delta-spark sink's commit records beside the table, so that Delta log cleanup
cannot take the pipeline's offsets.

Why they exist
--------------
The offsets ride in each commit's ``userMetadata`` (:mod:`kafka_delta.offsets.model`). Delta
checkpoints do not keep ``commitInfo``, and log cleanup deletes JSON commits older than
``delta.logRetentionDuration``: a pipeline idle that long while other writers committed finds no
commit of its own in the log. delta-spark's writer (options and session confs alike) carries
exactly ONE txn per commit, the pipeline's fence ``txn(<pipeline>:fence, seq)``: after cleanup
the Delta checkpoint still says *which* commit of the pipeline is the newest (``seq``), but not
what it recorded.

So after every commit it has confirmed as its own, the delta-spark sink writes that commit's
record (the very ``userMetadata`` JSON, and its Delta version) to
``<table>/_kafka_delta/<pipeline_id>/commits/<seq>.json``: written to a temporary name and
renamed (a crash never leaves half a copy under its name), and written again at start-up from
the log's own commit when a crash came between the commit and the copy.

What a copy is worth
--------------------
A hint, never the truth about offsets: a Delta RESTORE reverts neither the fence txn nor a
copy, so once log cleanup removed the RESTORE's own commit, the copy the fence names may be of
a batch the table no longer holds. After cleanup the offsets are therefore recomputed from the
rows the table holds (:func:`kafka_delta.offsets.stored.from_the_rows`); the copy lends its
topic ids (a topic deleted and created again is still recognised) and its record to
``offsets show``. Folders whose names start with ``_`` are hidden from VACUUM (delta-spark and
delta-rs) and from readers (only files the log names are table data).

The files go through Spark's Hadoop file system, with the credentials the table's own writes
use (local paths, ``s3a://``, ``abfss://``, ``dbfs:/`` alike).
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from pyspark.sql import SparkSession

from kafka_delta.offsets.model import TABLE_SIDE_FOLDER, StoredOffsets, parse_user_metadata

log = logging.getLogger(__name__)

# Copies older than this many commits of the pipeline are deleted; only the newest is ever
# read, the others serve whoever inspects the table.
KEEP = 100


def commits_folder(table_uri: str, pipeline_id: str) -> str:
    return f"{table_uri.rstrip('/')}/{TABLE_SIDE_FOLDER}/{pipeline_id}/commits"


def parse_copy(text: str, pipeline_id: str, seq: int) -> StoredOffsets | None:
    """The stored offsets a copy holds; None when it is not a copy of commit ``seq`` of
    ``pipeline_id`` (a foreign or damaged file is ignored, never trusted)."""
    try:
        body = json.loads(text)
        record = parse_user_metadata(body["userMetadata"], pipeline_id)
        version = int(body["delta_version"])
    except (ValueError, KeyError, TypeError):
        return None
    if record is None or record.seq != seq:
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


def read_copy_file(
    table_uri: str, pipeline_id: str, seq: int, storage_options: dict[str, str] | None = None
) -> StoredOffsets | None:
    """The copy of commit ``seq`` read without Spark (the ``offsets`` commands), through the
    table's folder as :mod:`..table_storage` opens it; None when there is none."""
    from pyarrow import fs

    from kafka_delta.sinks.table_storage import join, open_filesystem

    filesystem, root = open_filesystem(table_uri, storage_options, create=False)
    path = join(root, TABLE_SIDE_FOLDER, pipeline_id, "commits", f"{seq}.json")
    if filesystem.get_file_info(path).type != fs.FileType.File:
        return None
    with filesystem.open_input_stream(path) as stream:
        return parse_copy(stream.read().decode("utf-8"), pipeline_id, seq)


class CommitCopies:
    """The copies of one pipeline's commits beside one table (see the module docstring)."""

    def __init__(self, spark: SparkSession, table_uri: str, pipeline_id: str) -> None:
        self.spark = spark
        self.folder = commits_folder(table_uri, pipeline_id)
        self.pipeline_id = pipeline_id

    def _path(self, name: str | None = None) -> tuple[Any, Any]:
        """(Hadoop FileSystem, Path) of ``name`` in the folder, or of the folder."""
        jvm = self.spark.sparkContext._jvm  # type: ignore[attr-defined]
        where = self.folder if name is None else f"{self.folder}/{name}"
        path = jvm.org.apache.hadoop.fs.Path(where)
        return path.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration()), path

    def write(self, seq: int, user_metadata: str, delta_version: int) -> None:
        """Keep a copy of the pipeline's commit ``seq``: its ``userMetadata`` as committed at
        ``delta_version``. Idempotent."""
        body = json.dumps(
            {"delta_version": delta_version, "userMetadata": user_metadata},
            separators=(",", ":"),
        ).encode()
        fs, final = self._path(f"{seq}.json")
        _, temporary = self._path(f".{seq}.{uuid.uuid4().hex}.tmp")
        out = fs.create(temporary, True)
        try:
            out.write(bytearray(body))
        finally:
            out.close()
        fs.delete(final, False)
        if not fs.rename(temporary, final):
            fs.delete(temporary, False)
            raise OSError(f"could not rename {temporary} to {final}")
        if seq % KEEP == 0:
            self._prune(fs, seq - KEEP)

    def read(self, seq: int) -> StoredOffsets | None:
        """The copy of commit ``seq``, or None when there is none."""
        fs, path = self._path(f"{seq}.json")
        if not fs.exists(path):
            return None
        jvm = self.spark.sparkContext._jvm  # type: ignore[attr-defined]
        stream = fs.open(path)
        try:
            text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        return parse_copy(text, self.pipeline_id, seq)

    def ensure(self, stored: StoredOffsets) -> None:
        """Write the copy of the commit ``stored`` was read from, when a crash between that
        commit and its copy left none (at start-up, while the log still holds the commit)."""
        if stored.user_metadata is None or stored.delta_version is None:
            return  # not read from a commit in the log
        if self.read(stored.seq) is not None:
            return
        log.info("keeping the copy of commit %d of pipeline %r", stored.seq, self.pipeline_id)
        self.write(stored.seq, stored.user_metadata, stored.delta_version)

    def _prune(self, fs: Any, below: int) -> None:
        _, folder = self._path()
        for status in fs.listStatus(folder):
            name = status.getPath().getName()
            stem = name.removesuffix(".json")
            if name.endswith(".json") and stem.isdigit() and int(stem) < below:
                fs.delete(status.getPath(), False)
