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

from .offsets import (
    OffsetsExpiredError,
    StoredOffsets,
    fence_app_id,
    newest_stored_paged,
    partition_app_id,
    stored_from_transactions,
)
from .table_history import RestoreUnreadableError

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
