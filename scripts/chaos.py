"""Crash harness: proves exactly-once (I1) and checkpoint-loss recovery (I3) under SIGKILL.

Generates a project, starts the development broker (Apache Kafka), produces records with unique
ids in rounds while the generated pipeline runs as a separate OS process (continuous trigger),
and kills that process with SIGKILL over and over: at random moments, and at the engine's named
crash points (after the Delta commit and before Spark records the batch; inside the commit-back
hook; mid-read; ...). Each restart reuses the checkpoint, except in some cycles where the
checkpoint folder is deleted first. A last fault-free run drains the topics, then an
independent reader (delta-rs and confluent-kafka directly, not the engine's code) checks the
table. Last line:

    chaos: kills=<K> checkpoint_resets=<C> produced=<N> table_rows=<N> distinct_ids=<N> \
missing=0 duplicates=0

With ``--pauses N`` the broker is paused (SIGSTOP) in N of the random-kill cycles, for
``--pause-seconds`` (longer than a metadata request's 30 s), then resumed (SIGCONT): the run
must ride the pause out (kafka.unavailable_timeout_seconds), still running when the cycle's
kill comes, and lose or double nothing.

With ``--faulty-transforms N``, N random-kill cycles (not paused ones) run a transform that
raises inside a Spark task instead (counted as kills): the run must stop by itself, exit status
1, with nothing committed; the next cycle runs the project's own transform again and resumes
exactly once.

With ``--fan-out`` the pipeline writes two tables from its one stream, routed by record (even
ids to one, odd to the other, both reading every partition), and the named crash points include
``between_tables``: a kill after the first table's commit of a batch and before the second's.
Rows are counted across both tables; each table's stored offsets must equal the group's.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from deltalake import DeltaTable
from kafka_delta_dev import broker as broker_mod
from kafka_delta_dev import produce as produce_mod

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

REPO = harness.REPO
CRASH_POINTS = ["after_delta_commit", "before_delta_commit", "in_commit_back", "mid_read"]
# Reached by one sink only. delta-spark: its commit is in Delta, the copy of its record not yet.
# delta-rs: the batch's data files are written by the tasks, the commit naming them not yet.
SINK_CRASH_POINTS = {"delta_spark": ["before_commit_copy"], "delta_rs": ["after_data_files"]}


def log(message: str) -> None:
    harness.log("chaos", message)


class RoundProducer:
    """Produces one round of records with consecutive unique ids, on a timer, while the
    pipeline process runs. ``formats``: the produce_events keyword arguments of a round (the
    value format, the registry; ``evolve`` once the schema change is due)."""

    def __init__(
        self, produce_events, bootstrap: str, topics: list[str], per_round: int, **formats
    ) -> None:
        self.produce_events, self.bootstrap, self.topics = produce_events, bootstrap, topics
        self.per_round = per_round
        self.formats = formats
        self.produced = 0
        self.error: BaseException | None = None
        self._timer: threading.Timer | None = None

    def _round(self) -> None:
        try:
            self.produced += self.produce_events(
                self.bootstrap, self.topics, self.per_round, first_id=self.produced, **self.formats
            )
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def start_round(self, delay_s: float) -> None:
        self._timer = threading.Timer(delay_s, self._round)
        self._timer.start()

    def wait(self) -> None:
        if self._timer is not None:
            self._timer.join()
        if self.error is not None:
            raise self.error


FAULTY_TRANSFORM = '''"""The project's transform, and a UDF that raises in every Spark task
(scripts/chaos.py --faulty-transforms): a run of it must stop and commit nothing."""

from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from {package}.transform import transform as own


@F.udf(LongType())
def _boom(value):
    raise ValueError(f"boom: a faulty transform met id {{value}} (chaos)")


def transform(df):
    return own(df).withColumn("id", _boom(F.col("id")))
'''


def faulty_transform(project: harness.Project, conf: dict) -> Path:
    """A config naming a transform that raises inside a task, beside the project's own."""
    module = project.root / "src" / project.package / "chaos_faulty.py"
    module.write_text(FAULTY_TRANSFORM.format(package=project.package), encoding="utf-8")
    return project.write_config(
        "chaos-faulty", {**conf, "transform": f"{project.package}.chaos_faulty:transform"}
    )


def table_version(table: str, storage_options: dict[str, str] | None) -> int | None:
    try:
        return DeltaTable(table, storage_options=storage_options).version()
    except Exception:  # no table yet
        return None


def run_faulty(
    command: list[str],
    project: Path,
    env: dict[str, str],
    producer: RoundProducer,
    table: str,
    storage_options: dict[str, str] | None,
    log_path: Path,
) -> None:
    """A run of the faulty transform with a round of records to read: it must stop by itself
    with exit status 1 and leave the table as it was."""
    producer.start_round(0.0)
    producer.wait()
    before = table_version(table, storage_options)
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            command, cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its group: Spark's JVM and workers too
            proc.wait()
    after = table_version(table, storage_options)
    if proc.returncode != 1 or before != after:
        print(log_path.read_text(errors="replace")[-4000:], file=sys.stderr)
        raise SystemExit(
            f"the faulty transform's run ended with {proc.returncode} (not 1) or committed "
            f"(table version {before} -> {after}); see {log_path}"
        )


def pause_broker(
    broker: broker_mod.Broker,
    proc: subprocess.Popen[bytes],
    producer: RoundProducer,
    after_s: float,
    pause_s: float,
    log_path: Path,
) -> str:
    """Pause the broker ``after_s`` after the run's first batch (a broker away when a run
    starts stops it at once, exit 2: not this move; and while Spark starts, nothing may ask
    Kafka for the pause's length), for ``pause_s``; resume it, produce a round, and wait (60 s
    at most) for the run to commit a batch after the pause: how the cycle went, for its line.
    The run must still be running then; the cycle's kill follows."""
    assert broker.process is not None
    deadline = time.monotonic() + 120.0
    while "INFO kafka_delta.pipeline: batch=" not in log_path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            return "broker not paused: the run did not start"
        time.sleep(0.2)
    time.sleep(after_s)
    os.kill(broker.process.pid, signal.SIGSTOP)
    try:
        time.sleep(pause_s)
    finally:
        os.kill(broker.process.pid, signal.SIGCONT)
    batches = log_path.read_text(errors="replace").count("kafka_delta.pipeline: batch=")
    producer.start_round(0.0)
    producer.wait()
    deadline = time.monotonic() + 60.0
    text = ""
    while proc.poll() is None and time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if text.count("kafka_delta.pipeline: batch=") > batches:
            break
        time.sleep(0.5)
    else:
        return f"broker paused {pause_s:.0f}s from {after_s:.1f}s: no batch after it"
    retries = text.count("Kafka is unavailable")
    return (
        f"broker paused {pause_s:.0f}s from {after_s:.1f}s, ridden out ({retries} retries), "
        "a batch after it, then SIGKILL"
    )


def first_commit_seconds(
    table_uri: str, started_wall: float, storage_options: dict[str, str] | None = None
) -> float | None:
    """Seconds from a process start to the first Delta commit it made (read from the log's
    commit timestamps), or None when it committed nothing before it died."""
    try:
        history = DeltaTable(table_uri, storage_options=storage_options).history(50)
    except Exception:  # no table yet
        return None
    stamps = [c["timestamp"] / 1000 for c in history if c["timestamp"] / 1000 >= started_wall]
    return min(stamps) - started_wall if stamps else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--resets", type=int, default=5, help="cycles that delete the checkpoint")
    parser.add_argument("--per-round", type=int, default=1500, help="records produced per cycle")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument(
        "--max-kill-delay",
        type=float,
        default=25.0,
        help="random kills happen 1..this many seconds after a start",
    )
    parser.add_argument(
        "--pauses", type=int, default=0, help="random-kill cycles that pause the broker first"
    )
    parser.add_argument(
        "--pause-seconds",
        type=float,
        default=35.0,
        help="how long a pause lasts (past 30 s, a metadata request fails and the run retries)",
    )
    parser.add_argument(
        "--faulty-transforms",
        type=int,
        default=0,
        help="random-kill cycles that run a transform raising in a task (the run must stop)",
    )
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--workdir", type=Path, default=REPO / ".chaos")
    parser.add_argument(
        "--format",
        choices=["json", "avro", "protobuf"],
        default="json",
        help="the records' format; avro and protobuf go through a local Schema Registry, and "
        "from the middle kill on the producers write a second schema version (an added field)",
    )
    parser.add_argument(
        "--table-on",
        choices=["disk", "s3"],
        default="disk",
        help="s3: the table and its dead-letter table in a bucket of a local S3 API (moto's "
        "server on loopback, kafka_delta_dev.object_store); delta_rs sink only",
    )
    parser.add_argument(
        "--sink",
        choices=["delta_rs", "delta_spark"],
        default="delta_rs",
        help="delta_spark needs delta-spark's jars: those scripts/bootstrap fetched through "
        f"Maven, or ${harness.JARS_ENV}=<folder>",
    )
    parser.add_argument(
        "--fan-out",
        action="store_true",
        help="two tables from one stream, routed by record (even and odd ids); kills between "
        "the two tables' commits of a batch too",
    )
    args = parser.parse_args(argv)
    if args.resets > args.kills:
        parser.error("--resets cannot exceed --kills (a reset happens before a killed cycle)")
    if args.pauses + args.faulty_transforms > args.kills // 2:
        parser.error(
            "--pauses and --faulty-transforms take random-kill cycles: half of --kills at most"
        )
    if args.faulty_transforms and args.fan_out:
        parser.error("--faulty-transforms runs the one-table pipeline only")
    if args.table_on == "s3" and args.sink != "delta_rs":
        parser.error("--table-on s3 needs --sink delta_rs (delta-spark on S3 needs hadoop-aws)")
    rng = random.Random(args.seed)

    settings = harness.sink_settings(args.sink, harness.default_jars())

    shutil.rmtree(args.workdir, ignore_errors=True)
    generated = harness.generate(args.workdir)
    project = generated.root

    conf = generated.conf
    conf["engine"] = settings["engine"]
    conf["spark"]["conf"].update(settings.get("spark_conf", {}))
    conf["trigger"] = {"mode": "processing_time", "interval_seconds": 1}
    conf["kafka"]["max_records_per_trigger"] = 700
    conf["commit_back"]["timeout_seconds"] = 3
    registry = None
    if args.format != "json":
        registry = generated.registry(args.workdir / "registry.log")
        conf["decoding"] = {
            "value": {"format": args.format},
            "schema_registry": {"url": registry.url},
        }
    store = storage_options = None
    table: str | Path = project / conf["delta"]["table"]
    if args.table_on == "s3":
        store = generated.object_store(args.workdir / "s3.log")
        table = f"{store.create_bucket('chaos')}/orders"
        storage_options = store.storage_options()
        conf["delta"].update(table=table, storage_options=storage_options)
    tables: list[str] = [str(table)]
    if args.fan_out:
        # One stream, two tables: every record reaches exactly one of them by its id.
        where = str(table).rstrip("/")
        routes = {"even": "id % 2 = 0", "odd": "id % 2 = 1"}
        conf["tables"] = {
            name: {
                "path": f"{where}_{name}",
                "route": route,
                "storage_options": storage_options or {},
            }
            for name, route in routes.items()
        }
        del conf["delta"]
        tables = [f"{where}_{name}" for name in routes]
        table = tables[0]
    config = generated.write_config("chaos", conf)
    faulty_command = None
    if args.faulty_transforms:
        faulty_command = generated.command(faulty_transform(generated, conf), "<bootstrap>")
    topics, group = conf["kafka"]["topics"], conf["kafka"]["consumer_group"]
    pipeline_id = conf["pipeline_id"]
    checkpoint = project / conf["checkpoint"]

    log(
        f"seed={args.seed} kills={args.kills} resets={args.resets} per_round={args.per_round} "
        f"sink={args.sink} format={args.format} table={table}"
    )
    broker = broker_mod.start_broker(
        broker_mod.dev_broker(log_path=args.workdir / "broker.log", folder=args.workdir / "kafka")
    )
    bootstrap = broker.bootstrap_servers
    env = generated.env()
    command = generated.command(config, bootstrap)
    recoveries: list[float] = []
    kills = resets = cycle = pauses = faulty = 0
    reset_every = max(1, args.kills // max(1, args.resets)) if args.resets else 0
    try:
        produce_mod.ensure_topics(bootstrap, topics, args.partitions)
        formats = {"value_format": args.format, "registry_url": registry and registry.url}
        producer = RoundProducer(
            produce_mod.produce_events, bootstrap, topics, args.per_round, **formats
        )
        while kills < args.kills:
            cycle += 1
            if registry is not None and kills == args.kills // 2 and "evolve" not in formats:
                # The schema changes while the pipeline is being killed: from this round on,
                # each round's second half is written with version 2 (a field added).
                formats["evolve"] = True
                producer.formats = formats
                log(f"cycle {cycle}: producers move to schema version 2 (a field added)")
            if args.resets and resets < args.resets and cycle % reset_every == 0:
                shutil.rmtree(checkpoint, ignore_errors=True)
                resets += 1
                log(f"cycle {cycle}: checkpoint deleted (reset {resets})")
            cycle_env = dict(env)
            if cycle % 2:
                # Named points in turn, so even a short run hits the one that matters most.
                points = CRASH_POINTS + SINK_CRASH_POINTS.get(args.sink, [])
                if args.fan_out:
                    points = ["between_tables", *points]
                point = points[(cycle // 2) % len(points)]
                cycle_env["KAFKA_DELTA_CRASH_AT"] = point
                how, delay = f"crash point {point}", 60.0
            else:
                delay = rng.uniform(1.0, args.max_kill_delay)
                how = f"SIGKILL after {delay:.1f}s"
            pause = not cycle % 2 and pauses < args.pauses
            if not cycle % 2 and not pause and faulty < args.faulty_transforms:
                assert faulty_command is not None
                faulty += 1
                run_faulty(
                    [bootstrap if a == "<bootstrap>" else a for a in faulty_command],
                    project,
                    env,
                    producer,
                    str(table),
                    storage_options,
                    args.workdir / f"run-{cycle:03d}.log",
                )
                kills += 1  # the run ended abnormally, as a kill ends it
                log(
                    f"cycle {cycle}: a transform raising in a task stopped the run (exit 1), "
                    "nothing committed"
                )
                continue
            log_path = args.workdir / f"run-{cycle:03d}.log"
            started = time.time()
            with open(log_path, "wb") as out:
                proc = subprocess.Popen(
                    command,
                    cwd=project,
                    env=cycle_env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # crash points and our kills hit its group only
                )
                # New records arrive while the pipeline starts up or runs.
                producer.start_round(rng.uniform(0.5, 4.0))
                if pause:
                    producer.wait()  # produced before the pause: a paused broker takes none
                    pauses += 1
                    how = pause_broker(
                        broker, proc, producer, min(delay, 5.0), args.pause_seconds, log_path
                    )
                    delay = 0.1 if proc.poll() is None else 0.0
                try:
                    proc.wait(timeout=delay)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    if how.startswith("crash point"):
                        how += " (not reached; killed at timeout)"
            producer.wait()
            if proc.returncode != -signal.SIGKILL:
                log(f"cycle {cycle}: pipeline exited with {proc.returncode}; see {log_path}")
                print(log_path.read_text(errors="replace")[-4000:], file=sys.stderr)
                return 1
            kills += 1
            recovery = first_commit_seconds(str(table), started, storage_options)
            if recovery is not None:
                recoveries.append(recovery)
            took = "no commit" if recovery is None else f"first commit after {recovery:.1f}s"
            log(f"cycle {cycle}: killed by {how}; {took}")
        log(f"all {producer.produced} records produced; final fault-free run until caught up")
        final = subprocess.run(
            [*command, "--trigger", "available-now", "--max-records-per-trigger", "200000"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
        )
        (args.workdir / "run-final.log").write_text(final.stdout + final.stderr)
        if final.returncode != 0:
            print(final.stderr[-4000:], file=sys.stderr)
            return 1

        verdict = harness.check(
            tables,
            None,
            producer.produced,
            0,
            pipeline_id,
            bootstrap,
            group,
            topics,
            storage_options,
        )
        log(f"stored offsets == group committed == latest: {verdict.offsets_ok}")
        columns = DeltaTable(str(table), storage_options=storage_options).schema().to_arrow()
        log(f"table columns: {', '.join(columns.names)}")
        if recoveries:
            log(
                f"restart to first committed batch: median {statistics.median(recoveries):.1f}s, "
                f"min {min(recoveries):.1f}s, "
                f"max {max(recoveries):.1f}s over {len(recoveries)} restarts"
            )
    finally:
        broker.stop()
        if registry is not None:
            registry.stop()
        if store is not None:
            store.stop()
    print(
        f"chaos: kills={kills} checkpoint_resets={resets} produced={verdict.produced} "
        f"table_rows={verdict.rows} distinct_ids={verdict.distinct} missing={verdict.missing} "
        f"duplicates={verdict.duplicates}"
    )
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    from kafka_delta.runtime.process_exit import run_and_exit  # the real exit status, see there

    run_and_exit(main)
