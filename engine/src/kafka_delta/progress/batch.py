"""One micro-batch's figures, and the interface of whoever wants them.

:class:`~.run_progress.RunProgress` builds one :class:`BatchProgress` per batch, after the Delta
commit (:class:`~kafka_delta.pipeline.Pipeline` hands it each batch), logs it as the progress
line and hands it to its :class:`ProgressListener` s: the Prometheus metrics (``metrics.py``)
and the JSON-lines file that ``report`` draws (``progress_log.py``). This module names the
contract and imports neither of them; ``main.py`` builds the listeners from the config, so a
pipeline without metrics never imports ``prometheus_client``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kafka_delta.offsets.model import Offsets

if TYPE_CHECKING:
    from kafka_delta.kafka.commit_back import CommitBackStats


@dataclass(frozen=True)
class BatchProgress:
    """What one micro-batch did. ``records_read`` is the Kafka records the batch read
    (counted with ``DataFrame.observe`` while the sink wrote it; a replay re-reads its records
    too; None when the count is unknown); ``rows_written`` the rows the Delta commit added (0
    for a replay); ``dead_letters`` the records this batch sent to the dead-letter table."""

    pipeline_id: str
    run_id: str
    batch_id: int
    finished_at: float  # Unix time, seconds
    duration_s: float
    records_read: int | None
    rows_written: int
    dead_letters: int
    replayed: bool
    delta_version: int | None
    end_offsets: Offsets
    # Records between the batch's end offsets and Kafka's latest, per topic-partition; None when
    # Kafka did not answer (lag_error says why). Reporting never fails a committed batch.
    lag: Offsets | None
    lag_error: str | None
    # Run until caught up only: records between the batch's end and the offsets seen at start,
    # and the records this run has read so far (with them: how far along the run is).
    to_target: int | None
    run_records_read: int
    commit_back_ok: int | None  # None: commit-back is off
    commit_back_failed: int | None
    hook_ms: float
    # A pipeline of several tables (``tables:``): each table's share of the batch, by name:
    # rows_written, dead_letters, replayed, delta_version. None for one table.
    tables: Mapping[str, Mapping[str, Any]] | None = None
    # Seconds the batch function spent in each of its steps (:class:`StepClock`), every table's
    # together; None in records written before batches were timed by step.
    steps: Mapping[str, float] | None = None

    @property
    def behind_latest(self) -> int | None:
        if self.lag is None:
            return None
        return sum(v for parts in self.lag.values() for v in parts.values())

    @property
    def records_per_s(self) -> float:
        read = self.records_read or 0
        return read / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def target_done(self) -> float | None:
        """Fraction of this run's target read so far (run until caught up), else None."""
        if self.to_target is None:
            return None
        total = self.run_records_read + self.to_target
        return 1.0 if total == 0 else self.run_records_read / total

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["behind_latest"] = self.behind_latest
        data["records_per_s"] = round(self.records_per_s, 1)
        data["target_done"] = self.target_done
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchProgress:
        """The record back from :meth:`to_json` (JSON turns partition numbers into strings)."""

        def offsets(value: Any) -> Offsets | None:
            if value is None:
                return None
            return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in value.items()}

        # `tables` is absent from lines written before pipelines had several tables, `steps`
        # from lines written before batches were timed by step.
        fields = {
            name: data.get(name) if name in ("tables", "steps") else data[name]
            for name in cls.__dataclass_fields__
        }
        fields["end_offsets"] = offsets(fields["end_offsets"]) or {}
        fields["lag"] = offsets(fields["lag"])
        return cls(**fields)


# The steps of a batch a :class:`StepClock` times, in the order they run: planning the ends, the
# sinks' checks (fencing and replay: reading each table's log), the transform and the sinks'
# materializing of its rows (the delta-spark sink's one job reading the batch into its cache;
# dead letters sent), the commits (the Delta write and, where a sink reads it back, the log
# again), and of the commits the read-back alone (``SinkResult.read_back_s``).
STEPS = ("plan", "check", "materialize", "commit", "read_back")


@dataclass
class StepClock:
    """Where one micro-batch's time goes, step by step (:data:`STEPS`): wall seconds taken with
    ``time.perf_counter`` around calls the batch makes anyway, so timing costs no Spark job
    and nothing measurable (two clock reads a step). Why: a batch's cost splits into what the
    sink adds per batch (its log reads, which must stay flat as the table ages) and what the
    data costs (the write), and only the batch function can tell them apart."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, step: str, seconds: float) -> None:
        self.seconds[step] = self.seconds.get(step, 0.0) + seconds

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def figures(self) -> dict[str, float]:
        """The steps timed, in :data:`STEPS` order, seconds rounded to 0.1 ms."""
        return {s: round(self.seconds[s], 4) for s in STEPS if s in self.seconds}


def steps_text(steps: Mapping[str, float] | None) -> str:
    """The progress line's ``steps_ms=`` field: ``plan:2,check:104,materialize:2310,commit:1401,
    read_back:98`` (the read-back is part of the commit); "" when the batch was not timed.

    >>> steps_text({"check": 0.1044, "commit": 1.4012, "read_back": 0.0981})
    ' steps_ms=check:104,commit:1401,read_back:98'
    """
    if not steps:
        return ""
    return " steps_ms=" + ",".join(f"{k}:{v * 1000:.0f}" for k, v in steps.items())


@dataclass(frozen=True)
class RunRate:
    """A run's pace once it is going, from its batches' progress records: the records read by
    every batch after the first, over the time from the first batch's commit to the last's
    (scripts/bench's steady rate). Start-up (process and JVM start, the first batch's warm-up)
    is left out; the caller, who knows when the process started, reports it apart."""

    batches: int
    first_committed_at: float  # Unix time, seconds
    last_committed_at: float
    steady_records: int

    @property
    def steady_s(self) -> float:
        return self.last_committed_at - self.first_committed_at

    @property
    def steady_records_per_s(self) -> float | None:
        """None with a single batch (or batches committed at one instant): nothing steady."""
        if self.batches < 2 or self.steady_s <= 0:
            return None
        return self.steady_records / self.steady_s


def run_rate(batches: Sequence[BatchProgress]) -> RunRate | None:
    """The :class:`RunRate` of ``batches`` (one run's, in the order written); None without any.
    A batch's records are those it read (its rows written where the count is unknown)."""
    if not batches:
        return None
    later = batches[1:]
    return RunRate(
        batches=len(batches),
        first_committed_at=batches[0].finished_at,
        last_committed_at=batches[-1].finished_at,
        steady_records=sum(
            b.rows_written if b.records_read is None else b.records_read for b in later
        ),
    )


class ProgressListener(Protocol):
    """Receives every batch's figures. Called on the driver after the batch's Delta commit, in
    the run's reporting thread (kafka_delta.progress.reporter), batch after batch while later
    batches run: a slow listener delays the reports, not the batches; a listener that raises is
    logged and ignored (a committed batch never fails because of monitoring)."""

    def on_batch(self, progress: BatchProgress) -> None: ...

    def on_run_end(self, commit_back: CommitBackStats | None) -> None:
        """The run stopped; ``commit_back`` holds the hook's final counts, after its flush."""
        ...

    def close(self) -> None:
        """Release what the listener holds (a server port, a file)."""
        ...
