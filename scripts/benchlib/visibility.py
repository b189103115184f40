"""When each record became visible in a Delta table, read from the table's own log: the freshness
row's measurement (:mod:`.freshness`).

A record is visible from the moment the commit that added it exists in ``_delta_log``: that
commit file's modification time (both engines write the file whole, then make it the version's
name, so a reader can list it from then on). Only commits that change data count: compaction
re-adds the same records with ``dataChange: false`` and never makes one visible again.

Each record carries its Kafka timestamp (the producer's clock at ``produce()``, CreateTime, in
the table's ``kafka_timestamp`` column), so its freshness is the commit's time minus that
timestamp, on the one clock of this machine.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

if TYPE_CHECKING:  # imported where used: every bench worker process imports this module
    import numpy as np

TIMESTAMP_COLUMN = "kafka_timestamp"


@dataclass(frozen=True)
class Commit:
    version: int
    visible_at: float  # seconds since the epoch: the commit file's modification time
    files: tuple[str, ...]  # data files it added (dataChange true), absolute paths


def data_commits(table: Path) -> list[Commit]:
    """The table's commits that added records, in version order."""
    log = table / "_delta_log"
    out = []
    for entry in sorted(log.glob("*.json"), key=lambda p: int(p.stem)):
        if not entry.stem.isdigit():
            continue
        visible_at = entry.stat().st_mtime_ns / 1e9
        files = []
        for line in entry.read_text().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            add = action.get("add")
            if add is not None and add.get("dataChange", True):
                files.append(str(table / unquote(add["path"])))
        if files:
            out.append(Commit(int(entry.stem), visible_at, tuple(files)))
    return out


@dataclass
class Visible:
    """Every record the table's data commits added: its id, its Kafka timestamp (seconds) and
    when its commit became visible (seconds), one entry per row (a record written twice is
    there twice), plus the commits' visible times in version order."""

    ids: np.ndarray
    kafka_ts: np.ndarray
    visible_at: np.ndarray
    commit_times: np.ndarray


def visible_records(table: Path) -> Visible:
    import numpy as np
    import pyarrow.parquet as pq

    ids, stamps, seen, times = [], [], [], []
    for commit in data_commits(table):
        times.append(commit.visible_at)
        for path in commit.files:
            part = pq.read_table(path, columns=["id", TIMESTAMP_COLUMN])
            ids.append(part.column("id").to_numpy(zero_copy_only=False))
            ts = part.column(TIMESTAMP_COLUMN).cast("int64").to_numpy(zero_copy_only=False)
            unit = part.schema.field(TIMESTAMP_COLUMN).type.unit  # us from Spark, ns/ms maybe
            stamps.append(ts / {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}[unit])
            seen.append(np.full(len(part), commit.visible_at))
    empty = np.array([], dtype=float)
    return Visible(
        np.concatenate(ids).astype(np.int64) if ids else np.array([], dtype=np.int64),
        np.concatenate(stamps) if stamps else empty,
        np.concatenate(seen) if seen else empty,
        np.array(times),
    )


@dataclass(frozen=True)
class Freshness:
    """Freshness of the records with ids ``[first_id, end_id)`` (the measured window)."""

    records: int  # ids in the window
    seen: int  # distinct window ids found in the table
    lost: int  # window ids not in the table
    doubled: int  # rows of window ids beyond the first of each
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float
    mean_s: float
    batches: int  # data commits holding window records
    versions_per_hour: float  # data commits per hour, first to last commit of the window


def percentile(sorted_values: np.ndarray, q: float) -> float:
    """Nearest rank: the smallest value at or above ``q`` percent of the values."""
    if not len(sorted_values):
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def freshness(visible: Visible, first_id: int, end_id: int) -> Freshness:
    """Each window id checked once: lost when missing, doubled when there more than once; the
    freshness of a record is its first (only) commit's time minus its Kafka timestamp, on the
    one clock of this machine."""
    import numpy as np

    inside = (visible.ids >= first_id) & (visible.ids < end_id)
    ids = visible.ids[inside]
    unique, first = np.unique(ids, return_index=True)
    latency = np.sort((visible.visible_at[inside] - visible.kafka_ts[inside])[first])
    commits = np.unique(visible.visible_at[inside])
    records = end_id - first_id
    return Freshness(
        records=records,
        seen=len(unique),
        lost=records - len(unique),
        doubled=len(ids) - len(unique),
        p50_s=percentile(latency, 50),
        p90_s=percentile(latency, 90),
        p99_s=percentile(latency, 99),
        max_s=float(latency[-1]) if len(latency) else math.nan,
        mean_s=float(latency.mean()) if len(latency) else math.nan,
        batches=len(commits),
        versions_per_hour=(len(commits) - 1) / (commits[-1] - commits[0]) * 3600
        if len(commits) > 1 and commits[-1] > commits[0]
        else math.nan,
    )


def latest_committed_ends(checkpoint: Path) -> dict[str, dict[int, int]] | None:
    """The end offsets of the newest batch Spark recorded as done in ``checkpoint`` (its
    ``commits/`` and ``offsets/`` logs, one source), or None before the first."""
    done = [int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit()]
    if not done:
        return None
    text = (checkpoint / "offsets" / str(max(done))).read_text()
    lines = [line for line in text.splitlines()[2:] if line.strip()]
    source = lines[0]
    if text.startswith("v2"):  # "sourceId:offset" lines
        source = source.partition(":")[2]
    return {
        t: {int(p): int(o) for p, o in parts.items()} for t, parts in json.loads(source).items()
    }


def covers(ends: dict[str, dict[int, int]] | None, wanted: dict[str, dict[int, int]]) -> bool:
    """Whether committed end offsets ``ends`` reach ``wanted`` on every partition."""
    if ends is None:
        return False
    return all(
        ends.get(t, {}).get(p, -1) >= o for t, parts in wanted.items() for p, o in parts.items()
    )


def file_count(table: Path) -> int:
    """Data files in the table's current snapshot (adds minus removes over the log; the
    benchmark's tables take no Delta checkpoint it would need to read instead)."""
    from deltalake import DeltaTable

    return len(DeltaTable(str(table)).file_uris())


def mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime_ns / 1e9
    except FileNotFoundError:
        return None


def summary_text(values: Sequence[float]) -> str:
    return "/".join(f"{v:.2f}" for v in values)
