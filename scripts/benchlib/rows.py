"""One measured line of the benchmark (:class:`Row`) and the figures every row derives from its
batch records: the steady rate, the busy rate, the split of batch time, the table check."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The main rows, in the order they run and print.
ROW_NAMES = {
    1: "raw consume (confluent-kafka x {procs} procs)",
    2: "raw Delta write (delta-rs from parsed Arrow)",
    3: "simple ingest (kafka > pyarrow.json > delta-rs + txn)",
    4: "pipeline exactly-once on (delta-rs sink)",
    5: "pipeline exactly-once off (delta-rs sink)",
    6: "pipeline exactly-once on (delta-spark sink)",
    7: "plain foreachBatch write with txn (delta-spark)",
    8: "pipeline exactly-once on, Avro (delta-rs sink)",
    9: "simple Avro ingest (fastavro > delta-rs + txn)",
    10: "ceiling: pipeline read path to Spark's noop sink",
    11: "pipeline into two tables (all + paid by route)",
    12: "hand-written readStream kafka > writeStream delta",
    13: "hand-written readStream kafka > foreachBatch txn write",
    14: "pipeline, cluster engine (kafka source + delta-spark)",
    15: "row 4 on a standalone cluster: 2 workers x 1 core",
    16: "freshness: Kafka to a visible Delta commit (A, B, C)",
}
# The rows on delta-spark's jars (14 and the hand-written 12 and 13 also on Spark's kafka
# source's): skipped, saying why, where the jars are missing.
DELTA_SPARK_ROWS = (6, 7, 12, 13, 14)
KAFKA_SOURCE_ROWS = (12, 13, 14)
# Freshness: windows of a steady producer, measured apart from the throughput rows.
FRESHNESS_ROW = 16
# Rows that run only when --rows names them: row 15 starts a Spark standalone cluster (a master
# and two worker JVMs) beside the broker, which the default run has no use for; row 16 is long.
OPT_IN = (15, FRESHNESS_ROW)
# Rows that may run several times (--repeats), alternating, summarised by their medians.
REPEATED = (4, 5)
TIME_SPLIT = {
    "steady_read_parse_s": "Kafka read + parse + toArrow",
    "steady_sink_s": "Delta sink",
    "steady_between_batches_s": "Spark between batches",
}


@dataclass
class Row:
    number: int
    name: str
    records: int
    batch_size: int | None = None
    rps: float = 0.0
    busy_rps: float | None = None
    wall_s: float = 0.0
    startup_s: float | None = None
    peak_rss_mb: float = 0.0
    batches: int = 0
    rows_out: int = 0
    distinct_ids: int | None = None
    verified: bool = False
    check: str = ""
    note: str = ""
    repeat: int = 0
    partitions: int = 0
    # Why the row did not run (e.g. no delta-spark jars); a skipped row is not a failure.
    skipped: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return not self.skipped and self.verified and self.rps > 0


def steady(batches: Sequence[Sequence[Any]]) -> tuple[float, float | None]:
    """(records/s after the first batch, from first to last commit; first-batch end time).
    One batch only: 0.0 (no steady state to measure)."""
    if not batches:
        return 0.0, None
    first_end = batches[0][0]
    if len(batches) == 1:
        return 0.0, first_end
    rows = sum(b[1] for b in batches[1:])
    span = batches[-1][0] - first_end
    return (rows / span if span > 0 else 0.0), first_end


def busy_rate(batches: Sequence[Sequence[Any]]) -> float | None:
    """Records/s inside the batch function only, first batch left out: what the pipeline would
    do if Spark's work between batches cost nothing."""
    busy = sum(b[2] for b in batches[1:])
    return sum(b[1] for b in batches[1:]) / busy if busy > 0 else None


def time_split(batches: Sequence[Sequence[Any]]) -> dict[str, float]:
    """Where the steady batches' wall time went: reading + parsing + toArrow (the batch
    function minus the sink), the Delta sink (commit checks and write), and Spark between
    batches (planning the next offsets, offset and commit logs, scheduling)."""
    if len(batches) < 2 or len(batches[0]) < 4:
        return {}
    function = sum(b[2] for b in batches[1:])
    sink = sum(b[3] for b in batches[1:])
    return {
        "steady_read_parse_s": round(function - sink, 3),
        "steady_sink_s": round(sink, 3),
        "steady_between_batches_s": round(batches[-1][0] - batches[0][0] - function, 3),
    }


def step_split(batches: Sequence[Sequence[Any]]) -> dict[str, float]:
    """What a steady batch spends, on average, in the engine's own timed steps (a batch record's
    ``steps``, :data:`.spark_run.BATCH`): the sink's log reads through Spark (the check before
    the write and the read-back after it), the Delta write alone (the commit less its
    read-back), and the materializing (transform, the batch's job into the sink's cache, dead
    letters). {} when the engine did not time its batches (rows 5 and 7, the hand-written
    rows) or there is no steady batch."""
    timed = [b[6] for b in batches[1:] if len(b) > 6 and isinstance(b[6], dict)]
    if not timed:
        return {}
    n = len(timed)

    def mean(key: str) -> float:
        return sum(float(t.get(key) or 0.0) for t in timed) / n

    check, read_back, commit = mean("check"), mean("read_back"), mean("commit")
    return {
        "steady_check_s": round(check, 4),
        "steady_read_back_s": round(read_back, 4),
        "steady_log_read_s": round(check + read_back, 4),
        "steady_write_s": round(commit - read_back, 4),
        "steady_materialize_s": round(mean("materialize"), 4),
        "steady_timed_batches": n,
    }


def verify_table(path: Path, expected: int) -> tuple[bool, int, int, str]:
    """(ok, rows, distinct ids, message): the table must hold ids 0..expected-1 exactly once."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    try:
        ids = DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).column("id")
    except Exception as exc:
        return False, 0, 0, f"unreadable: {exc}"
    rows = len(ids)
    distinct = pc.count_distinct(ids).as_py() if rows else 0
    ok = rows == expected == distinct
    if ok and rows:
        ok = pc.min(ids).as_py() == 0 and pc.max(ids).as_py() == expected - 1
    message = f"{distinct:,} distinct ids" + (
        "" if ok else f" of {rows:,} rows, expected {expected:,}"
    )
    return ok, rows, distinct, message


def verify_paid(path: Path, records: int) -> tuple[bool, int, str]:
    """(ok, distinct ids, message): the table must hold the paid orders of ids 0..records-1
    exactly once (kafka_delta_dev.produce: event i is EVENT_TYPES[i % 4], paid is 1)."""
    from deltalake import DeltaTable

    try:
        ids = DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    except Exception as exc:
        return False, 0, f"unreadable: {exc}"
    want = set(range(1, records, 4))
    ok = len(ids) == len(set(ids)) and set(ids) == want
    found = f"{len(set(ids)):,} paid ids"
    message = found if ok else f"{found} of {len(ids):,} rows, expected {len(want):,}"
    return ok, len(set(ids)), message


def summary_rows(rows: Sequence[Row]) -> list[Row]:
    """One row per benchmark line; repeated rows (4, 5) as the median of each figure."""
    out = []
    for number in sorted({r.number for r in rows}):
        runs = [r for r in rows if r.number == number]
        if len(runs) <= 1:
            out.extend(runs)
            continue
        medians: dict[str, Any] = {
            name: statistics.median(getattr(r, name) for r in runs)
            for name in ("rps", "wall_s", "peak_rss_mb")
        }
        for name in ("startup_s", "busy_rps"):
            values = [getattr(r, name) for r in runs if getattr(r, name) is not None]
            medians[name] = statistics.median(values) if values else None
        numeric = {k for r in runs for k, v in r.extra.items() if isinstance(v, int | float)}
        extra = {
            key: statistics.median(values)
            for key in sorted(numeric)
            if (values := [r.extra[key] for r in runs if isinstance(r.extra.get(key), int | float)])
        }
        rpss = ", ".join(f"{r.rps:,.0f}" for r in runs)
        checks = {r.check for r in runs}
        out.append(
            Row(
                **{
                    **runs[0].__dict__,
                    **medians,
                    "extra": extra,
                    "verified": all(r.verified for r in runs),
                    "check": checks.pop() if len(checks) == 1 else "; ".join(sorted(checks)),
                    "note": f"median of {len(runs)} runs: {rpss} records/s",
                }
            )
        )
    return out
