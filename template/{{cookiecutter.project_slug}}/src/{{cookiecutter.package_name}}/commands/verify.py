"""``offsets verify``: walk the pipeline's commits in the retained Delta log and prove the table
is whole. Exit 0 only when every check holds; otherwise the first problem is named (exit 1).

Checks, in order:

1. **ranges**: per partition, each batch starts where the pipeline's previous commit ended (no
   gap: records skipped; no overlap: records written twice); a batch id of one checkpoint is
   committed once; the fence ``seq`` counts up by one; stored offsets never move backwards
   except by an audited reset (``--allow-rewind``) or a recreated topic (``rewound``). Commits
   written before batches recorded their start (``start`` in the metadata) are contiguous by
   construction of the fencing check, so only their direction is checked.
2. **group**: the consumer group's committed offsets equal the table's stored offsets.
3. **retention**: no stored offset is below Kafka's earliest (records expired unread).
4. **dead letters**: every dead letter's position lies inside a committed range (positions
   after the table's stored offsets belong to a batch not committed yet and are noted).
5. **ids** (``--ids COLUMN``): the column holds no value twice.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from ..config import PipelineConfig
from ..offsets import Offsets, describe_reset
from .table_log import (
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

TP = tuple[str, int]


@dataclass
class Ranges:
    """The offset ranges ``[lo, hi)`` the pipeline committed, per partition (``lo`` None: the
    start is unknown, before the retained log or never recorded)."""

    spans: dict[TP, list[tuple[int | None, int]]] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    resets: int = 0
    without_start: int = 0

    _merged: dict[TP, tuple[list[int], list[int]]] = field(default_factory=dict)

    def covers(self, tp: TP, offset: int) -> bool:
        """True when ``offset`` lies in a committed range of ``tp`` (a binary search over the
        merged ranges: a dead-letter table may hold many rows, the log many commits)."""
        if tp not in self._merged:
            merged: list[list[int]] = []
            for lo, hi in sorted(((-1 if lo is None else lo), hi) for lo, hi in self.spans[tp]):
                if merged and lo <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            self._merged[tp] = ([m[0] for m in merged], [m[1] for m in merged])
        los, his = self._merged[tp]
        i = bisect.bisect_right(los, offset) - 1
        return i >= 0 and offset < his[i]


def _where(commit: PipelineCommit) -> str:
    r = commit.record
    return f"version {commit.version} (batch {r.batch_id} of {r.app_id})"


def walk(commits: list[PipelineCommit]) -> Ranges:
    """Check the commits (oldest first) and collect their ranges."""
    out = Ranges()
    ends: dict[TP, int] = {}
    batches: dict[tuple[str, int], int] = {}
    previous_seq: int | None = None
    for commit in commits:
        r = commit.record
        if previous_seq and r.seq and r.seq != previous_seq + 1:
            out.problems.append(
                f"the pipeline's commit count (fence seq) jumps from {previous_seq} to {r.seq} "
                f"at {_where(commit)}: a commit of the pipeline is missing from the log"
            )
        previous_seq = r.seq or previous_seq
        if r.reset is not None:
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
                rewound = tp in r.rewound
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
    return out


def _dead_letter_positions(config: PipelineConfig) -> pa.Table | None:
    uri = config.dead_letter_table
    table = open_table(uri, config.delta.storage_options) if uri else None
    if table is None:
        return None
    return table.to_pyarrow_table(columns=["topic", "partition", "offset"])


def check_dead_letters(
    positions: pa.Table | None, ranges: Ranges, stored: Offsets
) -> tuple[list[str], str]:
    """(problems, summary) of the dead letters' positions against the committed ranges."""
    if positions is None:
        return [], "no dead-letter table"
    problems: list[str] = []
    pending = 0
    seen: set[tuple[str, int, int]] = set()
    for t, p, o in zip(
        positions.column("topic").to_pylist(),
        positions.column("partition").to_pylist(),
        positions.column("offset").to_pylist(),
        strict=True,
    ):
        if (t, p, o) in seen:
            problems.append(f"the dead letter at {t}:{p} offset {o} is in the table twice")
        seen.add((t, p, o))
        if ranges.covers((t, p), o):
            continue
        end = stored.get(t, {}).get(p)
        if end is None or o >= end:
            pending += 1  # its batch's main commit has not landed yet
            continue
        problems.append(
            f"the dead letter at {t}:{p} offset {o} lies outside every range the pipeline "
            "committed (the table's offsets skipped it)"
        )
    summary = f"{positions.num_rows} dead letters, all inside the committed ranges"
    if pending:
        summary += f" ({pending} beyond the stored offsets: from a batch not committed yet)"
    return problems, summary


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


def run_verify(config: PipelineConfig, ids: str | None = None) -> int:
    table = open_existing(config.delta.table, config)
    admin = admin_for(config)
    partitions, _ = kafka_partitions(admin, config.kafka.topics)
    stored, _ = stored_offsets(table, config, partitions)
    history = table.history(None)
    history_start = min((int(h["version"]) for h in history), default=0)
    commits = commits_in(history, config.pipeline_id)
    print(
        f"verify pipeline {config.pipeline_id} on {config.delta.table} (Delta version "
        f"{table.version()}, {row_count(table)} rows; log retained from version {history_start})"
    )
    checks: list[tuple[str, list[str], str]] = []

    ranges = walk(commits)
    spans = sum(len(v) for v in ranges.spans.values())
    summary = (
        f"{len(commits)} commit(s) of the pipeline ({ranges.resets} reset(s)), {spans} ranges over "
        f"{len(ranges.spans)} partitions: no gap, no overlap"
    )
    if ranges.without_start:
        summary += f" ({ranges.without_start} commits without a recorded start: direction only)"
    checks.append(("ranges", ranges.problems, summary))

    extra, _ = kafka_partitions(admin, set(stored.offsets) - set(partitions))
    on_kafka = {**partitions, **extra}
    group = admin.committed(config.kafka.consumer_group, on_kafka)
    marks = admin.watermarks(on_kafka)
    group_problems, retention = [], []
    for t, ps in sorted(stored.offsets.items()):
        for p, offset in sorted(ps.items()):
            if p not in on_kafka.get(t, []):
                continue
            if group.get(t, {}).get(p) != offset:
                group_problems.append(
                    f"{t}:{p}: consumer group {config.kafka.consumer_group} has "
                    f"{group.get(t, {}).get(p, 'no committed offset')}, the table stores "
                    f"{offset} (a running pipeline's commit-back may trail by a batch; the "
                    "next batch or run aligns them)"
                )
            earliest = marks.earliest[t][p]
            if offset < earliest:
                retention.append(
                    f"{t}:{p}: the table stores offset {offset} but Kafka's earliest is "
                    f"{earliest}: {earliest - offset} offsets expired before the pipeline "
                    "read them"
                )
    count = sum(len(ps) for ps in stored.offsets.values())
    checks.append(
        ("group", group_problems, f"consumer group offsets equal the table's ({count} partitions)")
    )
    checks.append(
        ("retention", retention, "no stored offset is below Kafka's earliest (none expired unread)")
    )
    dead_problems, dead_summary = check_dead_letters(
        _dead_letter_positions(config), ranges, stored.offsets
    )
    checks.append(("dead letters", dead_problems, dead_summary))
    if ids is not None:
        checks.append(("ids", *check_ids(config, ids)))

    for note in ranges.notes:
        print(f"note  {note}")
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
