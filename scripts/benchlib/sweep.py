"""The sweep (the pipeline over batch sizes x partition counts, one Spark session) and what it
is for: a line through each partition count's points, ``batch seconds = fixed + marginal x
records per batch``, fitted by least squares. Its intercept is the per-batch fixed cost (what
every batch pays whatever its size), its slope the marginal cost of one record."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FULL_RECORDS = 1_000_000
SWEEP_BATCH_SIZES = (10_000, 50_000, 100_000, 250_000, 500_000)
SWEEP_PARTITIONS = (1, 4, 16)
# The partition count whose fit the last line reports (the figures are at 4).
FIT_PARTITIONS = 4


def scaled_batch_sizes(records: int) -> list[int]:
    """10k..500k at 1M records; scaled down for fewer records, never below records/20 (at most
    ~20 batches a point) nor above records/2 (at least two batches, one of them steady)."""
    scale = min(1.0, records / FULL_RECORDS)
    floor = max(100, records // 20) if records < FULL_RECORDS else 0
    sizes = {min(max(floor, round(s * scale)), max(1, records // 2)) for s in SWEEP_BATCH_SIZES}
    return sorted(sizes)


def steady_batch_cost(batches: Sequence[Sequence[Any]]) -> tuple[float, float] | None:
    """(records per batch, seconds per batch) over a run's steady batches: every batch after
    the first, timed from commit to commit, so Spark's work between batches counts. None
    without a steady batch."""
    if len(batches) < 2:
        return None
    steady = len(batches) - 1
    span = batches[-1][0] - batches[0][0]
    return sum(b[1] for b in batches[1:]) / steady, span / steady


@dataclass(frozen=True)
class Fit:
    """``seconds per batch = fixed_s + us_per_record / 1e6 x records per batch``."""

    partitions: int
    fixed_s: float
    us_per_record: float
    points: int

    @property
    def marginal_rps(self) -> float:
        """Records/s a batch would reach if it paid no fixed cost."""
        return 1e6 / self.us_per_record if self.us_per_record > 0 else math.inf


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Ordinary least squares ``y = a + b x``: (a, b); None with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return mean_y - slope * mean_x, slope


def fit_batch_cost(partitions: int, points: Sequence[tuple[float, float]]) -> Fit | None:
    """The fixed and marginal cost of a batch at ``partitions``, from (records per batch,
    seconds per batch) points."""
    line = fit_line(points)
    if line is None:
        return None
    fixed, slope = line
    return Fit(partitions, fixed, slope * 1e6, len(points))
