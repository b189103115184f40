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
it (:func:`group_offsets`): what is not yet in every table shows as lag.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kafka_delta.config import PipelineConfig
from kafka_delta.contract import DEAD_LETTER_COLUMN, Transform
from kafka_delta.engine import Engine
from kafka_delta.offsets.model import Offsets, StoredOffsets
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


def stream_start(tables: Sequence[TableRun], found: Sequence[StoredOffsets | None]):
    """Where the stream resumes when its checkpoint is new: per partition, the lowest offset
    the tables that read it store (a partition one of them stores nothing for is left out: it
    starts by the rule of first reads). One table: its stored offsets as they are."""
    if len(tables) == 1:
        return found[0]
    present = [s for s in found if s is not None]
    if not present:
        return None
    offsets: Offsets = {}
    partitions = {(t, p) for s in present for t, parts in s.offsets.items() for p in parts}
    for t, p in sorted(partitions):
        held = [
            (s.offsets.get(t, {}).get(p) if s is not None else None)
            for run, s in zip(tables, found, strict=True)
            if t in run.topics
        ]
        if held and all(o is not None for o in held):
            offsets.setdefault(t, {})[p] = min(o for o in held if o is not None)
    ids: dict[str, str] = {}
    for s in present:
        ids.update(s.topic_ids or {})
    return replace(present[0], offsets=offsets, topic_ids=ids or None)


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
