"""The fencing rule (I6): a batch commits only where the table's stored offsets end.

One rule, applied by both sinks inside their commit (atomically, see each sink) and before any task
runs (``Sink.check``). It guards the **main table** only: the dead-letter table keeps its own rule,
by position (:mod:`kafka_delta.dead_letters`), because a rewind legitimately re-reads ranges
whose dead letters are already there. What fences that rule is the pipeline's commit number (the
fence txn's ``seq``): a dead-letter commit lands only on top of the commit the positions were read
after (:func:`check_unmoved`), so no record is sent twice, whichever run or table sends it.

What the rule knows of the operator's explicit moves:

- an ``offsets reset`` is a commit of the pipeline like a batch: the stored offsets are the reset's,
  and a batch planned before it does not start there, so it is refused; at the next start the
  checkpoint is set aside (:mod:`kafka_delta.recovery`) and the run starts at the reset offsets;
- a Delta ``RESTORE`` is seen by the one reader of stored offsets
  (:mod:`kafka_delta.offsets.stored`): the stored offsets are those in effect at the version
  restored to, so the records the restore removed are read again;
- a partition Kafka no longer holds at the stored position (topic deleted and recreated) may
  move backwards only when ``kafka.fail_on_data_loss`` is off; the batch records it as
  ``rewound``.

Anything else that does not line up is another run of the pipeline: this run's batch stops
before it writes, with :class:`FencingError`, which ends the run with one sentence and exit
code 3 (:mod:`kafka_delta.cli`); its restart recovers by itself.
"""

from __future__ import annotations

from kafka_delta.offsets.model import BatchCommit, Offsets, StoredOffsets


class FencingError(RuntimeError):
    """The table's stored offsets are not where this batch starts: another run of the same
    pipeline committed in between, or an operator moved the offsets (reset, RESTORE). This run
    stops without writing; a restart resumes from the table."""


class TableMovedError(FencingError):
    """The pipeline committed to the table after the caller read what it holds (the table's fence
    ``seq`` is no longer the one the caller saw): this commit was not made. The dead-letter queue
    reads the table again and sends only what it still lacks; should it escape, it ends the run as
    any lost race does (exit 3), and the restart resumes."""


RESTART = "Nothing of this batch was written; restart the pipeline: it resumes from the table."


def check_unmoved(
    stored: StoredOffsets | None, expected_seq: int | None, commit: BatchCommit, table: str
) -> None:
    """Raise :class:`TableMovedError` unless the pipeline's newest commit in the table is still
    the one the caller read the table after: ``expected_seq`` its fence ``seq`` (0: the table
    held no commit of the pipeline, or did not exist); None checks nothing.

    Why a ``seq`` and not a Delta version: every commit of the pipeline, from any run, table or
    checkpoint, takes the newest ``seq`` + 1 and writes it in the fence txn, so a commit made on
    top of ``expected_seq`` lands only if no commit of the pipeline came in between (delta-rs
    commits without retry on the snapshot checked here; delta-spark rejects or skips a second
    writer of the same ``seq``), while another writer's commit (OPTIMIZE, VACUUM) moves no
    ``seq`` and costs nothing (where the ``seq`` is a bound, after a RESTORE or log cleanup on
    delta-spark, it may: the caller then reads the table once more)."""
    if expected_seq is None:
        return
    now = stored.seq if stored is not None else 0
    if now != expected_seq:
        raise TableMovedError(
            f"batch {commit.batch_id} of pipeline {commit.pipeline_id!r}: another commit of the "
            f"pipeline landed in {table} (commit {now}, read at commit {expected_seq}) after "
            f"what it holds was read. {RESTART}"
        )


def check_contiguous(
    stored: StoredOffsets | None,
    start: Offsets | None,
    commit: BatchCommit,
    first_reads: Offsets | None = None,
) -> None:
    """Raise :class:`FencingError` unless the batch starts exactly where the table ends, and
    never when it would move a stored offset backwards.

    ``start`` is the batch's real start, as Spark persisted it (the previous batch's planned
    end; for batch 0 the source's initial offsets). ``start`` None skips that comparison; ``{}``
    means the table must hold no offsets of this pipeline yet (the embedded source's first
    batch, planned by the source from the table's offsets, here none).

    Partition by partition:

    - one the table stores an offset for must start exactly there;
    - one the table stores nothing for (a first batch, a topic or partition new to the
      pipeline) must start no later than ``first_reads`` says: where the pipeline's rule of
      first reads puts it (:func:`kafka_delta.offsets.model.first_offset`: Kafka's earliest
      offset, or the configured starting offsets on the pipeline's first run), so a start that
      skips records Kafka still holds is never taken silently; one ``first_reads`` does not name
      has no explanation and is fenced.
      Spark's kafka source starts batch 0 at its initial offsets (``{topic: {p: 0}}`` on a new
      topic), the embedded source at ``{}``: both pass by this one rule;
    - one in the table but not in ``start`` (a topic dropped from the subscription) keeps its
      offset, and is not compared.

    The backwards rule holds whatever ``start`` says: a checkpoint whose batch was planned
    before another run moved the table on (a retried job, a second checkpoint) re-plays a range
    the table already holds; committing it would duplicate records or rewind the offsets.
    """
    if stored is not None:
        behind = [
            (t, p, end, stored.offsets[t][p])
            for t, parts in commit.end_offsets.items()
            for p, end in parts.items()
            if p in stored.offsets.get(t, {})
            and end < stored.offsets[t][p]
            and (t, p) not in commit.rewound
        ]
        if behind:
            detail = "; ".join(f"{t}[{p}] stored {o}, batch ends at {e}" for t, p, e, o in behind)
            raise FencingError(
                f"batch {commit.batch_id} of pipeline {commit.pipeline_id!r} would move the "
                f"table's stored offsets backwards ({detail}; stored at {stored.describe()}): "
                f"another run of the pipeline moved the table on. {RESTART}"
            )
    if start is None:
        return
    held = stored.offsets if stored is not None else {}
    moved = [
        (t, p, o, start[t][p])
        for t, parts in held.items()
        for p, o in parts.items()
        if p in start.get(t, {}) and start[t][p] != o and (t, p) not in commit.rewound
    ]
    limits = first_reads or {}
    skipping = [
        (t, p, s, limits.get(t, {}).get(p))
        for t, parts in start.items()
        for p, s in parts.items()
        if p not in held.get(t, {})
        and (t, p) not in commit.rewound
        and not s <= limits.get(t, {}).get(p, -1)
    ]
    # An empty start is the embedded source's first batch: the table must still be empty.
    if not moved and not skipping and (any(start.values()) or not any(held.values())):
        return
    details = [f"{t}[{p}] stored {o}, batch starts at {s}" for t, p, o, s in moved]
    details += [
        f"{t}[{p}] batch starts at {s}, "
        + (
            "where the table stores no offset for it"
            if first is None
            else f"past {first}, where a first read of it starts"
        )
        for t, p, s, first in skipping
    ]
    if stored is None:
        problem = f"{'; '.join(details)}; the table holds no offsets of this pipeline"
    else:
        problem = f"{'; '.join(details) or 'the table already holds offsets'}; stored at "
        problem += stored.describe()
    if stored is not None and stored.reset is not None:
        cause = "an operator reset the table's offsets while this checkpoint was in use"
    elif stored is not None and stored.restore is not None:
        cause = "the table was restored to an earlier version while this checkpoint was in use"
    elif moved or (stored is not None and not skipping):
        cause = "another run of this pipeline is writing to the same table"
    else:
        cause = (
            "the batch would skip records Kafka still holds and the table never received: the "
            "table was deleted or replaced while this checkpoint was in use"
        )
    raise FencingError(
        f"batch {commit.batch_id} of pipeline {commit.pipeline_id!r} does not start where the "
        f"table ends ({problem}): {cause}. {RESTART}"
    )
