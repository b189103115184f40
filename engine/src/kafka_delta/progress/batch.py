"""One micro-batch's figures, and the interface of whoever wants them.

:class:`~.pipeline.Pipeline` builds one :class:`BatchProgress` per batch, after the Delta commit,
logs it as the progress line and hands it to its :class:`ProgressListener` s: the Prometheus
metrics (``metrics.py``) and the JSON-lines file that ``report`` draws (``progress_log.py``).
This module names the contract and imports neither of them; ``main.py`` builds the listeners
from the config, so a pipeline without metrics never imports ``prometheus_client``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
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

        # `tables` is absent from lines written before pipelines had several tables.
        fields = {
            name: data.get(name) if name == "tables" else data[name]
            for name in cls.__dataclass_fields__
        }
        fields["end_offsets"] = offsets(fields["end_offsets"]) or {}
        fields["lag"] = offsets(fields["lag"])
        return cls(**fields)


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
