"""The one reader of the offsets a pipeline stored in its Delta table.

The pipeline's start, both sinks' checks and the ``offsets`` commands all ask the same question
("where does the table say this pipeline ends?"), and all of them read the answer here, so no
reader can know less than another. A table is seen through a :class:`TableLog`: its history,
its txn actions (none through Spark: the delta-spark side answers for the fence alone, see
:mod:`kafka_delta.delta.spark_offset_store`), and (delta-spark sink) the copies of the
pipeline's commit records kept beside the checkpoint.

In order:

1. The newest commit of the pipeline **in effect** in the retained log: a Delta RESTORE hides the
   commits it undid (:mod:`kafka_delta.offsets.history`); the fence seq is then taken past every seq
   the undone commits used, since neither engine's RESTORE reverts txn actions (delta-spark would
   otherwise skip the next commit as a replay of the fence).
2. After log cleanup removed every commit of the pipeline: recomputed from the rows the table
   holds (:func:`from_the_rows`). The fence txn, the per-partition offset txns and the commit
   copies survive cleanup, but a RESTORE reverts none of them: they are hints, and a hint is
   only used where it can prove it agrees with the commits in effect. There is one truth: the
   offsets of the pipeline's commits live in the table's current snapshot.
3. Partitions the record does not name but the caller reads take where the table's rows end
   (a commit written before records carried removed topics forward left them out).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from kafka_delta.offsets.history import RestoreUnreadableError, iter_live, restores_in
from kafka_delta.offsets.model import (
    DIGEST_PREFIX,
    Offsets,
    StoredOffsets,
    fence_app_id,
    parse_user_metadata,
    partition_app_id,
    topic_id_app_id,
)

Partitions = Callable[[], Mapping[str, Iterable[int]]]
"""Lazily lists the partitions the caller reads (a Kafka metadata query, made when needed)."""


class TableLog(Protocol):
    """What the reader needs of a Delta table, whichever engine reads it."""

    def history(self, limit: int | None) -> Sequence[Mapping[str, object]]:
        """commitInfo dicts (``version``, ``timestamp``, ``operation``,
        ``operationParameters``, ``userMetadata``), newest first; None: the whole log."""
        ...

    def transaction_version(self, app_id: str) -> int | None: ...

    def commit_copy(self, seq: int) -> StoredOffsets | None:
        """The newest copy of a commit of the pipeline numbered ``seq`` or lower (delta-spark
        sink, kept beside the checkpoint), if any."""
        ...

    def row_positions(
        self, topics: Collection[str] | None = None
    ) -> Mapping[tuple[str, int], int] | None:
        """The highest Kafka offset of the live rows of each (topic, partition) (of ``topics``
        only, when given), read from the rows' own ``topic``, ``partition`` and ``offset``
        columns; None when the rows carry no such columns (a transform that drops them)."""
        ...


def read_stored(
    log: TableLog, pipeline_id: str, partitions: Partitions | None = None
) -> StoredOffsets | None:
    """This pipeline's stored offsets in the table ``log`` reads, or None when the pipeline
    never committed there. ``partitions`` (when given) names what the caller reads: it enables
    the txn fallback after log cleanup and the recovery of removed topics' offsets."""
    try:
        stored = newest_stored_paged(log.history, pipeline_id)
    except RestoreUnreadableError as exc:
        raise OffsetsExpiredError(str(exc)) from None
    if stored is None:
        seq = log.transaction_version(fence_app_id(pipeline_id))
        if seq is None:
            return None
        return from_the_rows(log, pipeline_id, seq, partitions)
    if stored.restore is not None:
        fence = log.transaction_version(fence_app_id(pipeline_id))
        if fence is not None and fence > stored.seq:
            stored = replace(stored, seq=fence)
        # The undone commits' offset txns were not reverted either: none of them is taken.
        return stored
    if partitions is not None:
        stored = _with_unnamed_partitions(log, pipeline_id, stored, partitions())
    return stored


def from_the_rows(
    log: TableLog, pipeline_id: str, seq: int, partitions: Partitions | None = None
) -> StoredOffsets:
    """Where the table ends when log cleanup removed every commit of the pipeline: recomputed
    from the rows the table holds now, never taken from a hint that cannot prove itself.

    The fence txn (``seq``), the per-partition offset txns (delta-rs sink) and the commit copies
    (delta-spark sink) all survive cleanup, and all of them still name the newest batch even
    when a RESTORE undid it (neither engine's RESTORE reverts txn actions) and the RESTORE's own
    commit was cleaned up since: resuming from them would skip the restored-away records for
    good. The rows cannot be wrong that way: a record at or below the highest offset a
    partition's rows hold is in the table (a batch is one commit, and a RESTORE undoes whole
    commits), and reading from the next offset on never skips a record the table lacks. Records
    read again past it are ones that gave no row (a transform's filter, dead letters): they give
    none again, and a dead letter is sent once per position. A partition with no row starts
    where a partition new to the pipeline starts (its earliest offset). Why the rows and not the
    data files a commit added: OPTIMIZE rewrites files and keeps the rows, so a file a batch
    added may be gone while its rows are in effect. Reading the three position columns costs
    one scan of the table, once, at the start after such a cleanup.

    What the rows cannot tell is what the records past them were, where a hint names an offset
    further on: records an operator's reset skipped come back as rows. So the partitions where
    that happens (of the rows' and those ``partitions`` lists) are named, with the hint's
    offset, in ``past_the_rows``: the run says so rather than reading them again silently.

    A table whose rows carry no position (the transform drops topic, partition or offset)
    cannot prove where it ends: the run stops with one sentence."""
    positions = log.row_positions()
    if positions is None:
        raise OffsetsExpiredError(
            f"Delta log cleanup removed every commit of pipeline {pipeline_id!r}, and the "
            "table's rows carry no Kafka position (the transform drops topic, partition or "
            "offset), so nothing left can prove where the table ends: the txn actions still "
            f"name commit {seq} even if a RESTORE undid it. Nothing was read or written. Set "
            "the offsets to where the table ends with `offsets reset --to-offsets "
            "TOPIC:PARTITION=OFFSET,... --allow-rewind --allow-skip --execute` (or "
            "--to-datetime), then start again.",
            seq=seq,
        )
    offsets: Offsets = {}
    for (topic, partition), highest in sorted(positions.items()):
        offsets.setdefault(topic, {})[partition] = highest + 1
    copy = log.commit_copy(seq)
    return StoredOffsets(
        offsets,
        None,
        None,
        None,
        seq=seq,
        expired=True,
        recomputed=True,
        topic_ids=copy.topic_ids
        if copy is not None
        else _topic_id_digests(log, pipeline_id, offsets),
        past_the_rows=_past_the_rows(log, pipeline_id, offsets, copy, partitions),
    )


def _past_the_rows(
    log: TableLog,
    pipeline_id: str,
    rows: Offsets,
    copy: StoredOffsets | None,
    partitions: Partitions | None,
) -> Offsets | None:
    """The partitions whose hint (the commit copy's offsets, else the partition's offset txn)
    names an offset past ``rows`` (where the rows end; 0 for a partition without a row), with
    the hint's offset; None when there is none."""
    if copy is not None:
        hints = copy.offsets
    else:
        named = {topic: set(parts) for topic, parts in rows.items()}
        for topic, parts in (partitions() if partitions is not None else {}).items():
            named.setdefault(topic, set()).update(int(p) for p in parts)
        hints = _offset_txns(log, pipeline_id, named)
    past: dict[str, dict[int, int]] = {}
    for topic, parts in hints.items():
        for p, hint in parts.items():
            if hint > rows.get(topic, {}).get(p, 0):
                past.setdefault(topic, {})[p] = hint
    return past or None


def _offset_txns(
    log: TableLog, pipeline_id: str, partitions: Mapping[str, Iterable[int]]
) -> Offsets:
    """The end offsets the partitions' offset txns name (delta-rs sink), of those that have one:
    hints only (a RESTORE reverts no txn)."""
    found: dict[str, dict[int, int]] = {}
    for topic, parts in partitions.items():
        for p in sorted(parts):
            offset = log.transaction_version(partition_app_id(pipeline_id, topic, p))
            if offset is not None:
                found.setdefault(topic, {})[p] = offset
    return found


def _topic_id_digests(log: TableLog, pipeline_id: str, offsets: Offsets) -> dict[str, str] | None:
    """The topic ids the delta-rs sink's txn actions keep, as digests (``digest:<n>``), of the
    topics in ``offsets``; None when none is kept (a table written before they were)."""
    found = {
        topic: f"{DIGEST_PREFIX}{digest}"
        for topic in offsets
        if (digest := log.transaction_version(topic_id_app_id(pipeline_id, topic))) is not None
    }
    return found or None


def unnamed_partitions(
    stored: StoredOffsets, partitions: Mapping[str, Iterable[int]]
) -> dict[str, list[int]]:
    """The partitions of ``partitions`` (by topic) that ``stored``'s record names no offset
    for: where the table's end is found from its rows (:func:`_with_unnamed_partitions`)."""
    missing = {
        topic: [int(p) for p in parts if int(p) not in stored.offsets.get(topic, {})]
        for topic, parts in partitions.items()
    }
    return {topic: parts for topic, parts in missing.items() if parts}


def _with_unnamed_partitions(
    log: TableLog,
    pipeline_id: str,
    stored: StoredOffsets,
    partitions: Mapping[str, Iterable[int]],
) -> StoredOffsets:
    """``stored`` plus where the table's rows end for the partitions the caller reads that the
    record does not name. Every commit carries the offsets of partitions it did not read
    forward (:meth:`.model.BatchCommit.on_top_of`), so this only finds rows a commit written
    before that carried nothing forward left behind (a topic out of the config at the time).
    The rows, not the partition's offset txn: a RESTORE reverts no txn, so the txn may name a
    batch the RESTORE undid. Only where the rows carry no position is the txn taken, as the
    one hint left."""
    missing = unnamed_partitions(stored, partitions)
    if not missing:
        return stored
    positions = log.row_positions(sorted(missing))
    if positions is None:
        found = _offset_txns(log, pipeline_id, missing)
    else:
        found = {}
        for topic, parts in missing.items():
            for p in parts:
                highest = positions.get((topic, p))
                if highest is not None:
                    found.setdefault(topic, {})[p] = highest + 1
    if not found:
        return stored
    offsets = {topic: dict(parts) for topic, parts in stored.offsets.items()}
    for topic, parts in found.items():
        offsets.setdefault(topic, {}).update(parts)
    return replace(stored, offsets=offsets)


def newest_stored(
    history: Iterable[Mapping[str, object]], pipeline_id: str
) -> StoredOffsets | None:
    """First commit of ``pipeline_id`` in ``history`` (newest first, Delta commitInfo dicts),
    with the tables the next one in ``history`` names, if there is one."""
    entries = iter(history)
    for commit in entries:
        record = parse_user_metadata(commit.get("userMetadata"), pipeline_id)
        if record is not None:
            earlier = (parse_user_metadata(e.get("userMetadata"), pipeline_id) for e in entries)
            before = next((r for r in earlier if r is not None), None)
            return StoredOffsets(
                offsets=record.end_offsets,
                delta_version=int(commit["version"]),  # type: ignore[call-overload]
                app_id=record.app_id,
                batch_id=record.batch_id,
                seq=record.seq,
                user_metadata=str(commit.get("userMetadata")),
                reset=record.reset,
                topic_ids=record.topic_ids,
                earlier_tables=tuple(before.tables) if before is not None else None,
            )
    return None


class OffsetsExpiredError(RuntimeError):
    """The pipeline has committed to the table, but its offsets are no longer readable;
    ``seq``: the pipeline's newest commit number (its fence txn), when known: an ``offsets
    reset`` to explicit offsets commits on top of it."""

    def __init__(self, message: str, seq: int | None = None) -> None:
        super().__init__(message)
        self.seq = seq


# History is read newest first in growing pages: the pipeline's own commit is normally the
# newest, but other writers and maintenance (OPTIMIZE, VACUUM) may have committed since. The
# first page is small because the delta-spark sink reads it twice a batch, each a Spark job
# whose tasks open every commit file of the page: 3 commit files cost about what 1 does, 20
# about two thirds more (DESCRIBE HISTORY, issue 44).
HISTORY_PAGES = (3, 20, 500, None)


def newest_stored_paged(
    history: Callable[[int | None], Sequence[Mapping[str, object]]], pipeline_id: str
) -> StoredOffsets | None:
    """:func:`newest_stored` over ``history(limit)`` (newest first; None = the whole retained
    log), reading no more of the log than it must, and as the table is in effect: commits a
    Delta RESTORE undid are passed over (:mod:`kafka_delta.offsets.history`) and the result
    names the restore. When a restore took the table back to before the pipeline's first commit, the
    result holds no offsets (``delta_version`` None) but names the restore."""
    for limit in HISTORY_PAGES:
        page = history(limit)
        stored = newest_stored(iter_live(page), pipeline_id)
        complete = limit is None or len(page) < limit
        if stored is not None or complete:
            # Only what is newer than the commit found can have undone it (and only those
            # entries were judged on the way to it).
            newer = [
                e
                for e in page
                if stored is None or int(e["version"]) > (stored.delta_version or -1)  # type: ignore[call-overload]
            ]
            # Restores that undid commits of this pipeline (a restore over other writers'
            # commits alone leaves the stored offsets as they were).
            ours = [
                int(e["version"])  # type: ignore[call-overload]
                for e in page
                if parse_user_metadata(e.get("userMetadata"), pipeline_id) is not None
            ]
            above = [
                (version, to)
                for version, to in restores_in(newer)
                if any(to < v < version for v in ours)
            ]
            if not above:
                return stored
            version, to = above[0]
            stamp = next((e.get("timestamp") for e in page if e.get("version") == version), None)
            restore = {
                "version": version,
                "to": to,
                "at_ms": int(stamp) if isinstance(stamp, int) else 0,
            }
            if stored is None:
                return StoredOffsets({}, None, None, None, restore=restore)
            return replace(stored, restore=restore)
    return None


def newest_commit_version(
    history: Callable[[int | None], Sequence[Mapping[str, object]]], pipeline_id: str, app_id: str
) -> int | None:
    """The Delta version of the newest commit of the pipeline made under ``app_id`` (one
    checkpoint) in the retained log, whether a RESTORE undid it or not; None when the log holds
    none (never committed, or log cleanup removed them). Where a checkpoint's work stands
    against the table's other commits: a position, never a clock."""
    for limit in HISTORY_PAGES:
        page = history(limit)
        for entry in page:
            record = parse_user_metadata(entry.get("userMetadata"), pipeline_id)
            if record is not None and record.app_id == app_id:
                return int(entry["version"])  # type: ignore[call-overload]
        if limit is None or len(page) < limit:
            return None
    return None
