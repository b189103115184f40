"""Kafka offsets as the pipeline stores them, and the identity of each Delta commit.

Offsets follow Kafka's convention everywhere: for each topic-partition, the *next* offset to
read. The same ``{"topic": {"partition": offset}}`` JSON shape is used by the Spark offset log,
the Delta commit metadata and the consumer-group commit, so the three can be compared directly.

Why the offsets ride in the Delta commit
----------------------------------------
A micro-batch is durable when its Delta commit exists. Writing the batch's end offsets in that
same commit (``userMetadata``) makes "data written" and "offsets advanced" one atomic event:
there is no window in which one is true and the other is not. Kafka's consumer group only gets
a copy afterwards, for lag monitoring (see :mod:`.commit_back`).

Why appId = pipeline id + checkpoint query id (I2, I3)
------------------------------------------------------
Each commit carries a Delta ``txn`` action ``(appId, version)`` with ``version`` = Spark batch
id. A batch replayed after a crash (same checkpoint, same batch id) finds
``version <= stored`` and writes nothing (I2). A *new* checkpoint restarts batch ids at 0; were
the appId only the pipeline id, its batch 0..N would be taken for replays and silently dropped.
The checkpoint's query id is stable across restarts of one checkpoint and new for a new one, so
scoping the appId to it gives every checkpoint its own version sequence (I3). Offsets are read
back by the pipeline tag, never by appId, so a new checkpoint resumes exactly where the table
ends.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

# Tag of the JSON object this pipeline writes into a commit's userMetadata. Commits without it
# (other writers, OPTIMIZE, VACUUM, manual fixes) are skipped when reading offsets back.
METADATA_KEY = "kafka_delta"
METADATA_FORMAT = 1

Offsets = dict[str, dict[int, int]]
"""``{topic: {partition: next offset to read}}``."""


def offsets_to_json(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    """JSON-safe form (partition keys as strings), sorted for stable output."""
    return {
        topic: {str(p): int(o) for p, o in sorted(parts.items())}
        for topic, parts in sorted(offsets.items())
    }


def offsets_from_json(data: Mapping[str, Mapping[str, object]]) -> Offsets:
    """Inverse of :func:`offsets_to_json`; rejects anything but topic -> partition -> int."""
    if not isinstance(data, Mapping):
        raise ValueError(f"offsets must be a JSON object of topics, got {type(data).__name__}")
    result: Offsets = {}
    for topic, parts in data.items():
        if not isinstance(parts, Mapping):
            raise ValueError(f"offsets for topic {topic!r} must be an object of partitions")
        result[str(topic)] = {}
        for partition, offset in parts.items():
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset of {topic}[{partition}] must be an integer >= 0")
            result[str(topic)][int(partition)] = offset
    return result


def total_records(start: Offsets, end: Offsets) -> int:
    """Offset distance between two positions (an upper bound on records: offsets have gaps)."""
    return sum(
        max(0, offset - start.get(topic, {}).get(partition, offset))
        for topic, parts in end.items()
        for partition, offset in parts.items()
    )


def app_id(pipeline_id: str, query_id: str) -> str:
    """Delta ``txnAppId`` for one checkpoint of one pipeline (see the module docstring)."""
    return f"{pipeline_id}.{query_id}"


@dataclass(frozen=True)
class BatchCommit:
    """What one micro-batch's Delta commit records besides its data."""

    pipeline_id: str
    app_id: str
    batch_id: int
    end_offsets: Offsets

    def user_metadata(self) -> str:
        return json.dumps(
            {
                METADATA_KEY: {
                    "format": METADATA_FORMAT,
                    "pipeline_id": self.pipeline_id,
                    "app_id": self.app_id,
                    "batch_id": self.batch_id,
                    "offsets": offsets_to_json(self.end_offsets),
                }
            },
            separators=(",", ":"),
        )


@dataclass(frozen=True)
class StoredOffsets:
    """The newest offsets this pipeline committed to the table, and where they were found."""

    offsets: Offsets
    delta_version: int
    app_id: str
    batch_id: int


def parse_user_metadata(user_metadata: object, pipeline_id: str) -> BatchCommit | None:
    """The pipeline's commit record in a commit's ``userMetadata``, or None when the commit
    belongs to someone else (another pipeline, a maintenance job, a human)."""
    if not isinstance(user_metadata, str):
        return None
    try:
        record = json.loads(user_metadata)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    body = record.get(METADATA_KEY)
    if not isinstance(body, dict) or body.get("pipeline_id") != pipeline_id:
        return None
    if body.get("format") != METADATA_FORMAT:
        raise ValueError(
            f"commit metadata of pipeline {pipeline_id!r} has format {body.get('format')!r}; "
            f"this version of the pipeline reads format {METADATA_FORMAT}"
        )
    return BatchCommit(
        pipeline_id=pipeline_id,
        app_id=str(body["app_id"]),
        batch_id=int(body["batch_id"]),
        end_offsets=offsets_from_json(body["offsets"]),
    )


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
            )
    return None


# History is read newest first in growing pages: the pipeline's own commit is normally the
# newest, but other writers and maintenance (OPTIMIZE, VACUUM) may have committed since.
HISTORY_PAGES = (20, 500, None)


def newest_stored_paged(
    history: Callable[[int | None], Sequence[Mapping[str, object]]], pipeline_id: str
) -> StoredOffsets | None:
    """:func:`newest_stored` over ``history(limit)`` (newest first; None = the whole retained
    log), reading no more of the log than it must."""
    for limit in HISTORY_PAGES:
        page = history(limit)
        stored = newest_stored(page, pipeline_id)
        if stored is not None or limit is None or len(page) < limit:
            return stored
    return None
