"""Where a run starts: resume planning, before the query starts (docs/design.md section 4: I9).

Spark resumes a checkpoint that planned a batch from its own offset log; a new checkpoint starts
from what the tables store. Before the query starts, :class:`ResumePlanner` reads each table's
stored offsets, judges the checkpoint against them (:mod:`.recovery.verdict`: resume, set it
aside, or stop with one sentence), handles topics deleted and created again
(:mod:`.offsets.topic_identity`) and says where the run starts. A pipeline of one table is a
list of one: every rule below gives the one table's own answer (its stored offsets as they are,
no table new or back, nothing held below the start).

Of several tables (:mod:`.routing`, I13), where they stand apart:

- a new checkpoint starts where the table furthest behind ends, per partition
  (:func:`stream_start`); a partition one table stores nothing for starts by the rule of first
  reads (Kafka's earliest once the pipeline stored offsets);
- a table further on holds everything below its own stored offsets (:func:`held_below`): its
  range of a batch starts there (:func:`.routing.table_range`), so its records below are not
  written again and its commit starts exactly where it stores.

A table added to a pipeline that already ran (:func:`new_tables`): each table's commits name
the pipeline's tables as of their batch (:attr:`.offsets.model.BatchCommit.tables`). A table
that holds no commit of the pipeline is new when no other table's newest commit names it: it
joins where the stream stands (on the checkpoint it has, or where a new one starts from the
other tables; :func:`joining_first_reads`), and earlier records are not backfilled. A table
they name and that holds nothing was deleted or replaced: on the checkpoint that wrote it, the
run stops with that sentence, as for a pipeline of one table; on a new checkpoint, it is read
again from the rule of first reads while the other tables pass over what they hold (which is
also how a table added later is filled with the earlier records: delete it and the
checkpoint). A table that holds commits and that the others' newest commits leave out was
removed from ``tables:`` for a while and is back (:func:`readded_tables`): it stands where it
stopped, so a checkpoint that went on without it is set aside and the run resumes from the
tables, where it catches up and the others pass over what they hold below it.

The rule of first reads also fences every batch (:func:`first_positions`): how far a batch may
begin a partition the table stores nothing for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from kafka_delta.config import PipelineConfig
from kafka_delta.engine import Source
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.offsets.model import (
    BatchCommit,
    Offsets,
    StoredOffsets,
    app_id,
    first_offset,
    parse_user_metadata,
    starting_offsets_option,
)
from kafka_delta.offsets.topic_identity import forget_recreated, recreated_topics
from kafka_delta.recovery.checkpoint import CheckpointLog, CheckpointMismatchError
from kafka_delta.recovery.verdict import Verdict, combined, judge, set_aside
from kafka_delta.routing import TableRun

# The start-up lines are the pipeline's: log configs and tools select them by its logger.
log = logging.getLogger("kafka_delta.pipeline")


@dataclass
class Resume:
    """Where a run starts, as :meth:`ResumePlanner.plan` found it."""

    # Where a new checkpoint starts (None: no table stores offsets of the pipeline).
    stored: StoredOffsets | None
    # Kafka's ids of the topics, as this run found them.
    topic_ids: dict[str, str]
    # Topics deleted and created again since the tables stored their offsets (read from their
    # start, kafka.fail_on_data_loss off), and their stored offsets before (the old topics' ends).
    recreated: set[str] = field(default_factory=set)
    recreated_from: Offsets = field(default_factory=dict)
    # Where the checkpoint was moved, when the tables left it behind (None: kept).
    set_aside_as: str | None = None


class ResumePlanner:
    """Plans where a run of ``tables`` starts on ``checkpoint``; see the module docstring."""

    def __init__(
        self,
        config: PipelineConfig,
        checkpoint: CheckpointLog,
        admin: KafkaAdmin,
        tables: Sequence[TableRun],
        source: Source,
    ) -> None:
        self.config = config
        self.checkpoint = checkpoint
        self.admin = admin
        self.tables = tables
        self.source = source

    def plan(self) -> Resume:
        """Stored offsets to start from when the checkpoint is new; judges the checkpoint
        against the tables first (:mod:`.recovery`): one the tables moved past is set aside and
        the run resumes from the tables, one ahead of them without explanation stops. Sets each
        table's ``initial`` offsets and whether it is ``joining`` the pipeline."""
        found = self._stored_offsets()
        self._find_new_tables(found)
        # Where a new checkpoint starts: the table furthest behind, per partition (a table new
        # to the pipeline joins where the others stand).
        staying = [(r, h) for r, h in zip(self.tables, found, strict=True) if not r.joining]
        stored = stream_start(
            [r for r, _ in staying],
            [h for _, h in staying],
            lambda parts: self.admin.watermarks(parts).earliest,
        )
        resume = Resume(stored, self.admin.topic_ids(self.config.kafka.topics))
        recreated = recreated_topics(stored, resume.topic_ids)
        if stored is not None and recreated:
            return self._start_recreated_over(resume, stored, recreated)
        resume.set_aside_as = self._judge_checkpoint(found, stored)
        return resume

    def _stored_offsets(self) -> list[StoredOffsets | None]:
        """What each table stores of the pipeline, as it stands for it (its own topics, of
        several tables); each table's ``initial`` offsets."""
        found: list[StoredOffsets | None] = []
        for run in self.tables:
            held = run.engine.offset_store.read(lambda run=run: self.admin.partitions(run.topics))
            held = run.scoped_stored(held)
            found.append(held)
            run.initial = held.offsets if held is not None else {}
        return found

    def _find_new_tables(self, found: Sequence[StoredOffsets | None]) -> None:
        """Marks the tables new to the pipeline (``joining``); stops the run, with its sentence,
        on a table that holds nothing on a checkpoint that committed batches and is not new."""
        # A table with no commit of the pipeline is new to it, or was deleted (new_tables).
        # On a checkpoint that planned its first batch and finished none, no table is new: each
        # is at its first batch, whose start the first run planned by the rule of first reads
        # (a table that committed it before a crash between the tables skips it as a replay).
        new = (
            set()
            if self.checkpoint.has_plan() and not self.checkpoint.has_progress()
            else new_tables(self.tables, found, self.config.pipeline_id, self.finished)
        )
        for run, held in zip(self.tables, found, strict=True):
            run.joining = new is not None and run.name in new
            if held is None and not run.joining and self.checkpoint.has_progress():
                unknown = (
                    ", or is new to it (the other tables' commits that would tell are cleaned "
                    "up from their logs)"
                    if new is None
                    else ""
                )
                # Without the checkpoint, a table that holds nothing beside tables that hold
                # offsets reads from Kafka's earliest (stream_start).
                again = (
                    "it from Kafka's earliest offsets (the other tables pass over what they hold)"
                    if any(h is not None for h in found)
                    else f"from {self.config.kafka.starting_offsets} offsets"
                )
                raise CheckpointMismatchError(
                    f"checkpoint {self.config.checkpoint} has committed batches, but table "
                    f"{run.config.delta.table} holds no offsets of pipeline "
                    f"{self.config.pipeline_id!r}: the table was deleted or replaced{unknown}. "
                    f"Restore the table, or delete the checkpoint to re-read {again}."
                )

    def _start_recreated_over(
        self, resume: Resume, stored: StoredOffsets, recreated: dict[str, tuple[str, str]]
    ) -> Resume:
        """Topics deleted and created again: stop with their sentence unless
        kafka.fail_on_data_loss is off; then the new topics start over at their earliest."""
        if self.config.kafka.fail_on_data_loss:
            forget_recreated(stored, recreated, True, {})  # raises: one sentence
        earliest = self.admin.watermarks({t: sorted(stored.offsets[t]) for t in recreated}).earliest
        resume.stored = forget_recreated(stored, recreated, False, earliest)
        resume.recreated = set(recreated)
        resume.recreated_from = {t: dict(stored.offsets[t]) for t in recreated}
        for run in self.tables:  # each table starts the new topic over too
            run.initial = {t: p for t, p in run.initial.items() if t not in recreated}
        log.warning(
            "topic(s) %s were deleted and created again: read from their earliest offset "
            "(kafka.fail_on_data_loss is off)",
            ", ".join(sorted(recreated)),
        )
        if self.checkpoint.has_plan():
            reason = f"it planned batches of the old topic(s) {', '.join(sorted(recreated))}"
            resume.set_aside_as = set_aside(self.checkpoint, reason)
        return resume

    def _judge_checkpoint(
        self, found: Sequence[StoredOffsets | None], stored: StoredOffsets | None
    ) -> str | None:
        """Each table judges the checkpoint by the one rule; one that must stop stops the run,
        one that sets it aside sets it aside (the new checkpoint starts from the tables). Where
        the checkpoint was moved, or None."""
        verdicts = {
            run.name: judge(
                self.checkpoint,
                held,
                self.config.pipeline_id,
                run.engine.offset_store.commit_version,
                run.commit_name,
            )
            for run, held in zip(self.tables, found, strict=True)
        }
        # A table removed from tables: for a while and back stands where it stopped, behind a
        # checkpoint that went on without it: that explains the checkpoint (readded_tables).
        for name in readded_tables(self.tables, found, self.config.pipeline_id, self.finished):
            if verdicts[name].action == "stop":
                verdicts[name] = Verdict(
                    "set_aside",
                    f"table {name} is back in tables: and stands where it stopped, behind it",
                )
        verdict = combined(verdicts)
        if verdict.action == "stop":
            raise CheckpointMismatchError(verdict.reason)
        if verdict.action == "set_aside":
            return set_aside(self.checkpoint, verdict.reason)
        if stored is not None and (reason := self._subscription_the_plan_cannot_follow(stored)):
            # Nothing is lost: the table stores where every topic ended (a dropped topic's
            # offsets are kept for a re-add), and a new checkpoint starts from the table.
            return set_aside(self.checkpoint, reason)
        return None

    def finished(self, commit: BatchCommit, table: str | None) -> bool:
        """Whether this checkpoint completed the batch of a table's ``commit`` (a commit of
        another checkpoint counts as completed)."""
        query_id = self.checkpoint.query_id()
        if query_id is None or commit.app_id != app_id(self.config.pipeline_id, query_id, table):
            return True
        return self.checkpoint.is_committed(commit.batch_id)

    def _subscription_the_plan_cannot_follow(self, stored: StoredOffsets) -> str | None:
        """Why the checkpoint cannot go on with today's ``kafka.topics`` on a source that does
        not follow a changed subscription on a checkpoint (Spark's kafka source), or None.

        Spark's kafka source takes a partition its last plan names and the subscription no
        longer has for data loss ("... are gone"), on every restart of the checkpoint; and it
        starts a topic new to its plan at the earliest offset, so a topic re-added after a stop
        would be read again from its start where the table stores where it ended (and be
        fenced on every restart). The embedded source handles both on the same checkpoint."""
        if self.source.follows_subscription_changes:
            return None
        planned = self.checkpoint.newest_planned()
        if planned is None:
            return None
        plan = set(self.checkpoint.end_offsets(planned))
        dropped = sorted(plan - set(self.config.kafka.topics))
        readded = sorted(
            t for t in self.config.kafka.topics if t not in plan and stored.offsets.get(t)
        )
        if not dropped and not readded:
            return None
        changes = [f"topic(s) {', '.join(dropped)} left kafka.topics"] if dropped else []
        if readded:
            changes.append(
                f"topic(s) {', '.join(readded)} came back, and the table stores where they ended"
            )
        return (
            f"{' and '.join(changes)}; Spark's kafka source cannot follow that on a checkpoint "
            "that planned batches"
        )

    # -- where each table stands, and the start-up lines ---------------------------------------

    def place_tables(self, start: Offsets) -> None:
        """Each table's offsets as of the run's start (``known``), and what it holds below the
        stream's ``start`` (``held_below``: a table further on than the table furthest behind);
        says so for such a table and for a table new to the pipeline."""
        for run in self.tables:
            run.known = {t: dict(parts) for t, parts in run.initial.items()}
            run.held_below = held_below(run.initial, start)
            if run.held_below:
                log.info(
                    "table %s stores more than the table furthest behind (%s): its records "
                    "below are not written again",
                    run.label,
                    run.held_below,
                )
            if run.joining:
                log.info(
                    "table %s is new to pipeline %r: it receives records from where the "
                    "pipeline stands on (%s); earlier records are not backfilled (to read them "
                    "into it: stop the pipeline, delete table %s and the checkpoint, and run: "
                    "the other tables pass over what they hold)",
                    run.label,
                    self.config.pipeline_id,
                    ", ".join(
                        f"{t}[{p}] {o}"
                        for t, parts in sorted(run.scoped(start).items())
                        for p, o in sorted(parts.items())
                    )
                    or "the checkpoint's position",
                    run.config.delta.table,
                )

    def log_start(self, stored: StoredOffsets | None) -> None:
        """Say where this run starts: Spark resumes from its checkpoint once it planned a batch
        there (the table's offsets are then only checked against every batch); a new checkpoint
        starts from the offsets the table stores, or at ``starting_offsets`` without any."""
        where = (
            f"table {self.config.delta.table} stores offsets of pipeline "
            f"{self.config.pipeline_id!r} at {stored.describe()}"
            if stored is not None
            else f"table {self.config.delta.table} holds no offsets of pipeline "
            f"{self.config.pipeline_id!r}"
        )
        if self.checkpoint.has_plan():
            log.info(
                "resuming from checkpoint %s (Spark's offset log decides where); %s, checked "
                "against every batch",
                self.config.checkpoint,
                where,
            )
        elif stored is not None:
            log.info(
                "new checkpoint %s: resuming from the table; %s", self.config.checkpoint, where
            )
        else:
            starting = self.config.kafka.starting_offsets
            log.info(
                "new checkpoint %s: starting at %s%s; %s",
                self.config.checkpoint,
                f"{starting} offsets"
                if isinstance(starting, str)
                else f"offsets {starting_offsets_option(starting)}",
                self._skipped_at_first_start(),
                where,
            )
        again = self._read_again(stored)
        if again is not None:
            log.warning("%s", again)

    def _read_again(self, stored: StoredOffsets | None) -> str | None:
        """The sentence for records this run reads although the table's offset txns say the
        pipeline had passed them (:func:`.offsets.stored.from_the_rows`: log cleanup removed its
        commits, and the rows end before them); None when it reads none."""
        if stored is None or not stored.past_the_rows:
            return None
        start: Offsets = stored.offsets  # a new checkpoint starts where the table ends
        if self.checkpoint.has_plan():  # Spark resumes from its checkpoint
            start = self.checkpoint.resume_position()[2] or start
        ranges = [
            f"{topic}[{p}] {start.get(topic, {}).get(p, 0)}-{end - 1}"
            for topic, parts in sorted(stored.past_the_rows.items())
            for p, end in sorted(parts.items())
            if start.get(topic, {}).get(p, 0) < end
        ]
        if not ranges:
            return None
        return (
            f"this run reads again the records at offsets {', '.join(ranges)} of pipeline "
            f"{self.config.pipeline_id!r}: the table's offset txns say the pipeline had passed "
            "them, but log cleanup removed its commits, and nothing left tells whether they are "
            "records an `offsets reset` skipped, records that gave no row (a filter, dead "
            "letters: sent once) or commits a RESTORE undid. Reading them loses nothing; "
            "records that were skipped on purpose land in the table"
        )

    def _skipped_at_first_start(self) -> str:
        """On the pipeline's first start at ``latest`` (or at offsets of its own), the records
        Kafka still holds that the start skips, said in the start-up line: a start that skips
        records is a choice, and never a silent one."""
        starting = self.config.kafka.starting_offsets
        if starting == "earliest":
            return ""
        try:
            partitions = self.admin.partitions(self.config.kafka.topics)
            marks = self.admin.watermarks(partitions)
        except Exception as exc:  # the line is information: the run itself goes on
            return f" (cannot count the records it skips: {exc})"
        skipped = sum(
            max(
                0,
                first_offset(
                    t,
                    p,
                    stored={},
                    starting=starting,
                    earliest=marks.earliest[t][p],
                    latest=marks.latest[t][p],
                )
                - marks.earliest[t][p],
            )
            for t, parts in partitions.items()
            for p in parts
        )
        if not skipped:
            return ""
        return (
            f", which skips the {skipped} record(s) Kafka holds before it in "
            f"{', '.join(sorted(partitions))} (kafka.starting_offsets: earliest reads them)"
        )


# -- the rules, one table or several ---------------------------------------------------------


def stream_start(
    tables: Sequence[TableRun],
    found: Sequence[StoredOffsets | None],
    earliest: Callable[[dict[str, list[int]]], Offsets] | None = None,
) -> StoredOffsets | None:
    """Where the stream resumes when its checkpoint is new: per partition, the lowest offset
    the tables that stand for it store; a partition one of them stores nothing for starts by
    the rule of first reads once the pipeline stored offsets: at Kafka's ``earliest`` (asked
    only for such partitions), so the tables that store it pass over what they hold. One table: its
    stored offsets (the only table stands for every topic it stores)."""
    present = [s for s in found if s is not None]
    if not present:
        return None
    offsets: Offsets = {}
    first_reads: dict[str, list[int]] = {}
    # In the order the tables store them (one table: its offsets as they are).
    partitions = dict.fromkeys(
        (t, p) for s in present for t, parts in s.offsets.items() for p in parts
    )
    for t, p in partitions:
        held = [
            (s.offsets.get(t, {}).get(p) if s is not None else None)
            for run, s in zip(tables, found, strict=True)
            if run.stands_for(t)
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


def held_below(stored: Offsets, start: Offsets) -> Offsets:
    """The partitions where a table stores more than the stream starts at (or stores where
    the stream starts by the rule of first reads: another table reading them stores none), with
    what it stores: the table holds every record below. Empty for one table (the stream starts
    where it stores)."""
    held: Offsets = {}
    for t, parts in stored.items():
        for p, o in parts.items():
            if o > start.get(t, {}).get(p, -1):
                held.setdefault(t, {})[p] = o
    return held


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
    before a new table's first commit, names a table that never committed). Only tables
    holding commits tell: with none, or with every table holding some (one table), none is
    new."""
    holding = [(run, held) for run, held in zip(tables, found, strict=True) if held is not None]
    if not holding or len(holding) == len(tables):
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
    again (they stand where they stopped; the others moved on). It takes other tables holding
    commits to tell."""
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


def joining_first_reads(start: Offsets, known: Offsets) -> Offsets:
    """Where a table new to the pipeline may begin the partitions it stores nothing for: where
    its first batch starts (the stream's position; nothing below was ever the table's)."""
    return {
        t: {p: o for p, o in parts.items() if p not in known.get(t, {})}
        for t, parts in start.items()
        if any(p not in known.get(t, {}) for p in parts)
    }


def first_positions(
    admin: KafkaAdmin, config: PipelineConfig, start: Offsets, known: Offsets
) -> Offsets:
    """How far a batch may begin each partition of ``start`` that the table stored no offset
    for as this run knows it (``known``: a first batch, a topic or partition new to the
    pipeline): where the pipeline's rule of first reads puts it now
    (:func:`.offsets.first_offset`). The fencing rule refuses a start past it: records Kafka
    still holds would be skipped. Asks Kafka only for such partitions (batch 0 of a first run,
    a partition added), never in a steady batch."""
    new = {t: sorted(p for p in parts if p not in known.get(t, {})) for t, parts in start.items()}
    new = {t: parts for t, parts in new.items() if parts}
    if not new:
        return {}
    marks = admin.watermarks(new)
    return {
        t: {
            p: first_offset(
                t,
                p,
                stored=known,
                starting=config.kafka.starting_offsets,
                earliest=marks.earliest[t][p],
                latest=marks.latest[t][p],
            )
            for p in parts
        }
        for t, parts in new.items()
    }
