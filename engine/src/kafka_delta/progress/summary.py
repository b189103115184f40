"""What a run did, as ``Pipeline.run()`` returns it: batches, rows, dead letters, where the
offsets stand, and the commit-back's figures; constant-size however long the run."""

from __future__ import annotations

from dataclasses import dataclass, field

from kafka_delta.kafka.commit_back import CommitBackStats
from kafka_delta.offsets.model import Offsets


class RunningTotal:
    """A run's figures of one kind (each batch's duration, each commit-back's time) as how
    many and their sum: the same size after a million batches as after one."""

    __slots__ = ("count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def __repr__(self) -> str:
        return f"RunningTotal(count={self.count}, total={self.total})"


@dataclass
class RunSummary:
    batches: int = 0
    replayed_batches: int = 0
    rows_written: int = 0
    dead_letters: int = 0
    last_delta_version: int | None = None
    end_offsets: Offsets = field(default_factory=dict)
    commit_back: CommitBackStats | None = None
    # Constant-size: a long run's driver keeps no figure per batch.
    commit_back_ms: RunningTotal = field(default_factory=RunningTotal)
    batch_seconds: RunningTotal = field(default_factory=RunningTotal)
