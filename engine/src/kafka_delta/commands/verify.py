"""``offsets verify``: prove the table is whole, from the pipeline's commits in the retained Delta
log, the rows' Kafka positions and (``--against-kafka``) Kafka's records. Exit 0 only when every
check holds; otherwise the first problem is named (exit 1).

The commits are taken **as in effect**: a Delta RESTORE to version V undoes the commits between V
and the restore (:func:`kafka_delta.offsets.history.live_history`), and their rows are gone with
them.

Checks, in order:

0. **topics** (first, the check a run stops on): no topic holding stored offsets was deleted and
   created again since (another topic id; ``kafka.fail_on_data_loss: false`` notes it instead,
   as the next run reads it from its first record). Its failure is the run's own sentence.
1. **ranges**: per partition, each batch in effect starts where the previous commit in effect
   ended (a gap: records lost, e.g. a RESTORE undid a batch and the pipeline resumed after it;
   an overlap: records written twice); a batch id of one checkpoint is committed once; the
   fence ``seq`` counts up by one (a RESTORE's undone seqs excepted); stored offsets never move
   backwards except by an audited reset (``--allow-rewind``) or a recreated topic
   (``rewound``). Commits written before batches recorded their start (``start`` in the
   metadata) are contiguous by construction of the fencing check: only their direction counts.
2. **rows**: every row's ``(topic, partition, offset)`` lies in a committed range in effect
   (a row outside was written outside the pipeline's accounting). Skipped, with the reason,
   for a table whose transform drops those columns.
3. **duplicates**: no Kafka position has two rows across the table and the dead-letter table
   (upsert mode: the dead-letter table, and positions in both tables). A position is (topic
   id, partition, offset): where a topic was deleted and created again and read from its
   start, each generation that committed an offset holds one row there.
4. **dead letters**: every dead letter lies in a committed range of the main table (positions
   after the table's stored offsets belong to a batch not committed yet and are noted).
5. **kafka** (``--against-kafka``): the committed ranges read back from Kafka; every record
   is in the table or the dead-letter table (exactly once: with 3), a position without a
   Kafka record (transaction markers, compaction) holds no row, and where both tables keep
   the record's timestamp, each row is the record Kafka holds at its position (a topic deleted
   and recreated, then read from the old offset, fails here). Records Kafka no longer retains
   are counted as not checkable.
6. **group**: the consumer group's committed offsets equal the table's stored offsets.
7. **retention**: no stored offset is below Kafka's earliest (records expired unread).
8. **ids** (``--ids COLUMN``): the column holds no value twice.

Without ``--against-kafka``, positions in the ranges that hold no row are noted, not failed:
Kafka leaves offsets without records (transaction markers, compaction), which only Kafka can
tell from lost rows.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kafka_delta.commands.table_log import (
    KAFKA_TIMEOUT_S,
    CommandError,
    PipelineCommit,
    admin_for,
    commits_in,
    kafka_partitions,
    open_existing,
    open_table,
    row_count,
    stored_offsets,
)
from kafka_delta.config import PipelineConfig
from kafka_delta.kafka.admin import GroupNotAuthorizedError, KafkaUnavailableError, Watermarks
from kafka_delta.kafka.clients import about_its_group_only
from kafka_delta.kafka.refusals import KafkaRefusedError, topic_not_authorized
from kafka_delta.offsets.history import RestoreUnreadableError, live_history, restores_in
from kafka_delta.offsets.model import (
    Offsets,
    describe_reset,
    first_offset,
    offsets_from_json,
    parse_user_metadata,
    same_topic_id,
)
from kafka_delta.offsets.topic_identity import recreated_error, recreated_topics

TP = tuple[str, int]
POSITION = ("topic", "partition", "offset")
# The Kafka record timestamp as each table keeps it: the sample transform names it
# kafka_timestamp (a column named plain "timestamp" in the table may be the event's own time);
# the dead-letter table keeps the record's own columns.
TABLE_TIMESTAMP = "kafka_timestamp"
DEAD_LETTER_TIMESTAMP = "timestamp"
# Lines of examples one finding names at most.
EXAMPLES = 3


@dataclass
class Ranges:
    """The offset ranges ``[lo, hi)`` the pipeline committed, per partition (``lo`` None: the
    start is unknown, before the retained log or never recorded)."""

    spans: dict[TP, list[tuple[int | None, int]]] = field(default_factory=lambda: defaultdict(list))
    # Where each topic generation's spans begin in ``spans[tp]``, after the first: a topic
    # deleted and created again (a new topic id, or a commit that records the partition as
    # ``rewound``) starts over at its first offset, so one position may be committed once per
    # generation (a position is (topic id, partition, offset)).
    generations: dict[TP, list[int]] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    resets: int = 0
    without_start: int = 0

    _merged: dict[TP, tuple[list[int], list[int]]] = field(default_factory=dict)

    def merged(self, tp: TP) -> list[tuple[int, int]]:
        """The committed ranges of ``tp`` merged where they touch, sorted (an unknown start
        counts as -1: everything below the end)."""
        if tp not in self._merged:
            merged = _merge(self.spans[tp])
            self._merged[tp] = ([m[0] for m in merged], [m[1] for m in merged])
        los, his = self._merged[tp]
        return list(zip(los, his, strict=True))

    def older(self, tp: TP) -> list[list[tuple[int, int]]]:
        """The merged ranges of each generation of ``tp``'s topic before the current one."""
        bounds = [0, *self.generations.get(tp, [])]
        return [_merge(self.spans[tp][a:b]) for a, b in itertools.pairwise(bounds)]

    def current(self, tp: TP) -> list[tuple[int, int]]:
        """The merged ranges of the current generation of ``tp``'s topic."""
        starts = self.generations.get(tp)
        return _merge(self.spans[tp][starts[-1] :]) if starts else self.merged(tp)

    def older_cover(self, tp: TP, offsets: pa.Array) -> pa.Array:
        """Per offset, how many earlier generations of the topic committed it (int64)."""
        count = pa.repeat(0, len(offsets)).cast(pa.int64())
        for spans in self.older(tp):
            count = pc.add(count, pc.cast(_inside(offsets, spans), pa.int64()))
        return count

    def covers(self, tp: TP, offset: int) -> bool:
        """True when ``offset`` lies in a committed range of ``tp`` (a binary search over the
        merged ranges: a dead-letter table may hold many rows, the log many commits)."""
        self.merged(tp)
        los, his = self._merged[tp]
        i = bisect.bisect_right(los, offset) - 1
        return i >= 0 and offset < his[i]


def _merge(spans: Iterable[tuple[int | None, int]]) -> list[tuple[int, int]]:
    """``spans`` merged where they touch, sorted (an unknown start counts as -1)."""
    merged: list[list[int]] = []
    for lo, hi in sorted(((-1 if lo is None else lo), hi) for lo, hi in spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def _new_generation(out: Ranges, tp: TP, old_end: int | None) -> None:
    """The commits of ``tp`` from here on read a new generation of its topic (deleted and
    created again). Where log cleanup removed the old generation's commits, its range is known
    only by its end (``old_end``): it is taken as everything below it."""
    if out.spans.get(tp):
        out.generations[tp].append(len(out.spans[tp]))
    elif old_end is not None and old_end > 0:
        out.spans[tp].append((None, old_end))
        out.generations[tp].append(1)


def _where(commit: PipelineCommit) -> str:
    r = commit.record
    return f"version {commit.version} (batch {r.batch_id} of {r.app_id})"


def walk(
    commits: list[PipelineCommit], undone_seqs: Collection[int] = (), history_start: int = 0
) -> Ranges:
    """Check the commits in effect (oldest first) and collect their ranges. ``undone_seqs``:
    the fence seqs of commits a RESTORE undid, which the seq count may pass over.
    ``history_start``: the oldest version the log still holds. Once log cleanup has removed
    version 0, the delta-spark sink can no longer read the fence Delta stores and takes the bound
    ``newest version + 1`` for it (the delta-spark offset store's ``transaction_version``), so
    its seq may jump, though never past its own commit's version + 1."""
    out = Ranges()
    ends: dict[TP, int] = {}
    batches: dict[tuple[str, int], int] = {}
    topic_ids: dict[str, str] = {}
    previous_seq: int | None = None
    for commit in commits:
        r = commit.record
        skipped = range(previous_seq + 1, r.seq) if previous_seq and r.seq else range(0)
        if (
            previous_seq
            and r.seq
            and r.seq != previous_seq + 1
            and (r.seq <= previous_seq or any(s not in undone_seqs for s in skipped))
            and not (history_start > 0 and r.seq <= commit.version + 1)
        ):
            out.problems.append(
                f"the pipeline's commit count (fence seq) jumps from {previous_seq} to {r.seq} "
                f"at {_where(commit)}: a commit of the pipeline is missing from the log"
            )
        previous_seq = r.seq or previous_seq
        if r.reset is not None:
            before_reset = dict(ends)
            out.resets += 1
            moved = ", ".join(
                f"{t}:{p} {ends.get((t, p), '-')} -> {o}"
                for t, ps in sorted(r.end_offsets.items())
                for p, o in sorted(ps.items())
                if ends.get((t, p)) != o
            )
            out.notes.append(
                f"reset at version {commit.version} {describe_reset(r.reset)}: {moved or 'none'}"
            )
            for t, ps in r.end_offsets.items():
                for p, o in ps.items():
                    ends[(t, p)] = o
            # A reset to positions in a topic deleted and created again starts its new
            # generation (the old one ended where the reset moved it from).
            moved_from = offsets_from_json(r.reset.get("from") or {})  # type: ignore[arg-type]
            for t in r.reset.get("recreated") or []:  # type: ignore[union-attr]
                for p in r.end_offsets.get(str(t), {}):
                    tp = (str(t), p)
                    _new_generation(out, tp, moved_from.get(tp[0], {}).get(p, before_reset.get(tp)))
            topic_ids.update(r.topic_ids or {})
            continue
        key = (r.app_id, r.batch_id)
        if key in batches:
            out.problems.append(
                f"batch {r.batch_id} of {r.app_id} is committed twice, at versions "
                f"{batches[key]} and {commit.version}: its records are in the table twice"
            )
        batches[key] = commit.version
        if r.start_offsets is None:
            out.without_start += 1
        for t, ps in sorted(r.end_offsets.items()):
            for p, end in sorted(ps.items()):
                tp = (t, p)
                before = ends.get(tp)
                start = (r.start_offsets or {}).get(t, {}).get(p)
                new_id = (r.topic_ids or {}).get(t)
                recreated = new_id is not None and not same_topic_id(
                    topic_ids.get(t, new_id), new_id
                )
                rewound = tp in r.rewound or recreated
                if rewound:
                    old_end = (r.rewound_from or {}).get(t, {}).get(p, before)
                    _new_generation(out, tp, old_end)
                if start is not None and before is not None and start != before and not rewound:
                    size = abs(start - before)
                    kind = (
                        f"a gap of {size} offsets [{before}, {start}) that no commit covers "
                        "(records skipped)"
                        if start > before
                        else f"an overlap of {size} offsets [{start}, {before}) "
                        "(records written twice)"
                    )
                    out.problems.append(
                        f"{t}:{p}: the commit at {_where(commit)} starts at {start}, but the "
                        f"pipeline's previous commit ended at {before}: {kind}"
                    )
                elif start is None and before is not None and end < before and not rewound:
                    out.problems.append(
                        f"{t}:{p}: the commit at {_where(commit)} moves the stored offset back "
                        f"from {before} to {end} without a reset"
                    )
                lo = start if start is not None else before
                if lo is None or end > lo:
                    out.spans[tp].append((lo, end))
                ends[tp] = end
        topic_ids.update(r.topic_ids or {})
    return out


# -- the log in effect ------------------------------------------------------------------------


@dataclass(frozen=True)
class Effect:
    """The pipeline's commits as the table has them in effect, and what RESTOREs undid."""

    commits: list[PipelineCommit]
    undone: list[PipelineCommit]
    restores: list[tuple[int, int]]

    def notes(self) -> list[str]:
        lines = []
        for version, to in self.restores:
            gone = [c for c in self.undone if to < c.version < version]
            if not gone:
                lines.append(
                    f"RESTORE at version {version} to version {to} undid no commit of the pipeline"
                )
                continue
            what = ", ".join(f"batch {c.record.batch_id} of {c.record.app_id}" for c in gone[:5])
            what += f" and {len(gone) - 5} more" if len(gone) > 5 else ""
            lines.append(
                f"RESTORE at version {version} to version {to} undid {what}: those rows are "
                "gone and their offsets no longer count as committed"
            )
        return lines


def in_effect(history: Iterable[Mapping[str, object]], pipeline_id: str) -> Effect:
    """Split the pipeline's commits in ``history`` (newest first) into those in effect and
    those a RESTORE undid. Raises :class:`RestoreUnreadableError` as ``live_history`` does."""
    entries = list(history)
    live = live_history(entries)
    live_versions = {int(e["version"]) for e in live}  # type: ignore[call-overload]
    commits = commits_in(live, pipeline_id)
    undone = commits_in(
        (
            e
            for e in entries
            if int(e["version"]) not in live_versions  # type: ignore[call-overload]
        ),
        pipeline_id,
    )
    return Effect(commits, undone, restores_in(entries))


# -- rows' positions --------------------------------------------------------------------------


@dataclass(frozen=True)
class Positions:
    """One table's rows as Kafka positions: per partition, the offsets sorted, and (when the
    table keeps it) each row's record timestamp in epoch ms."""

    rows: int
    offsets: dict[TP, pa.Array]
    stamps: dict[TP, pa.Array] | None

    def partitions(self) -> set[TP]:
        return set(self.offsets)


def _epoch_ms(column: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """A record-timestamp column as epoch milliseconds (None: not a timestamp column)."""
    kind = column.type
    if pa.types.is_timestamp(kind):
        return pc.cast(pc.cast(column, pa.timestamp("ms", tz=kind.tz), safe=False), pa.int64())
    if pa.types.is_integer(kind):
        return pc.cast(column, pa.int64())
    return None


def read_positions(table: Any, stamp_column: str) -> tuple[Positions | None, str]:
    """(the rows' positions, '') or (None, why the table cannot be audited by row). Only the
    position columns and ``stamp_column`` (the record timestamp, when the table has it) are
    read."""
    names = [f.name for f in pa.schema(table.schema().to_arrow())]
    missing = [c for c in POSITION if c not in names]
    if missing:
        return None, (
            f"the table has no {', '.join(missing)} column(s) (the transform drops them), so "
            "its rows cannot be matched to Kafka positions"
        )
    stamp = stamp_column if stamp_column in names else None
    data = table.to_pyarrow_table(columns=[*POSITION, *([stamp] if stamp else [])])
    ms = _epoch_ms(data.column(stamp)) if stamp else None
    frame = pa.table(
        {
            "topic": pc.cast(data.column("topic"), pa.string()),
            "partition": pc.cast(data.column("partition"), pa.int64()),
            "offset": pc.cast(data.column("offset"), pa.int64()),
            **({"ms": ms} if ms is not None else {}),
        }
    )
    frame = frame.filter(pc.invert(pc.is_null(frame.column("offset"))))
    frame = frame.sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
    )
    # Each partition's rows are one slice of the sorted frame, found by its first row's index:
    # Arrow's group_by does not return groups in the order of a sorted input.
    frame = frame.append_column("row", pa.array(range(frame.num_rows), pa.int64()))
    groups = frame.group_by(["topic", "partition"], use_threads=False).aggregate(
        [("row", "min"), ("row", "count")]
    )
    offsets: dict[TP, pa.Array] = {}
    stamps: dict[TP, pa.Array] | None = {} if "ms" in frame.column_names else None
    for t, p, at, n in zip(
        groups.column("topic").to_pylist(),
        groups.column("partition").to_pylist(),
        groups.column("row_min").to_pylist(),
        groups.column("row_count").to_pylist(),
        strict=True,
    ):
        part = frame.slice(at, n)
        offsets[(t, p)] = part.column("offset").combine_chunks()
        if stamps is not None:
            stamps[(t, p)] = part.column("ms").combine_chunks()
    return Positions(frame.num_rows, offsets, stamps), ""


def _inside(offsets: pa.Array, spans: list[tuple[int, int]]) -> pa.Array:
    """Mask of the offsets that lie in one of ``spans`` ([lo, hi))."""
    mask = pa.repeat(False, len(offsets))
    for lo, hi in spans:
        mask = pc.or_(mask, pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi)))
    return mask


@dataclass(frozen=True)
class Audit:
    """The committed ranges in effect as the row checks see them."""

    ranges: Ranges
    # Log cleanup removed the pipeline's first commits: rows below a partition's first
    # retained range were committed by commits no longer readable, and are not checked.
    cleaned: bool

    def floor(self, tp: TP) -> int | None:
        if not self.cleaned:
            return None
        spans = self.ranges.merged(tp)
        return spans[0][0] if spans else None

    def checked(self, tp: TP, offsets: pa.Array) -> pa.Array:
        """Mask of the offsets the audit can judge (at or above the floor)."""
        floor = self.floor(tp)
        if self.cleaned and floor is None:
            return pa.repeat(False, len(offsets))
        if floor is None or floor < 0:
            return pa.repeat(True, len(offsets))
        return pc.greater_equal(offsets, floor)


def _examples(values: pa.Array) -> str:
    shown = ", ".join(str(v) for v in values.slice(0, EXAMPLES).to_pylist())
    return shown + (", ..." if len(values) > EXAMPLES else "")


def check_rows(main: Positions, audit: Audit) -> tuple[list[str], str, list[str]]:
    """(problems, summary, notes): every row of the table lies in a committed range."""
    problems: list[str] = []
    unchecked = 0
    for tp in sorted(main.offsets):
        offsets = main.offsets[tp]
        judged = audit.checked(tp, offsets)
        unchecked += (
            len(offsets) - pc.sum(pc.cast(judged, pa.int64())).as_py() if len(offsets) else 0
        )
        outside = offsets.filter(
            pc.and_(judged, pc.invert(_inside(offsets, audit.ranges.merged(tp))))
        )
        if len(outside):
            where = (
                "no range of this partition was ever committed"
                if not audit.ranges.spans.get(tp)
                else "outside every range the pipeline committed in effect"
            )
            problems.append(
                f"{tp[0]}:{tp[1]}: {len(outside)} row(s) at offsets {_examples(outside)}: "
                f"{where} (written outside the pipeline's accounting, or left by a batch a "
                "RESTORE undid)"
            )
    notes = (
        [
            f"rows: {unchecked} row(s) below the first retained commit of their partition "
            "(log cleanup removed the commits that wrote them): not checked"
        ]
        if unchecked
        else []
    )
    summary = f"{main.rows} rows, all inside the committed ranges"
    return problems, summary, notes


def check_duplicates(
    main: Positions | None, dead: Positions | None, mode: str, ranges: Ranges | None = None
) -> tuple[list[str], str]:
    """No Kafka position has two rows across both tables (upsert: the dead-letter table and
    positions in both tables; a table's own duplicates are the MERGE's business). A position
    an earlier generation of a recreated topic committed too holds one row per generation
    (``ranges``)."""
    problems: list[str] = []
    parts = (main.partitions() if main else set()) | (dead.partitions() if dead else set())
    rows = 0
    for tp in sorted(parts):
        a = main.offsets.get(tp, pa.array([], pa.int64())) if main else pa.array([], pa.int64())
        b = dead.offsets.get(tp, pa.array([], pa.int64())) if dead else pa.array([], pa.int64())
        rows += len(a) + len(b)
        if ranges is not None and ranges.generations.get(tp) and mode == "append":
            problem = _more_than_one_per_generation(tp, a, b, ranges)
            if problem:
                problems.append(problem)
            continue
        findings = []
        if mode == "append":
            twice = pc.value_counts(a)
            twice = twice.filter(pc.greater(twice.field("counts"), 1)).field("values")
            if len(twice):
                findings.append(f"{len(twice)} offset(s) twice in the table ({_examples(twice)})")
        twice = pc.value_counts(b)
        twice = twice.filter(pc.greater(twice.field("counts"), 1)).field("values")
        if len(twice):
            findings.append(
                f"{len(twice)} offset(s) twice in the dead-letter table ({_examples(twice)})"
            )
        both = pc.unique(a.filter(pc.is_in(a, value_set=b))) if len(a) and len(b) else a[:0]
        if len(both):
            findings.append(
                f"{len(both)} offset(s) in both the table and the dead-letter table "
                f"({_examples(both)})"
            )
        if findings:
            problems.append(
                f"{tp[0]}:{tp[1]}: {'; '.join(findings)}: those records are written more than once"
            )
    scope = "in the two tables" if mode == "append" else "in the dead-letter table or in both"
    return problems, f"{rows} rows, no Kafka position twice {scope}"


def _more_than_one_per_generation(tp: TP, a: pa.Array, b: pa.Array, ranges: Ranges) -> str | None:
    """The duplicates finding of a partition whose topic was recreated: each position holds at
    most one row (in either table) per generation that committed it."""
    counts = pc.value_counts(pa.chunked_array([a, b], pa.int64()).combine_chunks())
    offsets, n = counts.field("values"), counts.field("counts")
    allowed = pc.add(ranges.older_cover(tp, offsets), 1)
    over = offsets.filter(pc.greater(pc.cast(n, pa.int64()), allowed))
    if not len(over):
        return None
    generations = len(ranges.generations[tp]) + 1
    return (
        f"{tp[0]}:{tp[1]}: {len(over)} offset(s) hold more rows across the two tables than the "
        f"{generations} generations of the topic (deleted and created again) that committed "
        f"them ({_examples(over.sort())}): those records are written more than once"
    )


def judged_spans(audit: Audit, tp: TP, unknown_start: int | None) -> list[tuple[int, int]]:
    """The committed ranges of ``tp`` that the checks position by position judge: above the
    floor (log cleanup), of the topic's current generation (an earlier one was deleted with
    its records), and a range whose start is not recorded (the pipeline's very first batch on
    a partition starts where ``kafka.starting_offsets`` put it) from ``unknown_start`` (None:
    such a range is not judged)."""
    floor = audit.floor(tp)
    if audit.cleaned and floor is None:
        return []
    spans = []
    for lo, hi in audit.ranges.current(tp):
        if lo < 0:
            if unknown_start is None:
                continue
            lo = unknown_start
        if floor is not None and floor >= 0:
            lo = max(lo, floor)
        if lo < hi:
            spans.append((lo, hi))
    return spans


def count_unfilled(
    main: Positions | None, dead: Positions | None, spans: Mapping[TP, list[tuple[int, int]]]
) -> int:
    """Positions in ``spans`` that hold no row in either table: Kafka's own gaps
    (transaction markers, compaction) or lost rows."""
    unfilled = 0
    for tp, ranges in spans.items():
        size = sum(hi - lo for lo, hi in ranges)
        held = [p.offsets[tp] for p in (main, dead) if p is not None and tp in p.offsets]
        present = pa.chunked_array(held, pa.int64()).combine_chunks() if held else None
        inside = present.filter(_inside(present, ranges)) if present is not None else None
        unfilled += size - (pc.count_distinct(inside).as_py() if inside is not None else 0)
    return unfilled


def check_dead_letters(
    dead: Positions | None, audit: Audit, stored: Offsets
) -> tuple[list[str], str]:
    """(problems, summary) of the dead letters' positions against the committed ranges. Those
    below a partition's first retained commit are not judged, as rows are not (log cleanup
    removed the commits that sent them)."""
    if dead is None:
        return [], "no dead-letter table"
    ranges = audit.ranges
    problems: list[str] = []
    pending = 0
    unchecked = 0
    for (t, p), offsets in sorted(dead.offsets.items()):
        end = stored.get(t, {}).get(p)
        judged = audit.checked((t, p), offsets).to_pylist() if len(offsets) else []
        for o, judge in zip(offsets.to_pylist(), judged, strict=True):
            if not judge:
                unchecked += 1
                continue
            if ranges.covers((t, p), o):
                continue
            if end is None or o >= end:
                pending += 1  # its batch's main commit has not landed yet
                continue
            problems.append(
                f"the dead letter at {t}:{p} offset {o} lies outside every range the pipeline "
                "committed (the table's offsets skipped it)"
            )
    summary = f"{dead.rows} dead letters, all inside the committed ranges"
    if unchecked:
        summary += f" ({unchecked} below the first retained commit of their partition: not checked)"
    if pending:
        summary += f" ({pending} beyond the stored offsets: from a batch not committed yet)"
    return problems, summary


# -- against Kafka ----------------------------------------------------------------------------


@dataclass
class KafkaRead:
    """The records Kafka holds in the committed ranges, per partition."""

    offsets: dict[TP, pa.Array] = field(default_factory=dict)
    stamps: dict[TP, pa.Array] = field(default_factory=dict)
    # Windows actually read (the committed ranges within what Kafka retains).
    windows: dict[TP, list[tuple[int, int]]] = field(default_factory=dict)
    # Committed positions Kafka no longer holds, per partition: not checkable.
    gone: dict[TP, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))

    @property
    def not_retained(self) -> int:
        return sum(hi - lo for spans in self.gone.values() for lo, hi in spans)


def read_kafka(
    config: PipelineConfig, spans: Mapping[TP, list[tuple[int, int]]], marks: Watermarks
) -> KafkaRead:
    """Read ``spans`` back from Kafka with one consumer (assign and seek, no group commit).
    Positions below Kafka's earliest, or at or past its latest (a truncated or recreated
    topic; under read_committed, an open transaction), are counted as not retained."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from kafka_delta.kafka.clients import consumer_settings

    conf = {
        **config.kafka.client_config(),
        "group.id": f"{config.kafka.consumer_group}.verify",
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",
        "enable.partition.eof": "true",
        "auto.offset.reset": "error",
    }
    consumer = Consumer(consumer_settings(conf))
    out = KafkaRead()
    try:
        for (t, p), ranges in sorted(spans.items()):
            offsets: list[int] = []
            stamps: list[int] = []
            windows = []
            for lo, hi in ranges:
                first = max(lo, marks.earliest.get(t, {}).get(p, lo))
                last = min(hi, max(first, marks.latest.get(t, {}).get(p, hi)))
                if first > lo:
                    out.gone[(t, p)].append((lo, min(first, hi)))
                end = first
                if first < last:
                    end = _read_range(
                        consumer,
                        TopicPartition,
                        KafkaError,
                        (t, p),
                        first,
                        last,
                        offsets,
                        stamps,
                        conf,
                    )
                if end < hi and first < hi:
                    out.gone[(t, p)].append((end, hi))
                if end > first:
                    windows.append((first, end))
            out.offsets[(t, p)] = pa.array(offsets, pa.int64())
            out.stamps[(t, p)] = pa.array(stamps, pa.int64())
            out.windows[(t, p)] = windows
    finally:
        consumer.close()
    return out


def _read_range(
    consumer,
    topic_partition,
    kafka_error,
    tp: TP,
    lo: int,
    hi: int,
    offsets: list[int],
    stamps: list[int],
    conf: Mapping[str, str],
) -> int:
    """Append the records of ``tp`` in [lo, hi) to ``offsets``/``stamps``; returns where the
    read ended (``hi``, or Kafka's end when the partition ends before it). ``conf``: the
    consumer's settings (a refusal names the principal they log in as)."""
    t, p = tp
    consumer.assign([topic_partition(t, p, lo)])
    deadline = time.monotonic() + KAFKA_TIMEOUT_S
    position = lo
    try:
        while True:
            # Ask for no more than the range holds: consume() waits out its whole timeout
            # whenever fewer messages than asked for are available (a second a partition,
            # the source's rule too: kafka_datasource.read_range).
            wanted = max(1, min(10_000, hi - position))
            messages = consumer.consume(num_messages=wanted, timeout=0.5)
            if not messages:
                if time.monotonic() > deadline:
                    raise KafkaUnavailableError(
                        f"Kafka delivered no records of {t}:{p} at offset "
                        f"{offsets[-1] + 1 if offsets else lo} within {KAFKA_TIMEOUT_S:g} s"
                    )
                continue
            deadline = time.monotonic() + KAFKA_TIMEOUT_S
            for message in messages:
                if (message.topic(), message.partition()) != (t, p):
                    continue  # left over from the previous partition's assignment
                error = message.error()
                if error is not None:
                    if error.code() == kafka_error._PARTITION_EOF:
                        if message.offset() < lo:
                            continue  # an end reached before this read was assigned
                        return min(hi, message.offset())
                    if about_its_group_only(error):
                        continue
                    if error.code() in (
                        kafka_error._AUTO_OFFSET_RESET,
                        kafka_error.OFFSET_OUT_OF_RANGE,
                    ):
                        # lo is past the end of a truncated or recreated topic (or fell below
                        # its earliest since it was listed): nothing of the range is left.
                        return lo
                    if error.code() == kafka_error.TOPIC_AUTHORIZATION_FAILED:
                        raise KafkaRefusedError(
                            topic_not_authorized(conf["bootstrap.servers"], conf, t)
                        )
                    raise KafkaUnavailableError(
                        f"cannot read {t}:{p} from offset {lo}: {error.str()}"
                    )
                if message.offset() >= hi:
                    return hi
                offsets.append(message.offset())
                stamps.append(message.timestamp()[1])
                position = message.offset() + 1
                if position >= hi:
                    return hi
    finally:
        consumer.unassign()


def check_against_kafka(
    read: KafkaRead,
    main: Positions | None,
    dead: Positions | None,
    mode: str,
    ranges: Ranges | None = None,
    route: str | None = None,
) -> tuple[list[str], str, list[str]]:
    """(problems, summary, notes): every record Kafka holds in the committed ranges is in the
    table or the dead-letter table, no row sits where Kafka has no record, and each row is the
    record Kafka holds at its position (where both keep its timestamp). Where an earlier
    generation of a recreated topic committed a position too (``ranges``), its row is there
    besides the current record's: the record is in a table when the position holds more rows
    than the earlier generations, and only rows at positions no earlier generation holds are
    compared with Kafka's. A table with a ``route`` (one of several, ``tables:``) holds the
    records its route takes: each row is checked to be a record, and held once, but a record
    it lacks is not lost (the route, a Spark expression on the transform's output, decides)."""
    problems: list[str] = []
    records = 0
    for tp in sorted(read.offsets):
        kafka = read.offsets[tp]
        records += len(kafka)
        windows = read.windows.get(tp, [])
        held = [x for x in (main, dead) if x is not None and tp in x.offsets]
        rows = (
            pa.chunked_array([x.offsets[tp] for x in held], pa.int64()).combine_chunks()
            if held
            else pa.array([], pa.int64())
        )
        older = ranges is not None and bool(ranges.generations.get(tp))
        if main is not None and mode == "append" and route is None:
            if older:
                assert ranges is not None
                per = pc.value_counts(rows)
                held_n = pa.table({"offset": per.field("values"), "n": per.field("counts")})
                at = pa.table({"offset": kafka}).join(held_n, "offset", join_type="left outer")
                at = at.sort_by("offset")
                n = pc.fill_null(pc.cast(at.column("n"), pa.int64()), 0)
                offsets = at.column("offset").combine_chunks()
                missing = offsets.filter(pc.less_equal(n, ranges.older_cover(tp, offsets)))
            else:
                missing = kafka.filter(pc.invert(pc.is_in(kafka, value_set=rows)))
            if len(missing):
                problems.append(
                    f"{tp[0]}:{tp[1]}: {len(missing)} record(s) Kafka holds in the committed "
                    f"ranges are in neither the table nor the dead-letter table (offsets "
                    f"{_examples(missing)}): lost"
                )
        in_windows = rows.filter(_inside(rows, windows)) if len(rows) else rows
        phantom = in_windows.filter(pc.invert(pc.is_in(in_windows, value_set=kafka)))
        if len(phantom):
            problems.append(
                f"{tp[0]}:{tp[1]}: {len(phantom)} row(s) at offsets where Kafka holds no record "
                f"({_examples(phantom)})"
            )
        for name, x in (("table", main), ("dead-letter table", dead)):
            if x is None or x.stamps is None or tp not in x.offsets:
                continue
            ours = pa.table({"offset": x.offsets[tp], "ms": x.stamps[tp]})
            theirs = pa.table({"offset": kafka, "kafka_ms": read.stamps[tp]})
            joined = ours.join(theirs, "offset", join_type="inner")
            if older:
                assert ranges is not None
                at = joined.column("offset").combine_chunks()
                joined = joined.filter(pc.equal(ranges.older_cover(tp, at), 0))
            differ = joined.filter(pc.not_equal(joined.column("ms"), joined.column("kafka_ms")))
            if differ.num_rows:
                differ = differ.sort_by("offset")
                o = differ.column("offset")[0].as_py()
                problems.append(
                    f"{tp[0]}:{tp[1]}: {differ.num_rows} row(s) of the {name} are not the record "
                    f"Kafka holds at their offset (e.g. offset {o}: timestamp "
                    f"{differ.column('ms')[0].as_py()} in the {name}, "
                    f"{differ.column('kafka_ms')[0].as_py()} in Kafka): the topic was deleted "
                    "and recreated and read from the old offset, whose first records were lost"
                )
    notes = []
    if read.not_retained:
        # Of those, positions without a row: records skipped by kafka.fail_on_data_loss: false
        # or expired unread (or Kafka's own gaps); only their count can be told.
        rowless = 0
        for tp, spans in read.gone.items():
            held = [x.offsets[tp] for x in (main, dead) if x is not None and tp in x.offsets]
            rows = pa.chunked_array(held, pa.int64()).combine_chunks() if held else None
            inside = rows.filter(_inside(rows, spans)) if rows is not None else None
            found = pc.count_distinct(inside).as_py() if inside is not None and len(inside) else 0
            rowless += sum(hi - lo for lo, hi in spans) - found
        notes.append(
            f"kafka: {read.not_retained} committed position(s) are no longer in Kafka (below "
            "its earliest offset, or past the end of a truncated or recreated topic): not "
            f"checkable; {rowless} of them hold no row in either table (records skipped by "
            "kafka.fail_on_data_loss: false or expired unread, or Kafka's own gaps)"
        )
    if route is not None:
        notes.append(
            f"kafka: the table takes the records its route ({route}) holds true for: each row "
            "is a record of the committed ranges, held once; records it lacks are not judged"
        )
    if mode != "append":
        notes.append(
            "kafka: upsert mode keeps one row per key, so records superseded by a newer one "
            "are absent by design: only rows are checked against Kafka's records"
        )
    summary = (
        f"{records} records read back from the committed ranges, each in exactly one table"
        if mode == "append" and route is None
        else f"{records} records read back from the committed ranges, every row is one of them"
    )
    return problems, summary, notes


# -- ids --------------------------------------------------------------------------------------


def check_ids(config: PipelineConfig, column: str) -> tuple[list[str], str]:
    table = open_existing(config.delta.table, config)
    names = [f.name for f in pa.schema(table.schema().to_arrow())]
    if column not in names:
        raise CommandError(f"--ids {column!r}: the table has no such column ({', '.join(names)})")
    values = table.to_pyarrow_table(columns=[column]).column(column)
    rows = len(values)
    distinct = pc.count_distinct(values, mode="all").as_py()
    if distinct == rows:
        return [], f"{rows} rows, {distinct} distinct values of {column}"
    counts = pc.value_counts(values)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    example = repeated[0].as_py() if len(repeated) else {}
    return [
        f"{rows} rows but {distinct} distinct values of {column}: {rows - distinct} duplicate "
        f"rows (e.g. {column}={example.get('values')!r} appears {example.get('counts')} times)"
    ], ""


# -- the command ------------------------------------------------------------------------------


def _fail(name: str, problem: str) -> int:
    print(f"FAIL  {name}: {problem}")
    print(f"verify: FAILED: {name}: {problem}")
    return 1


def run_verify(
    config: PipelineConfig,
    ids: str | None = None,
    against_kafka: bool = False,
    group_expected: Mapping[str, Mapping[int, int]] | None = None,
) -> int:
    """``group_expected``: what the consumer group must hold (a pipeline of several tables: the
    least of the tables' offsets); by default the table's stored offsets."""
    table = open_existing(config.delta.table, config)
    history = table.history(None)
    try:
        effect = in_effect(history, config.pipeline_id)
    except RestoreUnreadableError as exc:
        # The stored offsets cannot be known either: nothing else can be judged.
        return _fail("restore", str(exc))
    admin = admin_for(config)
    partitions, _ = kafka_partitions(admin, config.kafka.topics)
    stored, _ = stored_offsets(table, config, partitions)
    history_start = min((int(h["version"]) for h in history), default=0)
    commits = effect.commits
    of_table = "" if config.table_name is None else f" table {config.table_name}"
    print(
        f"verify pipeline {config.pipeline_id}{of_table} on {config.delta.table} (Delta version "
        f"{table.version()}, {row_count(table)} rows; log retained from version {history_start})"
    )
    checks: list[tuple[str, list[str], str]] = []
    notes: list[str] = effect.notes()
    skips: list[str] = []

    # First: a topic recreated since the table stored its offsets is what a run stops on (with
    # kafka.fail_on_data_loss: true), and its stored offsets are no position in the new topic.
    recreated = recreated_topics(stored, admin.topic_ids(stored.offsets))
    if recreated and config.kafka.fail_on_data_loss:
        checks.append(("topics", [str(recreated_error(recreated))], ""))
    else:
        if recreated:
            notes.append(
                f"topics: {', '.join(sorted(recreated))} were deleted and created again since "
                "the table stored their offsets; the next run reads them from their first "
                "record (kafka.fail_on_data_loss: false)"
            )
        same = (
            "the stored topics are the ones Kafka holds (same topic ids)"
            if stored.topic_ids
            else "no topic ids stored (older commits, or a broker without them): not compared"
        )
        checks.append(("topics", [], same))

    ranges = walk(commits, {c.record.seq for c in effect.undone if c.record.seq}, history_start)
    notes += ranges.notes
    spans = sum(len(v) for v in ranges.spans.values())
    summary = (
        f"{len(commits)} commit(s) of the pipeline ({ranges.resets} reset(s)), {spans} ranges "
        f"over {len(ranges.spans)} partitions: no gap, no overlap"
    )
    if effect.undone:
        summary += f" ({len(effect.undone)} commit(s) undone by a RESTORE left out)"
    if ranges.without_start:
        summary += f" ({ranges.without_start} commits without a recorded start: direction only)"
    checks.append(("ranges", ranges.problems, summary))

    first_seq_kept = any(
        parse_user_metadata(h.get("userMetadata"), config.pipeline_id) is not None
        and parse_user_metadata(h.get("userMetadata"), config.pipeline_id).seq == 1  # type: ignore[union-attr]
        for h in history
    )
    audit = Audit(ranges, cleaned=history_start > 0 and not first_seq_kept)
    main, why = read_positions(table, TABLE_TIMESTAMP)
    dead_uri = config.dead_letter_table
    dead_table = open_table(dead_uri, config) if dead_uri else None
    dead, dead_why = (
        read_positions(dead_table, DEAD_LETTER_TIMESTAMP) if dead_table is not None else (None, "")
    )
    if dead_table is not None and dead is None:
        raise CommandError(f"dead-letter table {dead_uri}: {dead_why}")
    mode = config.delta.mode
    extra, _ = kafka_partitions(admin, set(stored.offsets) - set(partitions))
    on_kafka = {**partitions, **extra}
    marks = admin.watermarks(on_kafka)

    def unknown_start(tp: TP) -> int | None:
        # The pipeline's first batch records no start: it began at Kafka's earliest offset
        # (the first-read rule says earliest; records deleted since are not judged), else at
        # the latest offset then (or a configured one), of which the lowest row is the best
        # bound left.
        if tp[1] in marks.earliest.get(tp[0], {}):
            earliest = marks.earliest[tp[0]][tp[1]]
            first = first_offset(
                *tp,
                stored={},
                starting=config.kafka.starting_offsets,
                earliest=earliest,
                latest=earliest + 1,
            )
            if first == earliest:
                return earliest
        lows = [
            pc.min(x.offsets[tp]).as_py()
            for x in (main, dead)
            if x is not None and tp in x.offsets and len(x.offsets[tp])
        ]
        return min(lows) if lows else None

    judged = {tp: judged_spans(audit, tp, unknown_start(tp)) for tp in ranges.spans}
    if main is None:
        skips.append(f"rows: {why}: the row audit of the table is skipped")
    else:
        problems, summary, more = check_rows(main, audit)
        checks.append(("rows", problems, summary))
        notes += more
    if main is not None or dead is not None:
        checks.append(("duplicates", *check_duplicates(main, dead, mode, ranges)))
    if main is not None and mode == "append" and not against_kafka:
        unfilled = count_unfilled(main, dead, judged)
        if unfilled:
            notes.append(
                f"rows: {unfilled} position(s) in the committed ranges hold no row in either "
                "table: transaction markers or compacted records, or lost rows "
                "(--against-kafka tells them apart)"
            )
    checks.append(("dead letters", *check_dead_letters(dead, audit, stored.offsets)))

    if against_kafka:
        if main is None:
            skips.append(f"kafka: {why}: records cannot be matched to rows")
        else:
            wanted = {tp: spans for tp, spans in judged.items() if tp[1] in on_kafka.get(tp[0], [])}
            read = read_kafka(config, wanted, marks)
            problems, summary, more = check_against_kafka(
                read, main, dead, mode, ranges, route=config.table_route
            )
            checks.append(("kafka", problems, summary))
            notes += more

    try:
        group: Offsets | None = admin.committed(config.kafka.consumer_group, on_kafka)
    except GroupNotAuthorizedError as exc:
        # The group only mirrors the table's offsets for lag tools: the table is judged whole
        # or not without it.
        group = None
        skips.append(f"group: consumer group {config.kafka.consumer_group} is unreadable: {exc}")
    group_problems, retention = [], []
    for t, ps in sorted(stored.offsets.items()):
        for p, offset in sorted(ps.items()):
            if p not in on_kafka.get(t, []):
                continue
            want = offset if group_expected is None else group_expected.get(t, {}).get(p, offset)
            if group is not None and group.get(t, {}).get(p) != want:
                tables = "the table stores" if group_expected is None else "the tables' least is"
                group_problems.append(
                    f"{t}:{p}: consumer group {config.kafka.consumer_group} has "
                    f"{group.get(t, {}).get(p, 'no committed offset')}, {tables} "
                    f"{want} (a running pipeline's commit-back may trail by a batch; the "
                    "next batch or run aligns them)"
                )
            earliest = marks.earliest[t][p]
            if offset < earliest and t not in recreated:  # the old topic's: see `topics`
                retention.append(
                    f"{t}:{p}: the table stores offset {offset} but Kafka's earliest is "
                    f"{earliest}: {earliest - offset} offsets expired before the pipeline "
                    "read them"
                )
    count = sum(len(ps) for ps in stored.offsets.values())
    if group is not None:
        checks.append(
            (
                "group",
                group_problems,
                f"consumer group offsets equal the table's ({count} partitions)",
            )
        )
    checks.append(
        ("retention", retention, "no stored offset is below Kafka's earliest (none expired unread)")
    )
    if ids is not None:
        checks.append(("ids", *check_ids(config, ids)))

    for note in notes:
        print(f"note  {note}")
    for skip in skips:
        print(f"skip  {skip}")
    first: str | None = None
    for name, problems, summary in checks:
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            print(f"FAIL  {name}: {problems[0]}{more}")
            first = first or f"{name}: {problems[0]}"
        else:
            print(f"ok    {name}: {summary}")
    if first is not None:
        print(f"verify: FAILED: {first}")
        return 1
    print("verify: OK")
    return 0
