"""Where a run stands in Kafka, batch by batch: where each batch begins, which partitions it moves
below the stored offsets, and the topics' ids its commit records.

The run's start (:mod:`kafka_delta.resume`) says where the tables stood, the ids of the topics
and which were deleted and created again; :class:`RunPositions` keeps that, and the offsets
stored as of the run's last batch, for the batch function (:mod:`kafka_delta.pipeline`), which
plans each batch's commit from it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kafka_delta.offsets.model import Offsets
from kafka_delta.offsets.topic_identity import recreated_while_running

if TYPE_CHECKING:
    from kafka_delta.engine import Source
    from kafka_delta.kafka.admin import KafkaAdmin
    from kafka_delta.recovery.checkpoint import CheckpointLog
    from kafka_delta.resume import Resume

# The batch's lines are the pipeline's: log configs and tools select them by its logger.
log = logging.getLogger("kafka_delta.pipeline")


@dataclass
class RunPositions:
    """The offsets and topic ids a run goes by (plain data: it crosses to the batch function's
    process under Spark Connect with the pipeline)."""

    # Offsets the table held when this run started: where batch 0 of a new checkpoint must
    # begin ({} = nothing stored yet).
    initial: Offsets = field(default_factory=dict)
    # The offsets stored as of the last batch of this run (at first, the table's).
    known: Offsets = field(default_factory=dict)
    # Kafka's ids of the topics, as this run found them; the stored offsets of topics deleted
    # and created again since (read from their start when allowed).
    topic_ids: dict[str, str] = field(default_factory=dict)
    recreated: set[str] = field(default_factory=set)
    # The stored offsets of the recreated topics before they were forgotten (the old topics'
    # ends), recorded with the batch that starts them over.
    recreated_from: Offsets = field(default_factory=dict)

    def start_at(self, resume: Resume) -> None:
        """The query starts where the run's start found the tables
        (:meth:`kafka_delta.resume.ResumePlanner.plan`): from the stored offsets it resumes from
        ({}: none), with the topics' ids and the topics recreated."""
        self.topic_ids = resume.topic_ids
        if resume.recreated:
            self.recreated, self.recreated_from = resume.recreated, resume.recreated_from
        self.initial = resume.stored.offsets if resume.stored is not None else {}
        self.known = {t: dict(parts) for t, parts in self.initial.items()}

    def stored(self, group: Offsets, written: bool) -> None:
        """The batch is committed: the group's offsets are stored (``written``: some table
        wrote it, so the recreated topics' offsets are the new ones from now)."""
        if written:
            self.recreated = set()
        for topic, parts in group.items():
            self.known.setdefault(topic, {}).update(parts)

    def batch_start(
        self,
        batch_id: int,
        end: Offsets,
        checkpoint: CheckpointLog,
        source: Source,
        admin: KafkaAdmin,
    ) -> Offsets:
        """Where the batch really begins, as the checkpoint planned it: the previous batch's
        planned end; for batch 0, the initial offsets the source persisted in the checkpoint
        (Spark's kafka source), else the offsets the table held when this run started (the
        embedded source plans batch 0 from exactly those).

        A partition the previous plan does not name (a topic or partition new to the
        checkpoint) starts where the source starts it: the embedded source at the offset the
        table stores for it, Spark's kafka source at the earliest offset Kafka has.
        """
        if batch_id == 0:
            start = checkpoint.initial_offsets() or self.initial
        else:
            start = checkpoint.end_offsets(batch_id - 1)
        new = {
            t: [p for p in parts if p not in start.get(t, {}) and p in self.initial.get(t, {})]
            for t, parts in end.items()
        }
        new = {t: parts for t, parts in new.items() if parts}
        if not new:
            return start
        if source.new_partitions_start_at_stored_offsets:
            first_reads = {t: {p: self.initial[t][p] for p in parts} for t, parts in new.items()}
        else:
            first_reads = admin.watermarks(new).earliest
        merged = {t: dict(parts) for t, parts in start.items()}
        for t, parts in first_reads.items():
            merged.setdefault(t, {}).update(parts)
        return merged

    def ends_before(self, rewound: Iterable[tuple[str, int]]) -> Offsets:
        """Where the stored offsets of the ``rewound`` partitions stood before the move back."""
        before: Offsets = {}
        for t, p in rewound:
            offset = self.recreated_from.get(t, {}).get(p, self.known.get(t, {}).get(p))
            if offset is not None:
                before.setdefault(t, {})[p] = offset
        return before

    def say_skipped(self, start: Offsets, end: Offsets, admin: KafkaAdmin) -> None:
        """With ``kafka.fail_on_data_loss`` off, say in the run's log which records the batch
        passes over because Kafka no longer has them (retention, DeleteRecords), from where the
        batch starts and where Kafka now begins. Neither source says it there: the embedded
        source skips them where it plans (Spark's planner process), Spark's kafka source in its
        read tasks, each in a log of Spark's."""
        reading = {t: [p for p, o in parts.items() if o < end[t][p]] for t, parts in start.items()}
        reading = {t: parts for t, parts in reading.items() if t in end and parts}
        if not reading:
            return
        earliest = admin.earliest(reading)
        for t, parts in reading.items():
            for p in parts:
                lo = earliest.get(t, {}).get(p)
                if lo is not None and start[t][p] < lo:
                    log.warning(
                        "fail_on_data_loss is off; skipping records no longer in Kafka: %s[%d] "
                        "needs offset %d but the earliest available is %d (%d records deleted "
                        "before they were read)",
                        t,
                        p,
                        start[t][p],
                        lo,
                        min(lo, end[t][p]) - start[t][p],
                    )

    def rewound(
        self, end: Offsets, admin: KafkaAdmin, fail_on_data_loss: bool
    ) -> tuple[tuple[str, int], ...]:
        """Partitions the batch moves below the offsets the pipeline stored, allowed only where
        Kafka no longer has the stored position (the topic was deleted and recreated, which the
        source's data-loss guard already reported) and ``kafka.fail_on_data_loss`` is off.
        Anywhere else a move backwards is a stale plan, and the sink refuses it."""
        # A recreated topic starts over: its first batch neither starts nor ends where the old
        # topic's offsets are stored.
        recreated = [(t, p) for t, parts in end.items() if t in self.recreated for p in parts]
        if fail_on_data_loss:
            return tuple(sorted(recreated))
        behind = {
            t: [p for p, o in parts.items() if o < self.known.get(t, {}).get(p, o)]
            for t, parts in end.items()
        }
        behind = {t: parts for t, parts in behind.items() if parts}
        if not behind:
            return tuple(sorted(recreated))
        latest = admin.latest(behind)
        lost = [
            (t, p) for t, parts in behind.items() for p in parts if latest[t][p] < self.known[t][p]
        ]
        for t, p in lost:
            log.warning(
                "%s[%d] restarts at offset %d below the stored %d: Kafka's latest is %d (the "
                "topic was recreated) and kafka.fail_on_data_loss is off",
                t,
                p,
                end[t][p],
                self.known[t][p],
                latest[t][p],
            )
        rewound = tuple(sorted({*recreated, *lost}))
        return rewound

    def current_topic_ids(self, end: Offsets, source: Source, admin: KafkaAdmin) -> dict[str, str]:
        """Kafka's ids of the batch's topics, recorded in its commit; a topic deleted and
        created again while this run read it stops the batch before anything is written (the
        next start handles it as :mod:`kafka_delta.offsets.topic_identity` says).

        A source that checks the ids itself (the embedded source: in the one metadata request
        its planning makes per batch) planned this batch only if they were still the ones the
        run started with, so the ids come from here without a request: the batch's only Kafka
        round trip is then the lag's offsets
        (:meth:`kafka_delta.progress.run_progress.RunProgress._progress`)."""
        if getattr(source, "checks_topic_ids", False):
            return {t: i for t, i in self.topic_ids.items() if t in end}
        current = admin.topic_ids(end)
        changed = sorted(
            t for t, i in current.items() if t in self.topic_ids and self.topic_ids[t] != i
        )
        if changed:
            raise recreated_while_running(changed)
        self.topic_ids.update(current)
        return {t: i for t, i in current.items() if t in end}
