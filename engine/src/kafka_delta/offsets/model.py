"""Kafka offsets as the pipeline stores them, and the identity of each Delta commit.

Offsets follow Kafka's convention everywhere: for each topic-partition, the *next* offset to
read. The same ``{"topic": {"partition": offset}}`` JSON shape is used by the Spark offset log,
the Delta commit metadata and the consumer-group commit, so the three can be compared directly.

Why the offsets ride in the Delta commit
----------------------------------------
A micro-batch is durable when its Delta commit exists. Writing the batch's end offsets in that
same commit (``userMetadata``) makes "data written" and "offsets advanced" one atomic event:
there is no window in which one is true and the other is not. Kafka's consumer group only gets
a copy afterwards, for lag monitoring (see :mod:`kafka_delta.kafka.commit_back`).

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

Why every commit also carries a pipeline-wide ``txn(<pipeline>:fence, seq)`` (I6)
--------------------------------------------------------------------------------
``seq`` numbers the pipeline's commits, whatever checkpoint made them: a batch commits as
``seq = stored seq + 1``. Every run of the pipeline therefore reads and writes the same appId,
so two runs (same checkpoint or not) can never both commit on top of the same stored offsets:
delta-spark's conflict checker rejects the second (``ConcurrentTransactionException``), or
skips it when the first had already landed (its version is then not above the stored one);
delta-rs commits without retry on the snapshot it checked. That is what makes fencing atomic
on delta-spark, where two blind appends of different appIds would otherwise both commit. On
delta-spark it is the commit's one txn (its writer takes one); a replay is then recognised
from the identity ``(app_id, batch_id)`` in the pipeline's newest commit.

Why the offsets are also ``txn(<pipeline>:offset:<topic>:<partition>, offset)`` actions
------------------------------------------------------------------------------------------
Delta checkpoints keep ``txn`` actions but not ``commitInfo``, and log cleanup deletes JSON
commits older than ``delta.logRetentionDuration``. A pipeline idle for longer than that while
other writers commit would lose its ``userMetadata`` offsets. The delta-rs sink therefore also
writes one txn per partition whose version is the partition's end offset, as kafka-delta-ingest
does. delta-spark's writer carries a single txn (the fence), so the delta-spark sink keeps a
copy of each commit's record beside the checkpoint, named by the fence's seq
(:mod:`kafka_delta.delta.commit_copies`). Neither is the truth once log cleanup
removed the pipeline's commits: a Delta RESTORE reverts no txn action and no copy, so both may
still name a batch the table no longer holds. The reader then recomputes the offsets from the
rows the table holds (:func:`kafka_delta.offsets.stored.from_the_rows`), and the copies only
lend their topic ids.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

# Tag of the JSON object this pipeline writes into a commit's userMetadata. Commits without it
# (other writers, OPTIMIZE, VACUUM, manual fixes) are skipped when reading offsets back.
METADATA_KEY = "kafka_delta"
# The folder inside a table where the delta-rs sink's runs keep their leases
# (recovery/lease.py); the delta-spark sink keeps its side files beside the checkpoint instead
# (delta/side_folder.py). Delta's readers and VACUUM skip folders whose names start with "_".
TABLE_SIDE_FOLDER = "_kafka_delta"
METADATA_FORMAT = 1

Offsets = dict[str, dict[int, int]]
"""``{topic: {partition: next offset to read}}``."""

StartingOffsets = str | Mapping[str, Mapping[int, int]]
"""``kafka.starting_offsets``: ``earliest``, ``latest``, or ``{topic: {partition: offset}}``
where -2 means the partition's earliest offset and -1 its latest (Spark's convention)."""

# Spark's kafka source's codes for "the partition's earliest / latest offset" in offset JSON.
EARLIEST, LATEST = -2, -1


def first_offset(
    topic: str,
    partition: int,
    *,
    stored: Mapping[str, Mapping[int, int]],
    starting: StartingOffsets,
    earliest: int,
    latest: int,
) -> int:
    """Where the pipeline begins reading a partition when a checkpoint starts: the offset the
    table stores for it; else, once the pipeline stored any offsets, its ``earliest`` (a topic
    or partition added later: records produced before the pipeline noticed it are read, never
    skipped); else, on the pipeline's very first start, where ``starting`` puts it.

    One rule for both sources and the checks: the embedded source passes Kafka's watermarks,
    Spark's kafka source's ``startingOffsets`` JSON passes its codes (``EARLIEST``, ``LATEST``),
    and the fencing rule (:mod:`.fencing`) asks how far a first read of a partition may begin.
    A partition new to a checkpoint that already runs starts by the same rule with ``starting``
    ``earliest``.

    >>> first_offset("t", 0, stored={}, starting="latest", earliest=5, latest=9)
    9
    >>> first_offset("t", 0, stored={"u": {0: 3}}, starting="latest", earliest=5, latest=9)
    5
    >>> first_offset("t", 1, stored={}, starting={"t": {1: 7}}, earliest=5, latest=9)
    7
    """
    own = stored.get(topic, {}).get(partition)
    if own is not None:
        return own
    if any(stored.values()) or starting == "earliest":
        return earliest
    if starting == "latest":
        return latest
    assert not isinstance(starting, str), starting
    chosen = starting.get(topic, {}).get(partition, EARLIEST)
    return earliest if chosen == EARLIEST else latest if chosen == LATEST else chosen


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


def starting_offsets_from_option(text: str) -> StartingOffsets:
    """A ``startingOffsets`` option as Spark's kafka source takes it: ``earliest``, ``latest``
    or a JSON object ``{"topic": {"partition": offset}}`` (-2 earliest, -1 latest)."""
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return word
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, Mapping) or not all(isinstance(v, Mapping) for v in data.values()):
        raise ValueError(
            "startingOffsets must be 'earliest', 'latest' or a JSON object of topics, each an "
            f"object of partition: offset, got {text!r}"
        )
    try:
        starting = {str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in data.items()}
    except (TypeError, ValueError):
        starting = None
    if starting is None or any(o < EARLIEST for parts in starting.values() for o in parts.values()):
        raise ValueError(
            "startingOffsets: offsets must be integers >= 0, or -2 (earliest) / -1 (latest), "
            f"got {text!r}"
        )
    return starting


def starting_offsets_option(starting: StartingOffsets) -> str:
    """The ``startingOffsets`` option text for ``starting`` (inverse of
    :func:`starting_offsets_from_option`)."""
    if isinstance(starting, str):
        return starting
    return json.dumps(offsets_to_json(starting), separators=(",", ":"))


def total_records(start: Offsets, end: Offsets) -> int:
    """Offset distance between two positions (an upper bound on records: offsets have gaps)."""
    return sum(
        max(0, offset - start.get(topic, {}).get(partition, offset))
        for topic, parts in end.items()
        for partition, offset in parts.items()
    )


def partitions_of(*offsets: Mapping[str, Mapping[int, int]]) -> dict[str, list[int]]:
    """Every topic-partition named in any of ``offsets``."""
    names: dict[str, set[int]] = {}
    for each in offsets:
        for topic, parts in each.items():
            names.setdefault(topic, set()).update(parts)
    return {topic: sorted(parts) for topic, parts in names.items()}


def app_id(pipeline_id: str, query_id: str, table: str | None = None) -> str:
    """Delta ``txnAppId`` for one checkpoint of one pipeline (see the module docstring); for
    a table of a pipeline that writes several (``tables:``), of that table too: each table's
    commits carry their own idempotence key (I13).

    >>> app_id("orders", "q1"), app_id("shop", "q1", "payments")
    ('orders.q1', 'shop.payments.q1')
    """
    return f"{pipeline_id}.{query_id}" if table is None else f"{pipeline_id}.{table}.{query_id}"


def fence_app_id(pipeline_id: str) -> str:
    """The pipeline-wide txn appId every run reads and writes (version = ``seq``)."""
    return f"{pipeline_id}:fence"


def partition_app_id(pipeline_id: str, topic: str, partition: int) -> str:
    """The txn appId whose version is the stored end offset of one partition (neither pipeline
    ids nor topic names may contain ':', so the parts never run together)."""
    return f"{pipeline_id}:offset:{topic}:{partition}"


def topic_id_app_id(pipeline_id: str, topic: str) -> str:
    """The txn appId whose version is the digest of the Kafka topic id the pipeline last
    recorded for ``topic`` (:func:`topic_id_digest`): Delta checkpoints keep it through log
    cleanup, which removes the commits whose metadata names the id itself."""
    return f"{pipeline_id}:topic-id:{topic}"


# A topic id known only by its digest (read back from a txn action after log cleanup).
DIGEST_PREFIX = "digest:"


def topic_id_digest(topic_id: str) -> int:
    """A txn version standing for ``topic_id``: 62 bits of its SHA-256 (a txn version is a
    non-negative long; two ids share a digest with odds of 2^-62). A digest passes through."""
    if topic_id.startswith(DIGEST_PREFIX):
        return int(topic_id.removeprefix(DIGEST_PREFIX))
    return int.from_bytes(hashlib.sha256(topic_id.encode()).digest()[:8], "big") >> 2


def same_topic_id(a: str, b: str) -> bool:
    """Whether two recorded topic ids (either may be a digest) name one topic."""
    if a.startswith(DIGEST_PREFIX) or b.startswith(DIGEST_PREFIX):
        return topic_id_digest(a) == topic_id_digest(b)
    return a == b


@dataclass(frozen=True)
class BatchCommit:
    """What one micro-batch's Delta commit records besides its data."""

    pipeline_id: str
    app_id: str
    batch_id: int
    end_offsets: Offsets
    # The pipeline-wide commit number (version of the fence txn); the sink sets it.
    seq: int = 0
    # Partitions this batch deliberately moves backwards: Kafka no longer holds the stored
    # position (the topic was deleted and recreated) and the config allows skipping
    # (kafka.fail_on_data_loss: false). Recorded in the commit, for the audit trail.
    rewound: tuple[tuple[str, int], ...] = ()
    # Where the rewound partitions' stored offsets stood before (the old topic's end): `offsets
    # verify` counts the old topic's rows below it as another generation of the topic, also
    # once log cleanup removed the commits that wrote them.
    rewound_from: Offsets | None = None
    # The batch's start offsets as the checkpoint planned them (absent in commits written
    # before they were recorded): `offsets verify` checks each range begins where the previous
    # one ended, so a gap or an overlap is found rather than assumed away.
    start_offsets: Offsets | None = None
    # Set on the commit an operator's `offsets reset` makes (no data): who, when, why, and
    # what it moved; see commands/reset.py. A checkpoint older than it must not resume.
    reset: Mapping[str, object] | None = None
    # Kafka's topic id of each topic the offsets name, as of this batch: a topic deleted and
    # created again under the same name has a new id, and the stored offsets of the old one
    # must not be applied to it (commits written before ids were recorded hold none).
    topic_ids: Mapping[str, str] | None = None
    # The names of the pipeline's tables (`tables:`) as of this batch, in each table's commit:
    # a table with no commit of the pipeline that no other table's newest commit names is new
    # to the pipeline; one they name was deleted or replaced (kafka_delta.resume.new_tables).
    # Empty: a pipeline of one table, or a commit written before tables were named.
    tables: tuple[str, ...] = ()

    def user_metadata(self) -> str:
        return json.dumps(
            {
                METADATA_KEY: {
                    "format": METADATA_FORMAT,
                    "pipeline_id": self.pipeline_id,
                    "app_id": self.app_id,
                    "batch_id": self.batch_id,
                    "seq": self.seq,
                    "offsets": offsets_to_json(self.end_offsets),
                    **({"rewound": [list(tp) for tp in self.rewound]} if self.rewound else {}),
                    **(
                        {"rewound_from": offsets_to_json(self.rewound_from)}
                        if self.rewound_from
                        else {}
                    ),
                    **(
                        {"start": offsets_to_json(self.start_offsets)}
                        if self.start_offsets is not None
                        else {}
                    ),
                    **({"reset": dict(self.reset)} if self.reset is not None else {}),
                    **(
                        {"topic_ids": dict(sorted(self.topic_ids.items()))}
                        if self.topic_ids
                        else {}
                    ),
                    **({"tables": list(self.tables)} if self.tables else {}),
                }
            },
            separators=(",", ":"),
        )

    def with_seq(self, seq: int) -> BatchCommit:
        return replace(self, seq=seq)

    def starting_at(self, start: Offsets | None) -> BatchCommit:
        """This batch with its start offsets recorded (None: unknown, nothing recorded)."""
        return replace(self, start_offsets=start)

    def on_top_of(self, stored: StoredOffsets | None) -> BatchCommit:
        """This batch as the sink commits it on top of ``stored``: the pipeline's next ``seq``,
        and the stored offsets of partitions the batch does not name carried forward, so a
        topic dropped from the subscription resumes where it stopped when it is re-added."""
        if stored is None:
            return self.with_seq(1)
        offsets = {topic: dict(parts) for topic, parts in stored.offsets.items()}
        for topic, parts in self.end_offsets.items():
            offsets.setdefault(topic, {}).update(parts)
        ids = {**(stored.topic_ids or {}), **(self.topic_ids or {})}
        return replace(self, end_offsets=offsets, seq=stored.seq + 1, topic_ids=ids or None)

    def transactions(self) -> list[tuple[str, int]]:
        """Every ``(appId, version)`` txn action of this commit on a sink that can write
        several (delta-rs): the checkpoint's batch (I2, I3), the fence (I6), one per
        partition's end offset (a topic removed from the config keeps its offsets) and one per
        topic's id, as a digest (a topic deleted and created again is still recognised after
        log cleanup). See the module docstring."""
        return [
            (self.app_id, self.batch_id),
            (fence_app_id(self.pipeline_id), self.seq),
            *(
                (partition_app_id(self.pipeline_id, topic, p), offset)
                for topic, parts in sorted(self.end_offsets.items())
                for p, offset in sorted(parts.items())
            ),
            *(
                (topic_id_app_id(self.pipeline_id, topic), topic_id_digest(topic_id))
                for topic, topic_id in sorted((self.topic_ids or {}).items())
            ),
        ]


@dataclass(frozen=True)
class StoredOffsets:
    """The newest offsets this pipeline committed to the table, and where they were found.

    Read from the newest commit of the pipeline in the retained log, every field is known and
    ``user_metadata`` is that commit's record as written. After log cleanup removed every commit
    of the pipeline (``expired``), the offsets are recomputed from the rows the table holds
    (``recomputed``: only ``offsets``, ``seq`` and ``topic_ids`` are known; ``delta_version``,
    ``app_id`` and ``batch_id`` are None)."""

    offsets: Offsets
    delta_version: int | None
    app_id: str | None
    batch_id: int | None
    seq: int = 0
    expired: bool = False
    # The commit's record as written (delta-spark keeps a copy of it:
    # delta/commit_copies.py); not part of what the offsets are.
    user_metadata: str | None = field(default=None, compare=False)
    # The metadata of an operator's reset when the stored offsets come from one (None for a
    # batch, or when read from txn actions after log cleanup).
    reset: Mapping[str, object] | None = None
    # Set when a Delta RESTORE undid newer commits of the pipeline: {"version": the restore's
    # Delta version, "to": the version restored to, "at_ms": when}. The offsets are then those
    # in effect at "to", and ``seq`` is past every fence seq the undone commits used.
    restore: Mapping[str, int] | None = None
    # Kafka's topic ids the commit recorded (None: not recorded, or read from txn actions).
    topic_ids: Mapping[str, str] | None = field(default=None, compare=False)
    # Set when log cleanup removed every commit of the pipeline and the offsets were
    # recomputed from the rows the table holds (offsets.stored.from_the_rows).
    recomputed: bool = False
    # Recomputed offsets only: the partitions whose surviving hints (offset txns, the commit
    # copy) name an offset past where the rows end, with that offset. The records between are
    # read again, and nothing left tells what they were (see offsets.stored.from_the_rows).
    past_the_rows: Offsets | None = field(default=None, compare=False)
    # The tables the pipeline's commit before this one (in this table's log) named, when it was
    # read with it (kafka_delta.routing: a batch a run died in may name a table that never
    # committed; the commit before says which tables the pipeline had).
    earlier_tables: tuple[str, ...] | None = field(default=None, compare=False)

    def describe(self) -> str:
        if self.restore is not None and self.delta_version is None and not self.offsets:
            return (
                f"none: Delta version {self.restore['version']} restored the table to version "
                f"{self.restore['to']}, before the pipeline's first commit"
            )
        if self.recomputed:
            where = f"commit {self.seq} of the pipeline; log cleanup removed its commits"
            if self.past_the_rows:
                named = ", ".join(
                    f"{topic}[{p}] {end} (the rows: "
                    f"{self.offsets[topic][p] if p in self.offsets.get(topic, {}) else 'none'})"
                    for topic, parts in sorted(self.past_the_rows.items())
                    for p, end in sorted(parts.items())
                )
                where = f"{where}; its offset txns name {named}"
            return f"offsets recomputed from its rows ({where})"
        if self.app_id is None:
            return (
                f"unknown (commit {self.seq} of the pipeline; log cleanup removed its commits "
                "and the rows carry no Kafka position)"
            )
        if self.reset is not None:
            where = f"Delta version {self.delta_version} (a reset {describe_reset(self.reset)})"
        else:
            where = f"Delta version {self.delta_version} (batch {self.batch_id} of {self.app_id})"
        if self.expired:
            return f"{where}, from the copy of commit {self.seq} of the pipeline (log cleaned up)"
        if self.restore is not None:
            return f"{where}, in effect since Delta version {self.restore['version']} restored it"
        return where


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
        # Commits written before the fence txn existed carry no seq: they count as 0.
        seq=int(body.get("seq", 0)),
        rewound=tuple((str(t), int(p)) for t, p in body.get("rewound", [])),
        rewound_from=(offsets_from_json(body["rewound_from"]) if "rewound_from" in body else None),
        start_offsets=offsets_from_json(body["start"]) if "start" in body else None,
        reset=body["reset"] if isinstance(body.get("reset"), dict) else None,
        topic_ids=(
            {str(t): str(i) for t, i in body["topic_ids"].items()}
            if isinstance(body.get("topic_ids"), dict)
            else None
        ),
        tables=tuple(str(t) for t in body.get("tables", ()) if isinstance(t, str)),
    )


def format_ms(epoch_ms: int) -> str:
    """An epoch time in ms as ``2025-01-01T10:00:00Z`` (UTC, to the second)."""
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def describe_reset(reset: Mapping[str, object]) -> str:
    """``by alice@host at 2025-01-01T10:00:00Z to earliest: reason`` for messages."""
    at = reset.get("at_ms")
    when = format_ms(at) if isinstance(at, int) else "?"
    why = f": {reset['reason']}" if reset.get("reason") else ""
    return f"by {reset.get('by', '?')} at {when} to {reset.get('to', '?')}{why}"
