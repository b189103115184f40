"""The one reader of the offsets a pipeline stored in its Delta table.

The pipeline's start, both sinks' checks and the ``offsets`` commands all ask the same question
("where does the table say this pipeline ends?"), and all of them read the answer here, so no
reader can know less than another. A table is seen through a :class:`TableLog`: its history,
its txn actions, and (delta-spark sink) the copies of the pipeline's commit records beside it.

In order:

1. The newest commit of the pipeline **in effect** in the retained log: a Delta RESTORE hides
   the commits it undid (:mod:`.table_history`); the fence seq is then taken past every seq the
   undone commits used, since neither engine's RESTORE reverts txn actions (delta-spark would
   otherwise skip the next commit as a replay of the fence).
2. After log cleanup removed every commit of the pipeline: the copy of the commit the fence txn
   names (:mod:`.cluster.commit_copies`), else the per-partition offset txns the delta-rs sink
   writes (:func:`.offsets.stored_from_transactions`).
3. Partitions the record does not name but the caller subscribes to (a topic removed from the
   config and added back) take their offset txn, when one survives: the offsets of a removed
   topic are not forgotten, even after a log cleanup made a commit without them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from kafka_delta.offsets.history import RestoreUnreadableError, iter_live, restores_in
from kafka_delta.offsets.model import (
    TABLE_SIDE_FOLDER,
    Offsets,
    StoredOffsets,
    fence_app_id,
    offsets_seq_app_id,
    parse_user_metadata,
    partition_app_id,
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
        """The copy of the pipeline's commit ``seq`` kept beside the table, if any."""
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
        stored = log.commit_copy(seq)
        if stored is None:
            if partitions is None:
                return None
            stored = stored_from_transactions(log.transaction_version, pipeline_id, partitions())
        if stored is None:
            return None
    if stored.restore is not None:
        fence = log.transaction_version(fence_app_id(pipeline_id))
        if fence is not None and fence > stored.seq:
            stored = replace(stored, seq=fence)
        # The undone commits' offset txns were not reverted either: none of them is taken.
        return stored
    if partitions is not None:
        stored = _with_removed_topics(log, pipeline_id, stored, partitions())
    return stored


def _with_removed_topics(
    log: TableLog,
    pipeline_id: str,
    stored: StoredOffsets,
    partitions: Mapping[str, Iterable[int]],
) -> StoredOffsets:
    """``stored`` plus the offset txns of partitions it does not name: every commit of the
    delta-rs sink writes the txn of each partition it stores, so a partition's txn is its last
    stored offset, also when a later record lost it (log cleanup while its topic was out of the
    config)."""
    found: dict[str, dict[int, int]] = {}
    for topic, parts in partitions.items():
        for p in parts:
            if p in stored.offsets.get(topic, {}):
                continue
            offset = log.transaction_version(partition_app_id(pipeline_id, topic, int(p)))
            if offset is not None:
                found.setdefault(topic, {})[int(p)] = offset
    if not found:
        return stored
    offsets = {topic: dict(parts) for topic, parts in stored.offsets.items()}
    for topic, parts in found.items():
        offsets.setdefault(topic, {}).update(parts)
    return replace(stored, offsets=offsets)


def newest_stored(
    history: Iterable[Mapping[str, object]], pipeline_id: str
) -> StoredOffsets | None:
    """First commit of ``pipeline_id`` in ``history`` (newest first, Delta commitInfo dicts)."""
    for commit in history:
        record = parse_user_metadata(commit.get("userMetadata"), pipeline_id)
        if record is not None:
            return StoredOffsets(
                offsets=record.end_offsets,
                delta_version=int(commit["version"]),  # type: ignore[call-overload]
                app_id=record.app_id,
                batch_id=record.batch_id,
                seq=record.seq,
                user_metadata=str(commit.get("userMetadata")),
                reset=record.reset,
                topic_ids=record.topic_ids,
            )
    return None


def stored_from_transactions(
    txn_version: Callable[[str], int | None],
    pipeline_id: str,
    partitions: Mapping[str, Iterable[int]],
) -> StoredOffsets | None:
    """The pipeline's stored offsets rebuilt from the txn actions a Delta checkpoint keeps
    (``txn_version(app_id)`` -> version or None), for ``partitions``; None when the table has
    no fence txn of this pipeline (never written with txn offsets)."""
    seq = txn_version(fence_app_id(pipeline_id))
    if seq is None:
        return None
    written_at = txn_version(offsets_seq_app_id(pipeline_id))
    # Tables written before the offsets-at txn existed hold none: their offset txns were
    # written by every commit (delta-rs sink alone) and are taken as they are.
    if written_at is not None and written_at != seq:
        raise OffsetsExpiredError(
            f"the table's newest commit of pipeline {pipeline_id!r} is commit {seq} (its fence "
            "txn), but Delta log cleanup removed that commit and no copy of it "
            f"({TABLE_SIDE_FOLDER}/{pipeline_id}/commits/{seq}.json beside the table) is left; the "
            f"table's offset txns are those of the older commit {written_at}, so resuming from "
            "them would read records twice. Nothing was read or written. Set the offsets "
            "explicitly (README, 'Delta log cleanup')."
        )
    offsets: Offsets = {}
    for topic, parts in partitions.items():
        for p in parts:
            offset = txn_version(partition_app_id(pipeline_id, topic, p))
            if offset is not None:
                offsets.setdefault(topic, {})[int(p)] = offset
    if not offsets:
        raise OffsetsExpiredError(
            f"the table's newest commit of pipeline {pipeline_id!r} is commit {seq} (its fence "
            "txn), but Delta log cleanup removed that commit, and neither an offset txn for any "
            f"of {sorted(partitions)} nor a copy of the commit ({TABLE_SIDE_FOLDER}/{pipeline_id}/"
            f"commits/{seq}.json beside the table) is left to say where it ended. Nothing was "
            "read or written. Set the offsets explicitly (README, 'Delta log cleanup'), and keep "
            "delta.logRetentionDuration above the pipeline's longest pause."
        )
    return StoredOffsets(offsets, None, None, None, seq=seq, expired=True)


class OffsetsExpiredError(RuntimeError):
    """The pipeline has committed to the table, but its offsets are no longer readable."""


# History is read newest first in growing pages: the pipeline's own commit is normally the
# newest, but other writers and maintenance (OPTIMIZE, VACUUM) may have committed since.
HISTORY_PAGES = (20, 500, None)


def newest_stored_paged(
    history: Callable[[int | None], Sequence[Mapping[str, object]]], pipeline_id: str
) -> StoredOffsets | None:
    """:func:`newest_stored` over ``history(limit)`` (newest first; None = the whole retained
    log), reading no more of the log than it must, and as the table is in effect: commits a
    Delta RESTORE undid are passed over (:mod:`.table_history`) and the result names the
    restore. When a restore took the table back to before the pipeline's first commit, the
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
