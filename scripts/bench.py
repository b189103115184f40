"""Benchmark: the generated pipeline side by side with the machine's limits, on one embedded broker.

    scripts/bench [--records 1000000] [--partitions 4] [--batch-size B] [--no-sweep] [--out .bench]
    scripts/bench --rows 4,5 --repeats 3 --no-sweep     # while tuning the pipeline

Rows, each measured in its own process tree (records/s, wall seconds, start-up, peak RSS):

1. raw consume limit: confluent-kafka reading all partitions, one process per core;
2. raw Delta write limit: delta-rs appending the same rows, already parsed in Arrow;
3. simple ingest: one Python process, confluent-kafka -> pyarrow.json -> delta-rs, with the same
   exactly-once commit (a ``txn`` action and the end offsets in ``userMetadata``);
4. the generated pipeline, exactly-once machinery on (txn, offsets in the commit, fencing,
   commit-back hook);
5. the same pipeline with that machinery off.

records/s is steady state: from the end of the first batch (row 1: from creating the consumers)
to the end of the run, so JVM start, Python imports and warm-up are excluded; start-up is reported
on its own (process start to first committed batch). Rows 4 and 5 also split their steady time
into read + parse + toArrow, the Delta sink, and Spark between batches (planning, checkpoint
logs), and repeat alternately with --repeats (median shown). Every table is checked to hold
exactly N rows with N distinct ids. An optional sweep runs the pipeline over batch sizes
(10k..500k records, scaled down for small --records) and partition counts (1, 4, 16). Output
in --out: bench.csv, bench.png, logs/. The LAST line is machine-checkable:

    bench: pipeline_rps=<X> raw_consume_rps=<Y> ratio_to_raw=<X/Y> overhead_pct=<%> \
simple_ingest_rps=<Z>

with overhead_pct = (rps with machinery off - rps with it on) / rps off * 100.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SWEEP_BATCH_SIZES = (10_000, 50_000, 100_000, 250_000, 500_000)
SWEEP_PARTITIONS = (1, 4, 16)
FULL_RECORDS = 1_000_000
TIME_SPLIT = {
    "steady_read_parse_s": "Kafka read + parse + toArrow",
    "steady_sink_s": "Delta sink",
    "steady_between_batches_s": "Spark between batches",
}
# librdkafka settings every reader in the benchmark shares (Tansu holds a fetch for the whole
# fetch.wait.max.ms; 100 ms reads faster than the default 500 ms, and changes nothing on Kafka).
CLIENT = {"fetch.wait.max.ms": 100}
POLL_TIMEOUT_S = 120.0


def say(message: str) -> None:
    print(message, flush=True)


# -- process-tree memory ---------------------------------------------------------------------

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses.
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(name))
    return tree


def tree_pids(root: int) -> list[int]:
    tree, pids, stack = _children(), [root], [root]
    while stack:
        for child in tree.get(stack.pop(), []):
            pids.append(child)
            stack.append(child)
    return pids


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


class TreeSampler(threading.Thread):
    """Samples the summed RSS of a process and all its descendants.

    psutil is not a dependency here; /proc gives the same numbers. Cheap on purpose (the
    machine under test has 2 cores): RSS from statm every ``interval_s``, the process tree
    rescanned every ``rescan_s``; PSS (smaps_rollup) would cost ~100 ms a sample for a Spark
    tree. A sampled peak can miss a spike shorter than the interval, and RSS counts pages
    shared between forked Python workers once per worker."""

    def __init__(self, pid: int, interval_s: float = 0.25, rescan_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval_s = interval_s
        self.rescan_s = rescan_s
        self.samples: list[tuple[float, int]] = []  # (time, rss bytes)
        self._stop_event = threading.Event()

    def run(self) -> None:
        pids: list[int] = []
        rescan_at = 0.0
        while not self._stop_event.is_set():
            if time.monotonic() >= rescan_at:
                pids = tree_pids(self.pid)
                rescan_at = time.monotonic() + self.rescan_s
            rss = sum(_rss(p) for p in pids)
            if rss:
                self.samples.append((time.time(), rss))
            self._stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    @property
    def peak_rss_mb(self) -> float:
        return max((s[1] for s in self.samples), default=0) / 2**20

    def rss_mb_at(self, when: float) -> float | None:
        """RSS of the first sample at or after ``when`` (None when the run ended first)."""
        for t, rss in self.samples:
            if t >= when:
                return rss / 2**20
        return None


# -- shared helpers (workers) ----------------------------------------------------------------


def _import_package(spec: dict[str, Any], module: str) -> Any:
    if spec["src"] not in sys.path:
        sys.path.insert(0, spec["src"])
    return importlib.import_module(f"{spec['package']}.{module}")


def _consumer(bootstrap: str, group: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            # The prefetch setting the embedded source's read tasks use by default: with
            # librdkafka's 1 s default, every ~100k records the fetcher sleeps most of a second
            # after filling its queue, and the "limit" row would measure that sleep.
            "fetch.queue.backoff.ms": 10,
            **CLIENT,
        }
    )


def read_batches(
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    batch_size: int,
    group: str,
    starts: dict[int, int] | None = None,
) -> Iterator[tuple[list[Any], dict[int, int]]]:
    """Read ``[starts, ends)`` of every partition; yield (messages, end offsets so far) every
    ``batch_size`` records. Stops per partition at the first offset >= end - 1 or at EOF."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    starts = starts or {}
    position = {p: starts.get(p, 0) for p in ends}
    pending = {p for p in ends if position[p] < ends[p]}
    if not pending:
        return
    consumer = _consumer(bootstrap, group)
    consumer.assign([TopicPartition(topic, p, position[p]) for p in sorted(pending)])
    batch: list[Any] = []
    deadline = time.monotonic() + POLL_TIMEOUT_S
    try:
        while pending:
            # Never ask for more than remains: consume() waits its whole timeout when fewer
            # messages than asked for arrive.
            remaining = sum(ends[p] - position[p] for p in pending)
            want = max(1, min(10_000, batch_size - len(batch), remaining))
            messages = consumer.consume(num_messages=want, timeout=0.5)
            if not messages:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}: no records for {POLL_TIMEOUT_S:.0f}s: {pending}")
                continue
            deadline = time.monotonic() + POLL_TIMEOUT_S
            for msg in messages:
                p = msg.partition()
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= ends[p]:
                            pending.discard(p)
                        continue
                    raise KafkaException(err)
                if p not in pending or msg.offset() >= ends[p]:
                    continue
                batch.append(msg)
                position[p] = msg.offset() + 1
                if position[p] >= ends[p]:
                    pending.discard(p)
            if len(batch) >= batch_size or (not pending and batch):
                yield batch, dict(position)
                batch = []
    finally:
        consumer.close()


def parse_messages(messages: Sequence[Any], topic: str) -> Any:
    """What a hand-written ingest does: JSON values parsed by pyarrow.json, plus the Kafka
    coordinates, in the columns of the generated project's sample transform."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("event_type", pa.string()),
            ("amount", pa.float64()),
            ("event_time", pa.timestamp("us", tz="UTC")),
        ]
    )
    data = pj.read_json(
        pa.BufferReader(b"\n".join(m.value() for m in messages)),
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )
    n = len(messages)
    return (
        data.append_column("topic", pa.array([topic] * n, pa.string()))
        .append_column("partition", pa.array([m.partition() for m in messages], pa.int32()))
        .append_column("offset", pa.array([m.offset() for m in messages], pa.int64()))
        .append_column(
            "kafka_timestamp",
            pa.array([m.timestamp()[1] * 1000 for m in messages], pa.timestamp("us", tz="UTC")),
        )
    )


# -- workers (each runs as its own process tree: `bench.py _worker <spec.json>`) -------------


def _consume_partitions(args: tuple[str, str, dict[int, int]]) -> tuple[float, float, float, int]:
    """(consumer created, first records in, last record in, records) of one process."""
    bootstrap, topic, ends = args
    created, first, count = time.time(), 0.0, 0
    for messages, _ in read_batches(bootstrap, topic, ends, 10_000, "bench-raw-consume"):
        first = first or time.time()
        for msg in messages:
            msg.value()
        count += len(messages)
    return created, first, time.time(), count


def work_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """Row 1: one process per core, partitions dealt round-robin, values touched, nothing kept.

    The clock runs from the creation of the consumers to the last record, every record counted:
    librdkafka prefetches in the background, so a clock started at the first records returned
    would leave out the fetching it is meant to measure."""
    ends = {int(p): o for p, o in spec["ends"].items()}
    parts = sorted(ends)
    procs = max(1, min(spec["processes"], len(parts)))
    shares = [{p: ends[p] for p in parts[i::procs]} for i in range(procs)]
    # fork before any Kafka client exists in this process (librdkafka threads do not fork).
    context = multiprocessing.get_context("fork")
    with context.Pool(procs) as pool:
        results = pool.map(
            _consume_partitions, [(spec["bootstrap"], spec["topic"], s) for s in shares]
        )
    firsts = [r[1] for r in results if r[1]]
    return {
        "rows": sum(r[3] for r in results),
        "clock_start": min(r[0] for r in results),
        "first_records": min(firsts) if firsts else time.time(),
        "end": max(r[2] for r in results),
        "batches": [],
    }


def work_write(spec: dict[str, Any]) -> dict[str, Any]:
    """Row 2: the rows are read and parsed first (untimed), then appended in batch-size commits."""
    from deltalake import write_deltalake

    ends = {int(p): o for p, o in spec["ends"].items()}
    prepared = [
        parse_messages(messages, spec["topic"])
        for messages, _ in read_batches(
            spec["bootstrap"], spec["topic"], ends, spec["batch_size"], "bench-raw-write"
        )
    ]
    begin = time.time()
    batches = []
    for data in prepared:
        write_deltalake(spec["table"], data, mode="append")
        batches.append((time.time(), data.num_rows))
    return {
        "rows": sum(b[1] for b in batches),
        "begin": begin,
        "batches": batches,
        "note": "rows pre-parsed, prep untimed",
    }


def work_simple(spec: dict[str, Any]) -> dict[str, Any]:
    """Row 3: the ingest a user might hand-write in one process, with the same exactly-once
    commit as the pipeline: resume from the offsets in the newest commit, and write each batch
    in one commit holding a txn (app id, version) and its end offsets in userMetadata."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import TableNotFoundError

    app_id = "bench-simple-ingest"
    topic, table_uri = spec["topic"], spec["table"]
    ends = {int(p): o for p, o in spec["ends"].items()}
    try:
        table = DeltaTable(table_uri)
        version = table.transaction_version(app_id)
        meta = json.loads(table.history(1)[0].get("userMetadata") or "{}")
        starts = {int(p): o for p, o in meta.get("offsets", {}).get(topic, {}).items()}
    except TableNotFoundError:
        version, starts = None, {}
    next_version = -1 if version is None else version
    batches = []
    for messages, position in read_batches(
        spec["bootstrap"], topic, ends, spec["batch_size"], "bench-simple", starts
    ):
        data = parse_messages(messages, topic)
        next_version += 1
        metadata = json.dumps({"offsets": {topic: {str(p): o for p, o in position.items()}}})
        write_deltalake(
            table_uri,
            data,
            mode="append",
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id, next_version)],
                custom_metadata={"userMetadata": metadata},
            ),
        )
        batches.append((time.time(), data.num_rows))
    return {"rows": sum(b[1] for b in batches), "batches": batches, "note": "1 process"}


def _spark(spec: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master(spec["master"])
        .appName("bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    return session


def _timed(fn: Callable[..., Any], total: list[float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - started

    return timed


def _run_pipeline(spark: Any, spec: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    config_mod = _import_package(spec, "config")
    pipeline_mod = _import_package(spec, "pipeline")
    config = config_mod.PipelineConfig.model_validate(
        {
            "pipeline_id": run["name"],
            "kafka": {
                "bootstrap_servers": spec["bootstrap"],
                "topics": [run["topic"]],
                "consumer_group": f"bench-{run['name']}",
                "max_records_per_trigger": run["batch_size"],
                "client": dict(CLIENT),
            },
            "delta": {"table": run["table"]},
            "checkpoint": run["checkpoint"],
        }
    )
    # (commit time, rows, seconds in the batch function, of which in the Delta sink)
    batches: list[tuple[float, int, float, float]] = []
    in_sink = [0.0]

    class TimedPipeline(pipeline_mod.Pipeline):  # type: ignore[name-defined,misc]
        """Records when each batch's commit returned and how long the sink took; the engine
        itself is untouched."""

        def _process_batch(self, df: Any, batch_id: int) -> None:
            rows_before, sink_before = self.summary.rows_written, in_sink[0]
            started = time.perf_counter()
            super()._process_batch(df, batch_id)
            batches.append(
                (
                    time.time(),
                    self.summary.rows_written - rows_before,
                    time.perf_counter() - started,
                    in_sink[0] - sink_before,
                )
            )

    pipeline = TimedPipeline(spark, config, exactly_once=run["exactly_once"])
    sink = getattr(pipeline, "sink", None)
    for method in ("commit_batch", "append_unprotected"):
        if sink is not None and hasattr(sink, method):
            setattr(sink, method, _timed(getattr(sink, method), in_sink))
    begin = time.time()
    summary = pipeline.run()
    stats = getattr(summary, "commit_back", None)
    return {
        "rows": summary.rows_written,
        "begin": begin,
        "end": time.time(),
        "batches": batches,
        "engine_batch_seconds": list(getattr(summary, "batch_seconds", [])),
        "commit_back_ok": getattr(stats, "succeeded", None),
        "commit_back_failed": getattr(stats, "failed", None),
    }


def work_pipeline(spec: dict[str, Any]) -> dict[str, Any]:
    """Rows 4 and 5: the generated pipeline in a fresh process (JVM start included)."""
    import logging

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    session_started = time.time()
    spark = _spark(spec)
    session_ready = time.time()
    try:
        result = _run_pipeline(spark, spec, spec)
    finally:
        spark.stop()
    result["spark_session_s"] = session_ready - session_started
    return result


def work_sweep(spec: dict[str, Any]) -> dict[str, Any]:
    """The sweep: one Spark session runs every point in turn (steady state excludes start-up)."""
    import logging

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = _spark(spec)
    try:
        points = []
        for run in spec["points"]:
            print(f"sweep point {run['name']}", flush=True)
            try:
                points.append({**run, **_run_pipeline(spark, spec, run)})
            except Exception as exc:  # one failed point must not lose the others
                logging.exception("sweep point %s failed", run["name"])
                points.append({**run, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
    finally:
        spark.stop()
    return {"points": points}


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "consume": work_consume,
    "write": work_write,
    "simple": work_simple,
    "pipeline": work_pipeline,
    "sweep": work_sweep,
}


def worker_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    result = WORKERS[spec["kind"]](spec)
    Path(spec["result"]).write_text(json.dumps(result))
    return 0


# -- the orchestrator ------------------------------------------------------------------------


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
    extra: dict[str, Any] = field(default_factory=dict)


class WorkerError(RuntimeError):
    pass


def run_worker(
    kind: str, spec: dict[str, Any], out: Path, name: str, env: dict[str, str], timeout_s: float
) -> tuple[dict[str, Any], float, TreeSampler]:
    """Run one worker process tree, sampling its memory; returns (result, start time, sampler)."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "kind": kind, "result": str(logs / f"{name}.result.json")}
    spec_path = logs / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    Path(spec["result"]).unlink(missing_ok=True)
    with open(logs / f"{name}.log", "wb") as log:
        started = time.time()
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "_worker", str(spec_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=out,
            start_new_session=True,
        )
        sampler = TreeSampler(proc.pid)
        sampler.start()
        code: int | None = None
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            sampler.stop()
            # A timeout or Ctrl-C: take down the whole worker tree (JVM, Python workers);
            # after a normal exit, whatever of that session outlived the worker.
            _kill_group(proc, signal.SIGKILL if code is None else signal.SIGTERM)
    if code != 0:
        tail = (logs / f"{name}.log").read_text(errors="replace").splitlines()[-25:]
        why = "timed out" if code is None else f"exited with {code}"
        raise WorkerError(f"{name} {why}; last lines of {logs / name}.log:\n" + "\n".join(tail))
    return json.loads(Path(spec["result"]).read_text()), started, sampler


def _kill_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the worker's own session (start_new_session=True made it the group leader)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def steady(batches: Sequence[Sequence[float]]) -> tuple[float, float | None]:
    """(records/s after the first batch, from first to last commit; first-batch end time).
    One batch only: its own rate (no steady state to measure)."""
    if not batches:
        return 0.0, None
    first_end = batches[0][0]
    if len(batches) == 1:
        return 0.0, first_end
    rows = sum(b[1] for b in batches[1:])
    span = batches[-1][0] - first_end
    return (rows / span if span > 0 else 0.0), first_end


def busy_rate(batches: Sequence[Sequence[float]]) -> float | None:
    """Records/s inside the batch function only (RunSummary.batch_seconds), first batch left
    out: what the pipeline would do if Spark's work between batches cost nothing."""
    busy = sum(b[2] for b in batches[1:])
    return sum(b[1] for b in batches[1:]) / busy if busy > 0 else None


def time_split(batches: Sequence[Sequence[float]]) -> dict[str, float]:
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


def scaled_batch_sizes(records: int) -> list[int]:
    """10k..500k at 1M records; scaled down for fewer records, never below records/20 (at most
    ~20 batches a point) nor above records/2 (at least two batches, one of them steady)."""
    scale = min(1.0, records / FULL_RECORDS)
    floor = max(100, records // 20) if records < FULL_RECORDS else 0
    sizes = {min(max(floor, round(s * scale)), max(1, records // 2)) for s in SWEEP_BATCH_SIZES}
    return sorted(sizes)


def default_batch_size(records: int) -> int:
    """Five batches: four steady ones after the first, capped at the template's 500k."""
    return max(100, min(500_000, records // 5))


def _int_list(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=FULL_RECORDS, help="N (default 1M)")
    parser.add_argument("--partitions", type=int, default=4, help="P (default 4)")
    parser.add_argument(
        "--batch-size",
        type=int,
        help="records per batch / max_records_per_trigger (default records/5, at most 500k)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of rows 4-5 (median shown)")
    parser.add_argument(
        "--rows",
        type=_int_list,
        default=[1, 2, 3, 4, 5],
        help="rows to run, e.g. 4,5 while tuning the pipeline (default all; the last line shows "
        "0 for rows left out)",
    )
    parser.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the batch-size x partitions sweep for the chart (default on)",
    )
    parser.add_argument(
        "--sweep-batch-sizes", type=_int_list, help="default 10k..500k, scaled to --sweep-records"
    )
    parser.add_argument(
        "--sweep-partitions", type=_int_list, default=list(SWEEP_PARTITIONS), help="default 1,4,16"
    )
    parser.add_argument("--sweep-records", type=int, help="records per sweep point (default N)")
    parser.add_argument(
        "--consumers", type=int, default=os.cpu_count() or 1, help="row 1 processes (cores)"
    )
    parser.add_argument("--spark-master", default="local[2]", help="default local[2]")
    parser.add_argument(
        "--out", type=Path, default=REPO / ".bench", help="bench.csv, bench.png, logs/ go here"
    )
    parser.add_argument("--keep-tables", action="store_true", help="keep the Delta tables")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
    args = parser.parse_args(argv)
    if args.records < 2 or args.partitions < 1 or args.repeats < 1:
        parser.error("--records must be >= 2, --partitions and --repeats >= 1")
    args.batch_size = args.batch_size or default_batch_size(args.records)
    args.sweep_records = args.sweep_records or args.records
    args.sweep_batch_sizes = args.sweep_batch_sizes or scaled_batch_sizes(args.sweep_records)
    return args


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out.resolve()
        self.rows: list[Row] = []
        self.sweep: list[Row] = []
        self.topics: dict[tuple[int, int], str] = {}
        self.problems: list[str] = []

    # set-up

    def prepare(self) -> None:
        from cookiecutter.main import cookiecutter

        self.out.mkdir(parents=True, exist_ok=True)
        for sub in ("project", "tables", "checkpoints", "logs"):
            shutil.rmtree(self.out / sub, ignore_errors=True)
        (self.out / "logs").mkdir()
        project = Path(
            cookiecutter(
                str(REPO / "template"),
                no_input=True,
                config_file=str(REPO / "conf" / "embedded-local.yaml"),
                output_dir=str(self.out / "project"),
            )
        )
        (package,) = [p.name for p in (project / "src").iterdir() if (p / "__init__.py").exists()]
        self.src, self.package = str(project / "src"), package
        sys.path.insert(0, self.src)
        self.broker_mod = importlib.import_module(f"{package}.devtools.broker")
        self.produce_mod = importlib.import_module(f"{package}.devtools.produce")
        self.admin_mod = importlib.import_module(f"{package}.kafka_admin")
        # Spark's Python workers import the package by name and must run this interpreter.
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env["PYTHONPATH"] = self.src
        self.env["PYSPARK_PYTHON"] = sys.executable
        self.env["PYSPARK_DRIVER_PYTHON"] = sys.executable

    def topic(self, records: int, partitions: int) -> tuple[str, dict[int, int]]:
        """A topic holding ``records`` events over ``partitions``, produced once per run."""
        key = (records, partitions)
        name = self.topics.get(key)
        if name is None:
            name = f"bench-n{records}-p{partitions}"
            started = time.perf_counter()
            self.produce_mod.ensure_topics(self.bootstrap, [name], partitions)
            self.produce_mod.produce_events(self.bootstrap, [name], records)
            say(
                f"    produced {records:,} events to {name} ({partitions} partitions) in "
                f"{time.perf_counter() - started:.1f}s"
            )
            self.topics[key] = name
        admin = self.admin_mod.KafkaAdmin({"bootstrap.servers": self.bootstrap})
        latest = admin.latest({name: list(range(partitions))})[name]
        return name, latest

    def spec(self, topic: str, ends: dict[int, int], **extra: Any) -> dict[str, Any]:
        return {
            "src": self.src,
            "package": self.package,
            "bootstrap": self.bootstrap,
            "topic": topic,
            "ends": {str(p): o for p, o in ends.items()},
            "batch_size": self.args.batch_size,
            "master": self.args.spark_master,
            **extra,
        }

    # rows

    def measure(self, row: Row, kind: str, spec: dict[str, Any], table: Path | None) -> Row:
        label = f"{row.number}-{kind}" + (f"-{row.repeat}" if row.repeat else "")
        say(f"==> {row.number}. {row.name}" + (f" (run {row.repeat + 1})" if row.repeat else ""))
        try:
            result, started, sampler = run_worker(
                kind, spec, self.out, label, self.env, self.args.timeout
            )
        except WorkerError as exc:
            row.check = "FAILED"
            self.problems.append(str(exc))
            say(f"    {exc}")
            return row
        batches = result.get("batches") or []
        row.rows_out = int(result["rows"])
        row.batches = len(batches)
        row.peak_rss_mb = sampler.peak_rss_mb
        row.note = result.get("note", "")
        if kind == "consume":
            span = result["end"] - result["clock_start"]
            row.rps = row.rows_out / span if span > 0 else 0.0
            row.startup_s = result["first_records"] - started
            row.wall_s = result["end"] - started
        else:
            row.rps, first_end = steady(batches)
            # Row 2 starts its clock once its rows are parsed; the others at process start.
            begin = result["begin"] if kind == "write" else started
            if row.batches == 1:  # no steady state: the one batch, start-up included
                row.rps = row.rows_out / (batches[0][0] - begin)
                row.note = "; ".join(filter(None, (row.note, "1 batch, no steady state")))
            row.startup_s = first_end - begin if first_end else None
            finished = max(result.get("end", 0.0), batches[-1][0] if batches else 0.0)
            row.wall_s = finished - begin
            if kind == "pipeline":
                row.busy_rps = busy_rate(batches)
                row.extra.update(time_split(batches))
                row.extra["spark_session_s"] = round(result.get("spark_session_s", 0.0), 2)
                row.extra["run_start_to_first_batch_s"] = (
                    round(first_end - result["begin"], 2) if first_end else None
                )
                row.extra["commit_back_ok"] = result.get("commit_back_ok")
                row.extra["commit_back_failed"] = result.get("commit_back_failed")
            if len(batches) > 1:
                first_rss = sampler.rss_mb_at(batches[0][0])
                last_rss = sampler.rss_mb_at(batches[-1][0])
                row.extra["rss_after_first_batch_mb"] = _round(first_rss)
                row.extra["rss_after_last_batch_mb"] = _round(last_rss)
        self.check(row, table)
        say(
            f"    {row.rps:,.0f} records/s steady, {row.wall_s:.1f}s wall, start-up "
            f"{_fmt(row.startup_s, '{:.1f}s')}, peak RSS {row.peak_rss_mb:,.0f} MB, {row.check}"
        )
        return row

    def check(self, row: Row, table: Path | None) -> None:
        if table is None:
            row.verified = row.rows_out == row.records
            row.check = f"{row.rows_out:,} records read"
        else:
            ok, _, distinct, message = verify_table(table, row.records)
            row.verified, row.distinct_ids, row.check = ok, distinct, message
            if not self.args.keep_tables:
                shutil.rmtree(table, ignore_errors=True)
        if not row.verified:
            self.problems.append(f"row {row.number} ({row.name}): {row.check}")
            row.check = "FAILED: " + row.check

    def run_main(self) -> None:
        a = self.args
        topic, ends = self.topic(a.records, a.partitions)
        tables, checkpoints = self.out / "tables", self.out / "checkpoints"

        def row(number: int, name: str, repeat: int = 0) -> Row:
            return Row(
                number, name, a.records, a.batch_size, repeat=repeat, partitions=a.partitions
            )

        procs = max(1, min(a.consumers, len(ends)))
        if 1 in a.rows:
            self.rows.append(
                self.measure(
                    row(1, f"raw consume (confluent-kafka x {procs} procs)"),
                    "consume",
                    self.spec(topic, ends, processes=a.consumers),
                    None,
                )
            )
            self.rows[-1].batch_size = None
        for number, kind, name in (
            (2, "write", "raw Delta write (delta-rs from parsed Arrow)"),
            (3, "simple", "simple ingest (kafka > pyarrow.json > delta-rs + txn)"),
        ):
            if number not in a.rows:
                continue
            table = tables / f"{number}-{kind}"
            self.rows.append(
                self.measure(
                    row(number, name), kind, self.spec(topic, ends, table=str(table)), table
                )
            )
        for repeat in range(a.repeats):
            order = (True, False) if repeat % 2 == 0 else (False, True)
            for exactly_once in order:
                number = 4 if exactly_once else 5
                if number not in a.rows:
                    continue
                name = "pipeline exactly-once " + ("on" if exactly_once else "off")
                label = f"{number}-pipeline-{repeat}"
                spec = self.spec(
                    topic,
                    ends,
                    name=f"bench-{'eo' if exactly_once else 'plain'}-{repeat}",
                    table=str(tables / label),
                    checkpoint=str(checkpoints / label),
                    exactly_once=exactly_once,
                )
                self.rows.append(
                    self.measure(row(number, name, repeat), "pipeline", spec, tables / label)
                )

    def run_sweep(self) -> None:
        a = self.args
        points = []
        for partitions in a.sweep_partitions:
            topic, _ = self.topic(a.sweep_records, partitions)
            for size in a.sweep_batch_sizes:
                label = f"sweep-p{partitions}-b{size}"
                points.append(
                    {
                        "name": label,
                        "topic": topic,
                        "partitions": partitions,
                        "batch_size": size,
                        "table": str(self.out / "tables" / label),
                        "checkpoint": str(self.out / "checkpoints" / label),
                        "exactly_once": True,
                    }
                )
        say(
            f"==> sweep: pipeline (exactly-once on) over batch sizes "
            f"{', '.join(f'{s:,}' for s in a.sweep_batch_sizes)} x partitions "
            f"{', '.join(map(str, a.sweep_partitions))}, {a.sweep_records:,} records each, "
            "one Spark session"
        )
        spec = {
            "src": self.src,
            "package": self.package,
            "bootstrap": self.bootstrap,
            "master": a.spark_master,
            "points": points,
        }
        try:
            result, _, _ = run_worker("sweep", spec, self.out, "sweep", self.env, a.timeout)
        except WorkerError as exc:
            self.problems.append(str(exc))
            say(f"    {exc}")
            return
        for point in result["points"]:
            if "error" in point:
                self.problems.append(f"sweep point {point['name']} failed: {point['error']}")
                say(f"    {point['name']}: FAILED ({point['error']}); see logs/sweep.log")
                continue
            r = Row(
                0,
                f"sweep p={point['partitions']} batch={point['batch_size']}",
                a.sweep_records,
                point["batch_size"],
                partitions=point["partitions"],
            )
            batches = point["batches"]
            r.rows_out, r.batches = point["rows"], len(batches)
            r.rps, first_end = steady(batches)
            if r.batches == 1:
                r.rps = r.rows_out / (batches[0][0] - point["begin"])
                r.note = "1 batch, no steady state"
            r.busy_rps = busy_rate(batches)
            r.extra.update(time_split(batches))
            r.wall_s = point["end"] - point["begin"]
            r.startup_s = first_end - point["begin"] if first_end else None
            self.check(r, Path(point["table"]))
            say(
                f"    p={point['partitions']:<3} batch={point['batch_size']:>9,}  "
                f"{r.rps:>10,.0f} records/s  {r.batches:>3} batches  {r.check}"
            )
            self.sweep.append(r)

    # output

    def summary_rows(self) -> list[Row]:
        """One row per benchmark line; repeated rows (4, 5) as the median of each figure."""
        out = []
        for number in range(1, 6):
            runs = [r for r in self.rows if r.number == number]
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
            extra = {
                key: statistics.median(values)
                for key in TIME_SPLIT
                if (values := [r.extra[key] for r in runs if key in r.extra])
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

    def write_csv(self) -> Path:
        path = self.out / "bench.csv"
        extra_keys = sorted({k for r in self.rows + self.sweep for k in r.extra})
        header = [
            "section",
            "row",
            "name",
            "repeat",
            "records",
            "partitions",
            "batch_size",
            "records_per_s",
            "busy_records_per_s",
            "wall_s",
            "startup_s",
            "peak_rss_mb",
            "batches",
            "rows_out",
            "distinct_ids",
            "verified",
            "note",
            *extra_keys,
        ]
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            for section, rows in (("main", self.rows), ("sweep", self.sweep)):
                for r in rows:
                    writer.writerow(
                        [
                            section,
                            r.number or "",
                            r.name,
                            r.repeat,
                            r.records,
                            r.partitions,
                            r.batch_size or "",
                            round(r.rps, 1),
                            "" if r.busy_rps is None else round(r.busy_rps, 1),
                            round(r.wall_s, 3),
                            "" if r.startup_s is None else round(r.startup_s, 3),
                            round(r.peak_rss_mb, 1) if r.peak_rss_mb else "",
                            r.batches,
                            r.rows_out,
                            "" if r.distinct_ids is None else r.distinct_ids,
                            r.verified,
                            r.note,
                            *[r.extra.get(k, "") for k in extra_keys],
                        ]
                    )
        return path

    def write_chart(self) -> Path | None:
        if not self.sweep and not self.rows:
            return None
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator
        except ImportError:
            say("    (matplotlib is not installed: no chart)")
            return None
        fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
        for partitions in sorted({r.partitions for r in self.sweep}):
            points = sorted(
                (r.batch_size or 0, r.rps) for r in self.sweep if r.partitions == partitions
            )
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker="o",
                label=f"pipeline, {partitions} partition{'s' if partitions > 1 else ''}",
            )
        summary = {r.number: r for r in self.summary_rows()}
        styles = {1: ("raw consume limit", "k", "--"), 3: ("simple ingest", "tab:gray", ":")}
        for number, (label, color, style) in styles.items():
            if number in summary and summary[number].rps > 0:
                ax.axhline(summary[number].rps, color=color, linestyle=style, label=label)
        if 4 in summary and summary[4].rps > 0:
            ax.plot(
                [summary[4].batch_size],
                [summary[4].rps],
                marker="*",
                markersize=14,
                color="tab:red",
                linestyle="none",
                label=f"pipeline row 4 ({self.args.partitions} partitions)",
            )
        ax.set_xscale("log")
        sizes = sorted({r.batch_size for r in self.sweep if r.batch_size}) or [self.args.batch_size]
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _short(v)))
        ax.set_xlabel("batch size (max_records_per_trigger, records)")
        plotted = [r.rps for r in self.sweep if r.rps > 0] + [
            summary[n].rps for n in (1, 3, 4) if n in summary and summary[n].rps > 0
        ]
        if plotted and max(plotted) > 10 * min(plotted):
            # The limits sit far above the pipeline: a log scale keeps both readable.
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_ylabel("records/s (steady state, log scale)")
        else:
            ax.set_ylim(bottom=0)
            ax.set_ylabel("records/s (steady state)")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _short(v)))
        ax.set_title(
            f"Kafka -> Delta, {os.cpu_count()} cores, {self.args.sweep_records:,} records/point"
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = self.out / "bench.png"
        fig.savefig(path)
        plt.close(fig)
        return path

    def print_table(self) -> None:
        rows = self.summary_rows()
        raw = next((r.rps for r in rows if r.number == 1), 0.0)
        a = self.args
        say("")
        say(
            f"{a.records:,} JSON events (~75 bytes) over {a.partitions} partitions, batch "
            f"{a.batch_size:,} records, {os.cpu_count()} cores, Spark {a.spark_master}, "
            "embedded Tansu broker"
        )
        header = (
            f"{'#':>2}  {'run':<54}{'records/s':>11}{'x raw':>7}{'wall s':>8}{'start-up s':>11}"
            f"{'peak RSS MB':>12}{'batches':>8}  table / check"
        )
        say(header)
        say("-" * len(header))
        for r in rows:
            say(
                f"{r.number:>2}  {r.name:<54}{r.rps:>11,.0f}"
                f"{(r.rps / raw if raw else 0):>7.2f}{r.wall_s:>8.1f}"
                f"{_fmt(r.startup_s, '{:.1f}'):>11}{r.peak_rss_mb:>12,.0f}"
                f"{(r.batches or '-'):>8}  {r.check}"
            )
        for r in rows:
            split = {k: r.extra.get(k) for k in TIME_SPLIT}
            total = sum(v for v in split.values() if v)
            if r.number in (4, 5) and total > 0:
                say(
                    f"row {r.number} steady batches, where the time goes: "
                    + ", ".join(
                        f"{label} {split[key] / total:.0%}" for key, label in TIME_SPLIT.items()
                    )
                    + f" (of {total:.1f}s)"
                )
        notes = [f"{r.number}: {r.note}" for r in rows if r.note]
        if notes:
            say("notes: " + "; ".join(notes))
        say(
            "records/s: steady state, from the first committed batch to the end (row 1: from "
            "creating the consumers); start-up: process start to first committed batch (row 2: "
            "from rows ready); peak RSS: sampled sum over the process tree."
        )

    def last_line(self) -> str:
        by = {r.number: r.rps for r in self.summary_rows()}
        on, off, raw = by.get(4, 0.0), by.get(5, 0.0), by.get(1, 0.0)
        ratio = on / raw if raw else 0.0
        overhead = (off - on) / off * 100 if off else 0.0
        return (
            f"bench: pipeline_rps={on:.0f} raw_consume_rps={raw:.0f} ratio_to_raw={ratio:.4f} "
            f"overhead_pct={overhead:.2f} simple_ingest_rps={by.get(3, 0.0):.0f}"
        )

    def run(self) -> int:
        a = self.args
        say(f"==> generating a project from conf/embedded-local.yaml into {self.out / 'project'}")
        self.prepare()
        say("==> starting the embedded broker (Tansu) on 127.0.0.1")
        broker = self.broker_mod.EmbeddedBroker(log_path=self.out / "logs" / "broker.log")
        broker.start()
        try:
            self.bootstrap = broker.bootstrap_servers
            say(f"    {self.bootstrap}")
            self.run_main()
            if a.sweep:
                self.run_sweep()
        finally:
            broker.stop()
        csv_path = self.write_csv()
        chart = self.write_chart()
        self.print_table()
        say(f"wrote {csv_path}" + (f" and {chart}" if chart else ""))
        for problem in self.problems:
            say(f"PROBLEM: {problem.splitlines()[0]}")
        say(self.last_line())
        return 1 if self.problems else 0


def _short(value: float) -> str:
    """10000 -> 10k, 1500000 -> 1.5M (chart ticks)."""
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:g}{suffix}"
    return f"{value:g}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        return worker_main(argv[1])
    return Bench(parse_args(argv)).run()


if __name__ == "__main__":
    from process_exit import run_and_exit  # leaves with the real status, see there

    run_and_exit(main)
