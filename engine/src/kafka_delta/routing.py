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
checkpoint after tables stopped at different batches), the rules keep every table exact:

- on the same checkpoint, the batch is planned again and each table that committed it finds
  its txn and writes nothing (a replay); the others write it;
- a new checkpoint starts where the table furthest behind ends, per partition; a table further
  on holds everything below its own stored offsets (:mod:`.resume`: where a run starts, tables
  new to the pipeline or back in it), so its range of a batch starts there
  (:func:`table_range`): its records below are not written again and its commit starts exactly
  where it stores (the fencing rule is unchanged).

The consumer group's committed offset of a partition is the minimum over the tables that read
it (:func:`group_offsets`): what is not yet in every table shows as lag. A table no longer in the
config stays as it is, and no longer counts: neither for the group nor for where a new
checkpoint starts.

A pipeline of one table is a list of one (:func:`table_runs`): its table stands for every topic
it stores, its commits name no table, and each rule here gives what that table alone is given
(its range of a batch is the batch's, its input the batch's records, the group's offsets its
own).

Tombstones (``tombstones:``) are each table's own: the records are decoded once, a row read as a
delete of its key carries the error it has where tombstones are dead letters, and each table
takes it as its setting says (:func:`key_deletes`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce

from pyspark.sql import Column, DataFrame, Observation
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
from kafka_delta.dead_letters import DeadLetterQueue
from kafka_delta.engine import Engine, SinkResult
from kafka_delta.offsets.model import BatchCommit, Offsets, StoredOffsets, app_id


class RoutingError(ValueError):
    """The transform's outputs do not match the configured tables."""


@dataclass
class TableRun:
    """One table of the pipeline, as this run writes it: its config view, engine parts and
    where it stands (offsets of the topics it stands for)."""

    config: PipelineConfig
    engine: Engine
    dead_letters: DeadLetterQueue
    # The table's name in its commits: in its txnAppId (``<pipeline>.<table>.<query id>``) and
    # among the pipeline's tables each commit names. None for a pipeline's only table, whether
    # under ``delta:`` or the one entry of ``tables:``: its commits are a pipeline of one
    # table's (``<pipeline>.<query id>``, naming no table), so its tables and checkpoints run on.
    commit_name: str | None = None
    # The topics whose offsets are the table's own: those it reads, of several tables. None
    # for the only table, whose store is the pipeline's: a topic dropped from kafka.topics keeps
    # its offsets there, and each commit's start names it as the batch's plan does.
    scope: frozenset[str] | None = None
    # The offsets the table stored when this run started, and as of this run's last batch.
    initial: Offsets = field(default_factory=dict)
    known: Offsets = field(default_factory=dict)
    # Partitions where the table stood further on than the stream starts (a lost checkpoint
    # after the tables stopped at different batches), with what it stores: it holds every
    # record below (resume.held_below).
    held_below: Offsets = field(default_factory=dict)
    # New to the pipeline (resume.new_tables), until its first commit: its first batch starts
    # where the stream stands, not by the rule of first reads.
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

    def stands_for(self, topic: str) -> bool:
        """Whether ``topic``'s offsets are this table's own (:attr:`scope`)."""
        return self.scope is None or topic in self.scope

    def scoped(self, offsets: Mapping[str, Mapping[int, int]]) -> Offsets:
        """``offsets`` of the topics this table stands for (a copy)."""
        return {t: dict(parts) for t, parts in offsets.items() if self.stands_for(t)}

    def scoped_stored(self, stored: StoredOffsets | None) -> StoredOffsets | None:
        """What the table stores, of the topics it stands for."""
        return None if stored is None else replace(stored, offsets=self.scoped(stored.offsets))


def table_runs(
    views: Sequence[PipelineConfig],
    parts: Callable[[PipelineConfig], tuple[Engine, DeadLetterQueue]],
) -> list[TableRun]:
    """The pipeline's tables, in commit order, from the config's views of them
    (:meth:`.config.PipelineConfig.table_configs`); ``parts(view)`` builds a table's engine and
    dead-letter queue. Where one table and several differ is said here, once, as data: of
    several, each table's commits name it and it stands for the topics it reads."""
    several = len(views) > 1
    return [
        TableRun(
            view,
            *parts(view),
            commit_name=view.table_name if several else None,
            scope=frozenset(view.kafka.topics) if several else None,
        )
        for view in views
    ]


@dataclass
class TableBatch:
    """One table's share of one micro-batch, as the batch function plans, fences and writes
    it: ``commit`` records the table's range (``start``, its end offsets); ``held_below``: the
    partitions whose records below its range's start the table holds already
    (:func:`table_range`)."""

    run: TableRun
    commit: BatchCommit
    start: Offsets
    held_below: Offsets
    # How far the batch may begin a partition the table stores nothing for (fencing).
    first_reads: Offsets = field(default_factory=dict)
    # The table already has the batch (its txn): nothing is read or written for it.
    replayed: bool = False
    result: SinkResult = field(default_factory=lambda: SinkResult(False, 0, None))
    dead_letters: int = 0


def table_batch(
    run: TableRun, batch: BatchCommit, start: Offsets, query_id: str, tables: Sequence[TableRun]
) -> TableBatch:
    """Table ``run``'s share of the batch ``batch`` (its commit as the pipeline plans it, from
    ``start``): its range (:func:`table_range`) and its own commit: its txnAppId, the offsets,
    topic ids and rewound partitions of the topics it stands for, the pipeline's ``tables``
    that commits name, and its start (recorded for ``offsets verify``)."""
    t_start, t_end, held = table_range(run, start, batch.end_offsets)
    commit = replace(
        batch,
        app_id=app_id(batch.pipeline_id, query_id, run.commit_name),
        end_offsets=t_end,
        topic_ids={t: i for t, i in (batch.topic_ids or {}).items() if t in t_end} or None,
        rewound=tuple(tp for tp in batch.rewound if tp[0] in t_end),
        rewound_from=run.scoped(batch.rewound_from or {}) or None,
        tables=tuple(str(r.commit_name) for r in tables if r.commit_name is not None),
    ).starting_at(t_start)
    return TableBatch(run, commit, t_start, held)


class BatchRead:
    """The batch's records as its tables read them, read from Kafka once for all of them
    (persisted while more than one writes), and the count of what was read: observed while
    the sinks' own jobs run (no extra job); a batch every table has (a replay) reads nothing,
    so nothing is observed."""

    def __init__(self, df: DataFrame, writing: int) -> None:
        self.df = df
        self.writing = writing
        self._observe()

    def _observe(self) -> None:
        self.observation: Observation | None = Observation() if self.writing else None
        observed = (
            self.df
            if self.observation is None
            else self.df.observe(self.observation, F.count(F.lit(1)).alias("records"))
        )
        self.records = observed.persist() if self.writing > 1 else observed

    def renew(self) -> None:
        """Observe the records afresh: a job that failed part way (a clean write that met a
        dead letter) filled the observation with what its finished tasks had counted."""
        self.release()
        self._observe()

    def release(self) -> None:
        if self.writing > 1:
            self.records.unpersist()


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


def table_range(run: TableRun, start: Offsets, end: Offsets) -> tuple[Offsets, Offsets, Offsets]:
    """(start, end, held below) of a table's range of a batch ``[start, end)``: the topics it
    stands for; where it holds records below a partition's start (:attr:`TableRun.held_below`
    above the batch's start), from there on (held below: where the batch's records must reach
    to be written). One table: the batch's range, nothing held below it."""
    t_start, t_end = run.scoped(start), run.scoped(end)
    held: Offsets = {}
    for t, parts in run.held_below.items():
        for p, f in parts.items():
            if p in t_start.get(t, {}) and t_start[t][p] < f:
                held.setdefault(t, {})[p] = f
                t_start[t][p] = f
                t_end.setdefault(t, {})[p] = max(f, t_end.get(t, {}).get(p, f))
    return t_start, t_end, held


def without_held(df: DataFrame, held_below: Offsets) -> DataFrame:
    """The batch's records but those a table holds already: below each ``held_below``
    partition's offset (:func:`table_range`)."""
    if not held_below:
        return df
    held: list[Column] = [
        (F.col("topic") == t) & (F.col("partition") == p) & (F.col("offset") < f)
        for t, parts in held_below.items()
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


def group_offsets(tables: Sequence[TableRun], within: Offsets | None = None) -> Offsets:
    """What every table that reads a partition has stored, per partition: the minimum (the
    consumer group's committed offset; one table: its own); of the partitions ``within`` names
    (a batch's end offsets), when given."""
    group: Offsets = {}
    for run in tables:
        for t, parts in run.known.items():
            for p, o in parts.items():
                current = group.setdefault(t, {}).get(p)
                group[t][p] = o if current is None else min(current, o)
    if within is None:
        return group
    return {
        t: {p: o for p, o in parts.items() if p in within.get(t, {})}
        for t, parts in group.items()
        if t in within
    }
