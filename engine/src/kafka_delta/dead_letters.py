"""Dead letters, in one room: records the transform (or decoding) cannot process.

A record is a dead letter when the transform sets ``_error`` on its row. Dead letters go to their
own Delta table with their Kafka position, original key and value and the error, committed
**before** the batch's main commit, so a crash between the two loses none (I7).

What was sent is tracked **by position**, not by the highest stored offset: a dead letter is
sent unless the dead-letter table already holds a row at its ``(topic id, partition, offset)``.
A position's identity includes Kafka's topic id (column ``topic_id``): a topic deleted and
created again under the same name is another topic, and its records' dead letters are sent even
where the old topic had one at the same partition and offset. Rows written before the column
existed (``topic_id`` null) match by the topic's name.
That is what makes every path idempotent without losing anything:

- a batch retried by the same checkpoint finds its txn ``(app_id, batch_id)`` and writes nothing;
- a batch re-read by another or a new checkpoint finds its dead letters' positions already there;
- a range first read after a rewind (``offsets reset --allow-rewind``, a backfill after
  ``starting_offsets: latest``, a replay after a fix whose transform now rejects records the old
  one accepted) sends the dead letters the table does not hold yet, even below offsets the
  dead-letter table already went past;
- two runs racing on two checkpoints (a retried job beside a live one), and the tables of a
  pipeline that share one dead-letter table, send each record once: see below.

The dead-letter table's commits carry the pipeline's record too (tag, txn, seq), but its stored
offsets only ever move forward (per partition, the furthest batch end that sent dead letters):
the main table's fencing rule (:mod:`kafka_delta.offsets.fencing`) is not theirs. Their fence is
the pipeline's commit number, ``seq``: the queue reads the pipeline's newest commit in the table
first, then the positions the table holds, and its commit lands only on top of that commit
(``expected_seq``, :func:`kafka_delta.offsets.fencing.check_unmoved`); when another commit of the
pipeline came in between, nothing is written and the queue reads the table again. Reading the
positions alone was not enough: two runs could both find a position missing and both send it
(the ops harness found it, ``produce_bad(15, 90) race``: the second run's commit, retried after
losing the race to create the table, went on top of the first's with the same 40 records). The
main table's fence never caught it: the dead letters are committed before it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import kafka_delta.crash_points as crash_points
from kafka_delta.contract import DEAD_LETTER_COLUMN
from kafka_delta.offsets.fencing import RESTART, FencingError, TableMovedError
from kafka_delta.offsets.model import BatchCommit, Offsets, StoredOffsets, partitions_of
from kafka_delta.offsets.stored import OffsetsExpiredError

if TYPE_CHECKING:
    from kafka_delta.engine import Materialized, OffsetStore, Sink

log = logging.getLogger(__name__)

# The columns of a dead-letter row: the original Kafka record and the error.
DEAD_LETTER_KAFKA_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value")
POSITION = ["topic", "partition", "offset"]
# Kafka's id of the record's topic (null when the broker does not report one).
TOPIC_ID = "topic_id"

Position = tuple[str, int, int]
# Sends of one batch's dead letters that found the table changed (a commit of the pipeline by
# another run) before giving up: each lost one means another run's commit landed.
_MAX_ATTEMPTS = 10
TopicIds = Mapping[str, str] | None


class DeadLetterError(RuntimeError):
    """A record cannot be processed and dead letters are disabled."""


def require_dead_letter_positions(columns: list[str]) -> None:
    missing = set(POSITION) - set(columns)
    if missing:
        raise DeadLetterError(
            f"the transform marked rows with {DEAD_LETTER_COLUMN} but dropped {sorted(missing)}; "
            "dead letters need the Kafka position to find the original record"
        )


def split_dead_letters(data: pa.Table) -> tuple[pa.Table, pa.Table | None]:
    """(rows for the table without the ``_error`` column, rows marked as dead letters)."""
    if DEAD_LETTER_COLUMN not in data.column_names:
        return data, None
    marked = pc.is_valid(data.column(DEAD_LETTER_COLUMN))
    good = data.filter(pc.invert(marked)).drop_columns([DEAD_LETTER_COLUMN])
    if not pc.any(marked).as_py():
        return good, None
    require_dead_letter_positions(data.column_names)
    dead = data.filter(marked).select([*POSITION, DEAD_LETTER_COLUMN])
    return good, dead


def split_dead_letters_df(out: DataFrame) -> Materialized:
    """:func:`split_dead_letters` for a sink that writes DataFrames: ``out`` is cached so the
    dead-letter check, the row count and the write compute the transform (and read Kafka)
    once; only the dead letters' positions and errors come to the driver."""
    from kafka_delta.engine import Materialized

    cached = out.persist()
    if DEAD_LETTER_COLUMN not in out.columns:
        return Materialized(cached, None, release=cached.unpersist)
    marked = F.col(DEAD_LETTER_COLUMN).isNotNull()
    dead_rows = cached.filter(marked)
    dead: pa.Table | None = None
    if set(POSITION) <= set(out.columns):
        # One job computes (and caches) every partition and brings back only the dead letters'
        # positions; an isEmpty() first would scan the partitions in several growing jobs.
        found = dead_rows.select(*POSITION, DEAD_LETTER_COLUMN).toArrow()
        dead = found if found.num_rows else None
    elif not dead_rows.isEmpty():
        require_dead_letter_positions(out.columns)
    good = cached.filter(~marked).drop(DEAD_LETTER_COLUMN)
    return Materialized(good, dead, release=cached.unpersist)


# What a clean write fails with when it meets a dead letter (:func:`clean_rows`).
CLEAN_WRITE_MARK = "kafka_delta: a dead letter in a batch written as clean"


def clean_rows(out: DataFrame) -> DataFrame:
    """``out`` to be written as a batch without dead letters, in the write's own job: its
    ``_error`` column dropped, and a row that carries one fails the job
    (``raise_error(CLEAN_WRITE_MARK)``) before the write can commit, so a batch with a dead
    letter is never committed without it. A filter, not a projection: the optimizer cannot
    prune it, and every row's ``_error`` is looked at once, in the job that writes the rows."""
    if DEAD_LETTER_COLUMN not in out.columns:
        return out
    clean = F.when(F.col(DEAD_LETTER_COLUMN).isNull(), F.lit(True)).otherwise(
        F.raise_error(F.lit(CLEAN_WRITE_MARK))
    )
    return out.filter(clean).drop(DEAD_LETTER_COLUMN)


def dead_letter_records(df: DataFrame, dead: pa.Table, topic_ids: TopicIds = None) -> DataFrame:
    """The original Kafka records of the dead letters, with their error and their topic's id
    (``topic_ids``: the batch's), as a DataFrame the dead-letter sink writes like any batch
    (from the executors).

    Only the marked positions (a few rows, broadcast) are looked up again in the batch's input
    (its offset ranges are fixed, so the records are the same), which costs nothing when no
    record is bad.
    """
    spark = df.sparkSession
    ids = dict(topic_ids or {})
    positions = spark.createDataFrame(
        [
            {**row, TOPIC_ID: ids.get(row["topic"])}
            for row in dead.select([*POSITION, DEAD_LETTER_COLUMN]).to_pylist()
        ],
        f"topic string, partition int, offset long, {DEAD_LETTER_COLUMN} string, {TOPIC_ID} string",
    ).withColumnRenamed(DEAD_LETTER_COLUMN, "error")
    joined = df.join(F.broadcast(positions), POSITION, "inner")
    return joined.select(
        *(_original(joined, c) for c in DEAD_LETTER_KAFKA_COLUMNS), "error", TOPIC_ID
    )


def _original(df: DataFrame, column: str) -> Column:
    """``column`` as the Kafka record had it. A decoded batch (:mod:`kafka_delta.decoding`) no
    longer carries the value's bytes (nor the key's, when the key is decoded): the decoder keeps
    them in ``_raw_value`` / ``_raw_key`` for the records it could not decode; a record the
    transform rejects after decoding keeps its position, and its bytes stay in Kafka."""
    raw = f"_raw_{column}"
    if column not in ("key", "value") or raw not in df.columns:
        return F.col(column)
    if column in df.columns and dict(df.dtypes)[column] == "binary":
        return F.coalesce(F.col(raw), F.col(column)).alias(column)
    return F.col(raw).alias(column)


def held_among(
    found: list[dict[str, object]], dead: pa.Table, topic_ids: TopicIds = None
) -> set[Position]:
    """The positions of ``dead`` among ``found`` (rows of the dead-letter table: ``topic``,
    ``partition``, ``offset``, and the topic id where the table has the column) for the same
    topic (see the module docstring)."""
    held_ids: dict[Position, set[str | None]] = {}
    for row in found:
        position = (str(row["topic"]), int(row["partition"]), int(row["offset"]))  # type: ignore[call-overload]
        held_ids.setdefault(position, set()).add(row.get(TOPIC_ID))
    ids = dict(topic_ids or {})
    held: set[Position] = set()
    for t, p, o in zip(
        dead.column("topic").to_pylist(),
        dead.column("partition").to_pylist(),
        dead.column("offset").to_pylist(),
        strict=True,
    ):
        position = (t, int(p), int(o))
        there = held_ids.get(position)
        if there and (None in there or ids.get(t) is None or ids[t] in there):
            held.add(position)
    return held


def unsent_dead_letters(dead: pa.Table, held: set[Position]) -> pa.Table:
    """The dead letters at positions the dead-letter table does not hold yet."""
    if not held or dead.num_rows == 0:
        return dead
    keep = [
        (t, int(p), int(o)) not in held
        for t, p, o in zip(
            dead.column("topic").to_pylist(),
            dead.column("partition").to_pylist(),
            dead.column("offset").to_pylist(),
            strict=True,
        )
    ]
    return dead.filter(pa.array(keep, pa.bool_()))


def forward_only(commit: BatchCommit, sent: Offsets) -> BatchCommit:
    """The batch's commit as the dead-letter table records it: per partition the furthest of
    its end and what the table already stores, so a rewound batch never moves the dead-letter
    table's offsets backwards (and its start is not recorded: it is not a contiguous range)."""
    ends = {t: dict(parts) for t, parts in sent.items()}
    for t, parts in commit.end_offsets.items():
        for p, o in parts.items():
            ends.setdefault(t, {})[p] = max(o, ends.get(t, {}).get(p, o))
    return replace(commit, end_offsets=ends, start_offsets=None, rewound=())


class DeadLetterQueue:
    """Sends a batch's dead letters to their table, idempotently, before the main commit."""

    def __init__(
        self,
        sink: Sink | None,
        offsets: OffsetStore | None,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.sink = sink
        self.offsets = offsets
        self.storage_options = dict(storage_options or {})
        # Who reads the positions the dead-letter table holds: its sink, the way it reads the
        # table (:meth:`kafka_delta.engine.Sink.positions_held`: delta-rs, or Spark alone).
        self._held: Callable[..., set[Position]] | None = (
            sink.positions_held if sink is not None else None
        )

    def _stored(self, commit: BatchCommit, table: str) -> tuple[StoredOffsets | None, int | None]:
        """(the pipeline's stored offsets in the dead-letter table ``table``, its newest commit
        number there: 0 without one; None when unknown, and then nothing is pinned)."""
        if self.offsets is None:
            return None, None
        try:
            stored = self.offsets.read(lambda: partitions_of(commit.end_offsets))
        except OffsetsExpiredError as exc:
            log.warning("cannot read the offsets %s stores: %s", table, exc)
            return None, exc.seq
        return stored, stored.seq if stored is not None else 0

    def send(self, df: DataFrame, dead: pa.Table, commit: BatchCommit) -> int:
        """Commit ``dead`` (positions and errors of the batch ``df`` read) to the dead-letter
        table; how many this call sent (0 when every one was already there)."""
        if self.sink is None:
            first = dead.slice(0, 1).to_pylist()[0]
            raise DeadLetterError(
                f"{dead.num_rows} record(s) of batch {commit.batch_id} cannot be processed, "
                f"first {first['topic']}[{first['partition']}] offset {first['offset']}: "
                f"{first[DEAD_LETTER_COLUMN]}. Dead letters are disabled "
                "(dead_letters.enabled: false), so the pipeline stops instead of dropping them."
            )
        table = self.sink.table_uri
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            # What the pipeline last committed here first, the positions the table holds after:
            # the commit lands only on top of that commit (the table's fence), so the positions
            # read are all the pipeline sent, whichever run or table sent them.
            stored, seen = self._stored(commit, table)
            assert self._held is not None  # the sink's, set with it
            held = self._held(table, self.storage_options, dead, commit.topic_ids)
            unsent = unsent_dead_letters(dead, held)
            if unsent.num_rows == 0:
                log.info(
                    "batch %d: its %d dead letter(s) are already in %s: nothing sent",
                    commit.batch_id,
                    dead.num_rows,
                    table,
                )
                return 0
            record = forward_only(commit, stored.offsets if stored is not None else {})
            records = dead_letter_records(df, unsent, commit.topic_ids)
            try:
                result = self.sink.commit_batch(records, record, expected_seq=seen)
            except TableMovedError as exc:
                # Another run committed here meanwhile (its dead letters, perhaps these).
                log.info(
                    "batch %d: the dead-letter table %s changed while its dead letters were "
                    "sent (%s); reading it again (attempt %d)",
                    commit.batch_id,
                    table,
                    str(exc).split(". ")[0],
                    attempt,
                )
                continue
            break
        else:
            raise FencingError(
                f"batch {commit.batch_id}: the dead-letter table {table} changed "
                f"{_MAX_ATTEMPTS} times in a row while its dead letters were sent; too many "
                f"concurrent runs. {RESTART}"
            )
        if result.written:
            log.warning(
                "batch %d: %d record(s) sent to the dead-letter table %s",
                commit.batch_id,
                unsent.num_rows,
                table,
            )
        else:
            log.info(
                "replayed batch %d: its dead letters are already in %s: nothing sent",
                commit.batch_id,
                table,
            )
        crash_points.reached("after_dead_letters")
        return unsent.num_rows if result.written else 0
