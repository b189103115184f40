"""One stream into several Delta tables, exactly once per table (I13).

A pipeline with ``tables:`` (:class:`.config.TableConfig`) reads its topics once, in one
streaming query on one checkpoint, and commits each micro-batch to every table in turn. Each
table is a :class:`TableRun`: the sink, offset store and dead-letter queue that a pipeline of
one table has, built from the config's view of that table (:meth:`.config.PipelineConfig.
for_table`). Nothing here is a second copy of a rule: replay (I2), fencing (I6), RESTORE and
reset handling, topic identity and recovery are the one table's rules, applied to each table
with its own txnAppId (``<pipeline>.<table>.<query id>``; a pipeline of one table, whether
under ``delta:`` or as the one entry of ``tables:``, keeps ``<pipeline>.<query id>``, so its
tables and checkpoints run on) and the offsets of what it received (the batch's end offsets of
the topics it reads).

What a table receives of a batch: the records of its topics (topic routing), through the
transform (which may return ``{table: DataFrame}``: bronze and silver from one read), where its
``route`` expression holds (record routing; a dead letter passes every route).

Where the tables stand apart (a crash between two tables' commits of one batch; a lost
checkpoint after tables stopped at different batches), the rules below keep every table exact:

- on the same checkpoint, the batch is planned again and each table that committed it finds
  its txn and writes nothing (a replay); the others write it;
- a new checkpoint starts where the table furthest behind ends, per partition
  (:func:`stream_start`); a table further on holds everything below its own stored offsets,
  so its share of a batch starts there (:func:`share`): its records below are not written again
  and its commit starts exactly where it stores (the fencing rule is unchanged).

The consumer group's committed offset of a partition is the minimum over the tables that read
it (:func:`group_offsets`): what is not yet in every table shows as lag. A table no longer in the
config stays as it is, and no longer counts: neither for the group nor for where a new
checkpoint starts.

A table added to a pipeline that already ran (:func:`new_tables`): each table's commits name
the pipeline's tables as of their batch (:attr:`.offsets.model.BatchCommit.tables`). A table
that holds no commit of the pipeline is new when no other table's newest commit names it: it
joins where the stream stands (on the checkpoint it has, or where a new one starts from the
other tables), and earlier records are not backfilled. A table they name and that holds nothing
was deleted or replaced: on the checkpoint that wrote it, the run stops with that sentence, as
for a pipeline of one table; on a new checkpoint, it is read again from the rule of first reads
while the other tables skip what they hold (which is also how a table added later is filled
with the earlier records: delete it and the checkpoint). A table that holds commits and that the
others' newest commits leave out was removed from ``tables:`` for a while and is back
(:func:`readded_tables`): it stands where it stopped, so a checkpoint that went on without it is
set aside and the run resumes from the tables, where it catches up and the others skip what
they hold.

Tombstones (``tombstones:``) are each table's own: the records are decoded once, a row read as a
delete of its key carries the error it has where tombstones are dead letters, and each table
takes it as its setting says (:func:`key_deletes`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kafka_delta.config import PipelineConfig
from kafka_delta.contract import (
    DEAD_LETTER_COLUMN,
    KEY_DELETE_COLUMN,
    OP_COLUMN,
    RAW_KEY,
    RAW_VALUE,
    Transform,
)
from kafka_delta.engine import Engine
from kafka_delta.offsets.model import BatchCommit, Offsets, StoredOffsets, parse_user_metadata
from kafka_delta.sinks.dead_letters import DeadLetterQueue


class RoutingError(ValueError):
    """The transform's outputs do not match the configured tables."""


@dataclass
class TableRun:
    """One table of the pipeline, as this run writes it: its config view, engine parts and
    where it stands (offsets restricted to the topics it reads)."""

    config: PipelineConfig
    engine: Engine
    dead_letters: DeadLetterQueue
    # The offsets the table stored when this run started, and as of this run's last batch.
    initial: Offsets = field(default_factory=dict)
    known: Offsets = field(default_factory=dict)
    # Partitions where the table stood further on than the stream starts (a lost checkpoint
    # after the tables stopped at different batches): it holds every record below.
    floor: Offsets = field(default_factory=dict)
    # New to the pipeline (new_tables), until its first commit: its first batch starts where
    # the stream stands, not by the rule of first reads.
    joining: bool = False

    @property
    def name(self) -> str | None:
        return self.config.table_name

    @property
    def label(self) -> str:
        return self.name or "default"

    @property
    def topics(self) -> tuple[str, ...]:
        return self.config.kafka.topics

    def restrict(self, offsets: Mapping[str, Mapping[int, int]]) -> Offsets:
        """``offsets`` of the topics this table reads."""
        return {t: dict(parts) for t, parts in offsets.items() if t in self.topics}


def restrict(offsets: StoredOffsets | None, topics: Sequence[str]) -> StoredOffsets | None:
    if offsets is None:
        return None
    return replace(offsets, offsets={t: dict(p) for t, p in offsets.offsets.items() if t in topics})


def stream_start(
    tables: Sequence[TableRun],
    found: Sequence[StoredOffsets | None],
    earliest: Callable[[dict[str, list[int]]], Offsets] | None = None,
):
    """Where the stream resumes when its checkpoint is new: per partition, the lowest offset
    the tables that read it store; a partition one of them stores nothing for starts by the rule
    of first reads once the pipeline stored offsets: at Kafka's ``earliest`` (asked only for
    such partitions), so the tables that store it skip what they hold. One table: its stored
    offsets as they are."""
    if len(tables) == 1:
        return found[0]
    present = [s for s in found if s is not None]
    if not present:
        return None
    offsets: Offsets = {}
    first_reads: dict[str, list[int]] = {}
    partitions = {(t, p) for s in present for t, parts in s.offsets.items() for p in parts}
    for t, p in sorted(partitions):
        held = [
            (s.offsets.get(t, {}).get(p) if s is not None else None)
            for run, s in zip(tables, found, strict=True)
            if t in run.topics
        ]
        if held and all(o is not None for o in held):
            offsets.setdefault(t, {})[p] = min(o for o in held if o is not None)
        elif held:
            first_reads.setdefault(t, []).append(p)
    if first_reads and earliest is not None:
        for t, parts in earliest(first_reads).items():
            for p, o in parts.items():
                offsets.setdefault(t, {})[p] = o
    ids: dict[str, str] = {}
    past: dict[str, dict[int, int]] = {}  # the furthest any table's txns name past its rows
    for s in present:
        ids.update(s.topic_ids or {})
        for t, parts in (s.past_the_rows or {}).items():
            for p, o in parts.items():
                past.setdefault(t, {})[p] = max(o, past.get(t, {}).get(p, o))
    return replace(present[0], offsets=offsets, topic_ids=ids or None, past_the_rows=past or None)


def new_tables(
    tables: Sequence[TableRun],
    found: Sequence[StoredOffsets | None],
    pipeline_id: str,
    finished: Callable[[BatchCommit, str | None], bool],
) -> set[str | None] | None:
    """The tables new to the pipeline: those that hold no commit of it (``found`` None) and
    that no other table's newest commit names. None when that cannot be told: a table holding
    offsets whose newest commit log cleanup removed. ``finished(commit, table)``: whether the
    checkpoint completed the batch of ``commit`` (a table's commit of a batch the run died in,
    before a new table's first commit, names a table that never committed)."""
    holding = [(run, held) for run, held in zip(tables, found, strict=True) if held is not None]
    if len(tables) < 2 or not holding or len(holding) == len(tables):
        return set()
    named = _named(holding, pipeline_id, finished)
    if named is None:
        return None
    return {
        run.name
        for run, held in zip(tables, found, strict=True)
        if held is None and not any(run.name in n for n in named.values())
    }


def readded_tables(
    tables: Sequence[TableRun],
    found: Sequence[StoredOffsets | None],
    pipeline_id: str,
    finished: Callable[[BatchCommit, str | None], bool],
) -> set[str | None]:
    """The tables that hold commits of the pipeline but that the other tables' newest commits,
    naming the pipeline's tables, leave out: removed from ``tables:`` for a while and listed
    again (they stand where they stopped; the others moved on)."""
    holding = [(run, held) for run, held in zip(tables, found, strict=True) if held is not None]
    named = _named(holding, pipeline_id, finished) if len(holding) > 1 else None
    if not named:
        return set()
    back = set()
    for run, _ in holding:
        others = [n for name, n in named.items() if name != run.name and n]
        if others and all(run.name not in n for n in others):
            back.add(run.name)
    return back


def _named(
    holding: Sequence[tuple[TableRun, StoredOffsets]],
    pipeline_id: str,
    finished: Callable[[BatchCommit, str | None], bool],
) -> dict[str | None, set[str]] | None:
    """Per table, the tables its newest commit names (empty: it names none); None when a newest
    commit is not in the log. Of a batch the checkpoint did not finish (the run died in it), the
    commit may name a table that never committed (added by that run): the tables the commit
    before it named count instead (none, when it was the table's first)."""
    named: dict[str | None, set[str]] = {}
    for run, held in holding:
        record = parse_user_metadata(held.user_metadata, pipeline_id)
        if record is None:
            return None
        if finished(record, run.name):
            named[run.name] = set(record.tables)
        else:
            named[run.name] = set(held.earlier_tables or ())
    return named


def joined_at(start: Offsets, known: Offsets) -> Offsets:
    """Where a table new to the pipeline may begin the partitions it stores nothing for: where
    its first batch starts (the stream's position; nothing below was ever the table's)."""
    return {
        t: {p: o for p, o in parts.items() if p not in known.get(t, {})}
        for t, parts in start.items()
        if any(p not in known.get(t, {}) for p in parts)
    }


def key_deletes(df: DataFrame, run: TableRun) -> DataFrame:
    """The batch's records as table ``run`` takes them: the rows the decoder read as deletes of
    their key (:data:`~kafka_delta.contract.KEY_DELETE_COLUMN`) stay deletes where the table's
    ``tombstones`` is ``delete``, and are dead letters with the error they carry where it is
    ``dead_letter`` (what a pipeline of that table alone writes); the mark is dropped."""
    if KEY_DELETE_COLUMN not in df.columns:
        return df
    mark = F.col(KEY_DELETE_COLUMN)
    if run.config.delta.tombstones == "delete":
        kept = {c: F.when(mark.isNull(), F.col(c)) for c in (RAW_KEY, RAW_VALUE) if c in df.columns}
    else:
        kept = {DEAD_LETTER_COLUMN: F.coalesce(F.col(DEAD_LETTER_COLUMN), mark)}
        if OP_COLUMN in df.columns:
            kept[OP_COLUMN] = F.when(mark.isNull(), F.col(OP_COLUMN))
    return df.withColumns(kept).drop(KEY_DELETE_COLUMN)


def floors(table: Offsets, start: Offsets) -> Offsets:
    """The partitions where a table stores more than the stream starts at (or stores where
    the stream starts by the rule of first reads: another table reading them stores none)."""
    ahead: Offsets = {}
    for t, parts in table.items():
        for p, o in parts.items():
            if o > start.get(t, {}).get(p, -1):
                ahead.setdefault(t, {})[p] = o
    return ahead


def share(run: TableRun, start: Offsets, end: Offsets) -> tuple[Offsets, Offsets, Offsets]:
    """(start, end, skipped) of a table's share of a batch ``[start, end)``: the topics it
    reads; where its floor is above the batch's start, from the floor on (``skipped``: the
    floors the batch's records must reach to be written)."""
    t_start, t_end = run.restrict(start), run.restrict(end)
    skipped: Offsets = {}
    for t, parts in run.floor.items():
        for p, f in parts.items():
            if p in t_start.get(t, {}) and t_start[t][p] < f:
                skipped.setdefault(t, {})[p] = f
                t_start[t][p] = f
                t_end.setdefault(t, {})[p] = max(f, t_end.get(t, {}).get(p, f))
    return t_start, t_end, skipped


def without_held(df: DataFrame, skipped: Offsets) -> DataFrame:
    """The batch's records but those below each skipped partition's floor."""
    if not skipped:
        return df
    held: list[Column] = [
        (F.col("topic") == t) & (F.col("partition") == p) & (F.col("offset") < f)
        for t, parts in skipped.items()
        for p, f in parts.items()
    ]
    return df.where(~reduce(lambda a, b: a | b, held))


def table_input(df: DataFrame, run: TableRun, all_topics: Sequence[str]) -> DataFrame:
    """The records a table reads (topic routing)."""
    if set(run.topics) >= set(all_topics):
        return df
    return df.where(F.col("topic").isin(list(run.topics)))


def table_output(
    transform: Transform, df: DataFrame, run: TableRun, names: Sequence[str | None]
) -> DataFrame:
    """The transform's output for a table: the DataFrame it returns, or the table's own of the
    mapping it returns; then the table's ``route`` (a dead letter passes it)."""
    out = transform(df)
    if isinstance(out, Mapping):
        given = set(out)
        wanted = {n for n in names if n is not None}
        if given != wanted:
            raise RoutingError(
                f"the transform returned outputs for table(s) {sorted(map(str, given))}, and "
                f"the config's tables: are {sorted(wanted)}: return one DataFrame, or one per "
                "table, named as in tables:"
            )
        out = out[run.name]
    route = run.config.table_route
    if route is None:
        return out
    keep = F.coalesce(F.expr(route), F.lit(False))
    if DEAD_LETTER_COLUMN in out.columns:
        keep = keep | F.col(DEAD_LETTER_COLUMN).isNotNull()
    return out.where(keep)


def group_offsets(tables: Sequence[TableRun]) -> Offsets:
    """What every table that reads a partition has stored, per partition: the minimum (the
    consumer group's committed offset; one table: its own)."""
    group: Offsets = {}
    for run in tables:
        for t, parts in run.known.items():
            for p, o in parts.items():
                current = group.setdefault(t, {}).get(p)
                group[t][p] = o if current is None else min(current, o)
    return group
