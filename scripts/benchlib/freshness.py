"""Row 16, freshness: how long a record takes from Kafka to a visible Delta commit, side by side
in one run on one broker (opt-in: ``--rows 16``):

- A: the project's continuous run on the embedded engine, with the documented low-latency
  trigger (``--freshness-trigger``);
- B: the same on the cluster engine (Spark's kafka source, delta-spark), with the jars;
- C: a hand-written ``readStream.format("kafka")`` -> ``writeStream.format("delta")`` at Spark's
  fastest trigger (none set).

Each side, at each rate of ``--freshness-rates``, gets a topic of its own (``--partitions``) and
a worker process (:mod:`.fresh_worker`), while a steady producer in this process writes the
sample order events at that rate. Once the side's first batch is committed and
``--freshness-warmup`` seconds have passed (start-up and the backlog it leaves are not
measured), the next ``--freshness-seconds`` seconds of records are the window. Per window
record: the commit that added it became visible in ``_delta_log`` (the commit file's time)
minus its Kafka timestamp (:mod:`.visibility`); p50, p99 and max, and each window id checked
once in the table (lost: missing; doubled: there twice).

The tail: the stand-in broker (Tansu 0.6, where Kafka's jars cannot be had) serves a partition's
newest records only once another record follows them, and no side can commit a record it has
not been served. So the producer
runs on at the same rate after the window until Spark's checkpoint records a batch whose end
offsets cover the window's last records (at most ``--freshness-tail-max`` seconds); only the
window's records are measured, and a window record not committed by then counts as lost.

``--freshness-before REV`` adds side A0 before A at each rate (when A runs): A's worker on the
engine as it was at git revision REV (exported from this repository into the output folder and
put first on the worker's PYTHONPATH), with ``--freshness-before-trigger``: the step shares of
one small batch before and after a change, from one run on one machine state. B0 joins B the
same way: the cluster engine of REV.

``--freshness-compact-every S`` turns on the run's own compaction on A and B
(``maintenance.compact_every_seconds``); on every side the table's live files are counted every
``FILES_EVERY_S`` seconds through the window, and the batch's cost over the window's first
tenth is set against its last (a long window, e.g. ``--freshness-seconds 1800``: do the files
stay bounded and the batches flat as the table ages?).

Step shares: Spark's timings of each trigger (planning the ends, the offset log, the batch,
the commit log) and, on A and B, the batch function's own steps (the plan, the replay and
fencing check, the write job, the Delta commit, the report with its commit-back hand-off),
averaged over the window's batches.
"""

from __future__ import annotations

import csv
import json
import math
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .procs import WorkerError, run_worker
from .report import say
from .visibility import Freshness, covers, freshness, latest_committed_ends, visible_records

REPO = Path(__file__).resolve().parents[2]
SIDES = {
    "A0": "project, embedded engine, before",
    "A": "project, embedded engine",
    "B0": "project, cluster engine (jars), before",
    "B": "project, cluster engine (jars)",
    "C": "hand-written readStream kafka > writeStream delta",
    # Spark's floor with the pipeline's guarantee: each batch one idempotent Delta append, as
    # Databricks documents it (txnAppId/txnVersion), nothing else.
    "D": "hand-written readStream kafka > foreachBatch delta append with txnAppId/txnVersion",
}
# The sides on the engine of --freshness-before.
BEFORE = {"A0", "B0"}
CLUSTER_ENGINE = "cluster"
# The producer sends what is due every TICK_S: a steady rate, not bursts.
TICK_S = 0.005
# How long a side may take to commit its first batch (JVM start, the topic's backlog).
FIRST_BATCH_TIMEOUT_S = 300.0
# Step shares: Spark's durations, and the batch function's own steps (A and B).
SPARK_COLUMNS = (
    "latestOffset",
    "walCommit",
    "getBatch",
    "queryPlanning",
    "addBatch",
    "commitOffsets",
)
FUNCTION_COLUMNS = ("plan", "check", "write", "commit", "count", "report")
# How often the table's live files are counted through the window.
FILES_EVERY_S = 10.0


class SteadyProducer:
    """Writes order events with ids 0, 1, 2 ... at ``rate`` records/s round-robin over the
    topic's partitions, from a thread, until :meth:`stop`. librdkafka stamps each record with
    the time of its ``produce()`` call (CreateTime): the freshness measured starts there."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, rate: int, linger_ms: float = 5
    ) -> None:
        from confluent_kafka import Producer

        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms})
        self.next_id = 0
        self._end_id: int | None = None
        self._last_below_end: dict[int, int] = {}
        self._delivered_below_end = 0
        self._failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self.behind_max = 0

    def start(self) -> SteadyProducer:
        self._thread.start()
        return self

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._failed += 1
            return
        if self._end_id is None or int(msg.key()) < self._end_id:
            self._delivered_below_end += 1
            self._last_below_end[msg.partition()] = msg.offset()

    def _run(self) -> None:
        from kafka_delta_dev.produce import event

        rng = random.Random(7)
        started = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            self.behind_max = max(self.behind_max, due - self.next_id)
            while self.next_id < due:
                i = self.next_id
                value = event(i, rng)
                while True:
                    try:
                        self.producer.produce(
                            self.topic,
                            value=value,
                            key=str(i).encode(),
                            partition=i % self.partitions,
                            on_delivery=self._delivered,
                        )
                        break
                    except BufferError:
                        self.producer.poll(0.01)
                self.next_id += 1
            self.producer.poll(0)
            time.sleep(TICK_S)
        self.producer.flush(60)

    def mark(self) -> int:
        """The id of the next record: a window's first id, or (exclusive) its end."""
        return self.next_id

    def end_window(self) -> tuple[int, dict[str, dict[int, int]]]:
        """Close the window at the next id: (that id, the offsets after the window's last record
        per partition, once every window record is acknowledged)."""
        self._end_id = end = self.next_id
        deadline = time.monotonic() + 60
        while self._delivered_below_end < end and time.monotonic() < deadline:
            time.sleep(0.01)  # the producer thread's poll() runs the delivery callbacks
        if self._delivered_below_end < end:
            raise RuntimeError(f"{end - self._delivered_below_end} window records unacknowledged")
        return end, {self.topic: {p: o + 1 for p, o in self._last_below_end.items()}}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=90)
        if self._failed:
            raise RuntimeError(f"{self._failed} records were not delivered")


@dataclass
class FreshRow:
    side: str
    rate: int
    window_s: float
    result: Freshness | None = None
    steps: dict[str, float] = field(default_factory=dict)  # mean ms per window batch
    tail_s: float = math.nan
    producer_behind_max: int = 0
    # The table's live files through the window: the most, and at its end; on disk at its end.
    files_max: int | None = None
    files_end: int | None = None
    files_on_disk: int | None = None
    # Mean ms a batch (Spark's triggerExecution) over the window's first and last tenth.
    batch_ms_first: float = math.nan
    batch_ms_last: float = math.nan
    note: str = ""
    skipped: str = ""
    failed: str = ""

    @property
    def name(self) -> str:
        return SIDES[self.side]


def _mean_steps(result: dict[str, Any], first: float, last: float) -> dict[str, float]:
    """Mean ms per batch of each step, over the batches that ended inside [first, last]."""
    steps: dict[str, float] = {}
    progress = [
        p
        for p in result.get("progress", [])
        if first <= p["started"] + p["triggerExecution"] / 1e3 <= last
    ]
    if progress:
        for name in (*SPARK_COLUMNS, "triggerExecution"):
            steps[name] = sum(p.get(name, 0.0) for p in progress) / len(progress)
        steps["rows"] = sum(p["rows"] for p in progress) / len(progress)
        starts = sorted(p["started"] for p in progress)
        steps["trigger_every"] = (
            (starts[-1] - starts[0]) / (len(starts) - 1) * 1e3 if len(starts) > 1 else math.nan
        )
        steps["batches"] = len(progress)
    batches = [b for b in result.get("batches", []) if first <= b["end"] <= last]
    if batches:
        for name in ("function", *FUNCTION_COLUMNS):
            steps[f"fn_{name}"] = sum(b.get(name, 0.0) for b in batches) / len(batches) * 1e3
    return steps


class FileCounter:
    """Counts the table's live files every :data:`FILES_EVERY_S` seconds, from a thread, until
    :meth:`stop`: the most, and the last count."""

    def __init__(self, table: Path) -> None:
        self.table = table
        self.counts: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="file-counter", daemon=True)

    def start(self) -> FileCounter:
        self._thread.start()
        return self

    def count(self) -> int | None:
        from deltalake import DeltaTable

        try:
            return len(DeltaTable(str(self.table)).file_uris())
        except Exception:  # a side's table delta-rs cannot read counts as not counted
            return None

    def _run(self) -> None:
        while True:
            counted = self.count()
            if counted is not None:
                self.counts.append(counted)
            if self._stop.wait(FILES_EVERY_S):
                return

    def stop(self) -> tuple[int | None, int | None]:
        self._stop.set()
        self._thread.join()
        last = self.count()
        if last is not None:
            self.counts.append(last)
        return (max(self.counts), last) if self.counts else (None, None)


class FreshnessRun:
    """Row 16 for every side and rate of the options, in one run on the bench's broker."""

    def __init__(self, bench: Any) -> None:
        self.bench = bench
        self.args = bench.args
        self.rows: list[FreshRow] = []

    def worker_spec(self, side: str, label: str, topic: str) -> tuple[str, dict[str, Any]]:
        b, out = self.bench, self.bench.out
        spec = b.session_spec(
            name=f"fresh-{label}",
            topic=topic,
            table=str(out / "tables" / label),
            checkpoint=str(out / "checkpoints" / label),
            stop_file=str(out / "logs" / f"{label}.stop"),
            decoding=b.decoding(),
        )
        if side == "A0":
            trigger = json.loads(self.args.freshness_before_trigger)
            return "fresh_pipeline", {**spec, "engine": "embedded", "trigger": trigger}
        compact = {"compact_every": self.args.freshness_compact_every}
        if side == "A":
            spec.update(compact)
            return "fresh_pipeline", {**spec, "engine": "embedded", "trigger": self.trigger()}
        jars, why_not = b.delta_jars()
        if not jars:
            raise LookupError(why_not)
        if side == "B":
            spec.update(engine=CLUSTER_ENGINE, trigger=self.trigger(), jars=jars, **compact)
            return "fresh_pipeline", spec
        if side == "B0":
            trigger = json.loads(self.args.freshness_before_trigger)
            spec.update(engine=CLUSTER_ENGINE, trigger=trigger, jars=jars)
            return "fresh_pipeline", spec
        return "fresh_idiom", {**spec, "jars": jars, "txn": side == "D"}

    def before_env(self) -> dict[str, str]:
        """The workers' environment with the engine of ``--freshness-before`` first on the path:
        ``engine/src`` of that revision, exported once into the output folder."""
        import subprocess

        rev = self.args.freshness_before
        folder = self.bench.out / f"engine-{rev}"
        if not folder.exists():
            folder.mkdir(parents=True)
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", rev, "engine/src"],
                check=True,
                capture_output=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
        env = dict(self.bench.env)
        env["PYTHONPATH"] = f"{folder / 'engine' / 'src'}:{env['PYTHONPATH']}"
        return env

    def trigger(self) -> dict[str, Any]:
        return json.loads(self.args.freshness_trigger)

    def measure(self, side: str, rate: int) -> FreshRow:
        a, b = self.args, self.bench
        row = FreshRow(side, rate, a.freshness_seconds)
        label = f"16-fresh-{side}-r{rate}"
        topic = f"fresh-{side.lower()}-r{rate}"
        say(f"==> 16. freshness {side} ({row.name}) at {rate:,} records/s")
        try:
            kind, spec = self.worker_spec(side, label, topic)
        except LookupError as exc:
            row.skipped = f"skipped: {exc}"
            say(f"    {row.skipped}")
            return row
        b.produce_mod.ensure_topics(b.bootstrap, [topic], a.partitions)
        outcome: dict[str, Any] = {}

        env = self.before_env() if side in BEFORE else b.env

        def work() -> None:
            try:
                outcome["result"], _, _ = run_worker(kind, spec, b.out, label, env, a.timeout)
            except WorkerError as exc:
                outcome["error"] = str(exc)

        worker = threading.Thread(target=work, name=label)
        worker.start()
        producer = SteadyProducer(
            b.bootstrap, topic, a.partitions, rate, a.freshness_linger_ms
        ).start()
        checkpoint, table = Path(spec["checkpoint"]), Path(spec["table"])
        try:
            first = self._wait(lambda: latest_committed_ends(checkpoint) is not None, worker)
            if not first:
                raise RuntimeError(f"no batch committed within {FIRST_BATCH_TIMEOUT_S:.0f} s")
            time.sleep(a.freshness_warmup)
            first_id, window_start = producer.mark(), time.time()
            files = FileCounter(table).start()
            try:
                time.sleep(a.freshness_seconds)
            finally:
                row.files_max, row.files_end = files.stop()
            end_id, ends = producer.end_window()
            window_end = time.time()
            covered = self._wait(
                lambda: covers(latest_committed_ends(checkpoint), ends),
                worker,
                a.freshness_tail_max,
            )
            row.tail_s = time.time() - window_end
            if not covered:
                row.note = f"window not committed {a.freshness_tail_max:.0f} s after it ended"
        except Exception as exc:
            row.failed = str(exc)
        finally:
            try:
                producer.stop()
            except RuntimeError as exc:
                row.failed = row.failed or str(exc)
            Path(spec["stop_file"]).touch()
            worker.join(a.timeout)
        row.producer_behind_max = producer.behind_max
        if "error" in outcome:
            row.failed = outcome["error"]
        if row.failed:
            b.problems.append(f"freshness {side} at {rate}/s: {row.failed.splitlines()[0]}")
            say(f"    FAILED: {row.failed}")
            return row
        row.result = freshness(visible_records(table), first_id, end_id)
        row.steps = _mean_steps(outcome["result"], window_start, window_end + row.tail_s)
        tenth = a.freshness_seconds / 10
        first = _mean_steps(outcome["result"], window_start, window_start + tenth)
        last = _mean_steps(outcome["result"], window_end - tenth, window_end)
        row.batch_ms_first = first.get("triggerExecution", math.nan)
        row.batch_ms_last = last.get("triggerExecution", math.nan)
        row.files_on_disk = sum(1 for p in table.rglob("*.parquet") if "_delta_log" not in p.parts)
        if row.result.lost or row.result.doubled:
            b.problems.append(
                f"freshness {side} at {rate}/s: {row.result.lost} lost, {row.result.doubled} "
                "doubled"
            )
        say(f"    {row_text(row)}")
        return row

    @staticmethod
    def _wait(done: Any, worker: threading.Thread, timeout: float = FIRST_BATCH_TIMEOUT_S) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return True
            if not worker.is_alive():
                return False
            time.sleep(0.2)
        return False

    def run(self) -> list[FreshRow]:
        a = self.args
        say(
            f"==> 16. freshness: {a.freshness_seconds:.0f} s windows after "
            f"{a.freshness_warmup:.0f} s of warm-up, {a.partitions} partitions, rates "
            f"{', '.join(f'{r:,}' for r in a.freshness_rates)} records/s, sides "
            f"{','.join(a.freshness_sides)}; trigger of A and B: {a.freshness_trigger}"
        )
        before = [f"{side}0" for side in ("A", "B") if side in a.freshness_sides]
        sides = (before if a.freshness_before else []) + a.freshness_sides
        for rate in a.freshness_rates:
            for side in sides:
                self.rows.append(self.measure(side, rate))
        print_rows(self.rows)
        write_rows(self.rows, self.bench.out)
        return self.rows


def row_text(row: FreshRow) -> str:
    r = row.result
    if r is None:
        return row.skipped or row.failed
    return (
        f"p50 {r.p50_s:.2f} s, p99 {r.p99_s:.2f} s, max {r.max_s:.2f} s over {r.records:,} "
        f"records in {r.batches} batches ({r.versions_per_hour:,.0f} versions/h), {r.lost} lost, "
        f"{r.doubled} doubled; tail {row.tail_s:.1f} s; {files_text(row)}"
    )


def files_text(row: FreshRow) -> str:
    return (
        f"live files max {row.files_max}, at the end {row.files_end} ({row.files_on_disk} "
        f"Parquet files on disk); a batch {row.batch_ms_first:.0f} ms in the window's first "
        f"tenth, {row.batch_ms_last:.0f} ms in its last"
    )


def print_rows(rows: list[FreshRow]) -> None:
    say("")
    say("freshness: Kafka timestamp -> its commit visible in _delta_log (seconds)")
    say(
        f"{'side':<4} {'rate/s':>7} {'p50':>6} {'p90':>6} {'p99':>6} {'max':>6} {'lost':>5} "
        f"{'doubled':>7} {'batches':>7} {'versions/h':>10}  what"
    )
    for row in rows:
        r = row.result
        if r is None:
            say(f"{row.side:<4} {row.rate:>7,} {row.skipped or 'FAILED':>6}  {row.name}")
            continue
        say(
            f"{row.side:<4} {row.rate:>7,} {r.p50_s:>6.2f} {r.p90_s:>6.2f} {r.p99_s:>6.2f} "
            f"{r.max_s:>6.2f} {r.lost:>5} {r.doubled:>7} {r.batches:>7} "
            f"{r.versions_per_hour:>10,.0f}  {row.name}"
        )
    for row in rows:
        if row.result is not None:
            say(f"{row.side:<4} {row.rate:>7,} {files_text(row)}")
    measured = [r for r in rows if r.steps]
    if not measured:
        return
    say("")
    say("where a window batch's time goes (mean ms per batch)")
    columns = ("rows", "trigger_every", "triggerExecution", *SPARK_COLUMNS)
    columns += tuple(f"fn_{c}" for c in ("function", *FUNCTION_COLUMNS))
    say(f"{'side':<4} {'rate/s':>7} " + " ".join(f"{c.removeprefix('fn_'):>9.9}" for c in columns))
    for row in measured:
        say(
            f"{row.side:<4} {row.rate:>7,} "
            + " ".join(f"{row.steps[c]:>9.1f}" if c in row.steps else f"{'-':>9}" for c in columns)
        )


def write_rows(rows: list[FreshRow], out: Path) -> Path:
    path = out / "freshness.csv"
    fields = [
        "side",
        "rate",
        "what",
        "window_s",
        "records",
        "lost",
        "doubled",
        "p50_s",
        "p90_s",
        "p99_s",
        "max_s",
        "mean_s",
        "batches",
        "versions_per_hour",
        "tail_s",
        "producer_behind_max",
        "files_max",
        "files_end",
        "files_on_disk",
        "batch_ms_first",
        "batch_ms_last",
        "note",
    ]
    steps = sorted({k for r in rows for k in r.steps})
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*fields, *steps])
        writer.writeheader()
        for row in rows:
            line: dict[str, Any] = {
                "side": row.side,
                "rate": row.rate,
                "what": row.name,
                "window_s": row.window_s,
                "tail_s": round(row.tail_s, 2),
                "producer_behind_max": row.producer_behind_max,
                "files_max": row.files_max,
                "files_end": row.files_end,
                "files_on_disk": row.files_on_disk,
                "batch_ms_first": round(row.batch_ms_first, 1),
                "batch_ms_last": round(row.batch_ms_last, 1),
                "note": row.skipped or row.failed or row.note,
                **{k: round(v, 2) for k, v in row.steps.items()},
            }
            if row.result is not None:
                line.update(
                    {
                        k: round(v, 4) if isinstance(v, float) else v
                        for k, v in row.result.__dict__.items()
                        if k in fields
                    }
                )
            writer.writerow(line)
    return path


def _rates(text: str) -> list[int]:
    import argparse

    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _sides(text: str) -> list[str]:
    import argparse

    sides = [s.strip().upper() for s in text.split(",") if s.strip()]
    if not sides or set(sides) - set(SIDES) - BEFORE or BEFORE & set(sides):
        raise argparse.ArgumentTypeError(f"sides are A, B, C and D, got {text!r}")
    return sides


def add_options(parser: Any) -> None:
    group = parser.add_argument_group("freshness (row 16, only with --rows 16)")
    group.add_argument(
        "--freshness-rates",
        type=_rates,
        default=[1_000, 5_000, 20_000],
        help="records/s of the steady producer, one window per rate and side "
        "(default 1000,5000,20000)",
    )
    group.add_argument(
        "--freshness-sides",
        type=_sides,
        default=["A", "B", "C"],
        help="default A,B,C; D: the hand-written query's batches written by foreachBatch as "
        "idempotent appends (txnAppId/txnVersion), Spark's floor with that guarantee",
    )
    group.add_argument(
        "--freshness-seconds", type=float, default=60.0, help="the measured window (default 60)"
    )
    group.add_argument(
        "--freshness-warmup",
        type=float,
        default=15.0,
        help="seconds after a side's first committed batch before the window (default 15)",
    )
    group.add_argument(
        "--freshness-tail-max",
        type=float,
        default=120.0,
        help="seconds the producer runs on after the window, at most, until the window is "
        "committed (default 120)",
    )
    group.add_argument(
        "--freshness-trigger",
        default='{"mode": "processing_time", "interval_seconds": 0}',
        help="the trigger of A and B, as the config's trigger: section in JSON (default the "
        "low-latency setting)",
    )
    group.add_argument(
        "--freshness-linger-ms",
        type=float,
        default=5.0,
        help="the steady producer's linger.ms (default 5). The stand-in broker (Tansu) answers "
        "a partition's offsets in a time that grows with the record batches it holds: at 5 ms "
        "its offset requests on a live topic took 0.1 s each after ten minutes; on it, a long "
        "window (--freshness-seconds 1800) needs fewer, larger batches (100)",
    )
    group.add_argument(
        "--freshness-compact-every",
        type=float,
        default=0.0,
        metavar="S",
        help="the run's own compaction on A and B every S seconds "
        "(maintenance.compact_every_seconds; default 0: none)",
    )
    group.add_argument(
        "--freshness-before",
        metavar="REV",
        help="add side A0 before A (and B0 before B when B runs): A (B) on the engine of this "
        "git revision (a step's share before and after a change, in one run)",
    )
    group.add_argument(
        "--freshness-before-trigger",
        default='{"mode": "processing_time", "interval_seconds": 0.001}',
        help="A0's and B0's trigger (default the fastest an engine without interval 0 takes)",
    )


def check_options(parser: Any, args: Any) -> None:
    if args.freshness_linger_ms < 0:
        parser.error("--freshness-linger-ms must be >= 0")
    if args.freshness_compact_every < 0:
        parser.error("--freshness-compact-every must be >= 0 (0: no compaction)")
    if args.freshness_seconds <= 0 or args.freshness_warmup < 0 or args.freshness_tail_max <= 0:
        parser.error(
            "--freshness-seconds and --freshness-tail-max must be > 0, --freshness-warmup >= 0"
        )
    try:
        trigger = json.loads(args.freshness_trigger)
    except ValueError:
        trigger = None
    if not isinstance(trigger, dict):
        parser.error(f"--freshness-trigger: not a JSON object: {args.freshness_trigger!r}")
