"""Operations harness: proves exactly-once through what operators do to a running pipeline (I8).

Generates a project, starts the embedded broker and, for each sink (delta_rs, and delta_spark
when KAFKA_DELTA_JARS names a folder of delta-spark jars), runs the generated pipeline as
separate OS processes through these scenarios while records keep arriving:

- topics: a topic added to the subscription; a topic removed, written to, and added back;
- partitions: partitions added (where the broker allows CreatePartitions; Tansu 0.6 does not,
  and then the planning code is checked against the real broker's metadata instead);
- retries: a checkpoint whose batch 0 was planned and killed is restarted after another
  checkpoint moved the table on: it is set aside (I9), and the run resumes from the table;
- concurrency: two checkpoints of one pipeline run at once: each exits 0, or 3 when fenced
  (one ``error:`` line, no traceback); both are then restarted: both exit 0;
- transactions: transactional producers that commit, and that abort where the broker filters
  aborted records for read_committed readers (Tansu 0.6 does not; then it is reported);
- restore: a Delta RESTORE (the sink's own engine) undoes pipeline commits whose range held
  bad records; restarted with its checkpoint (set aside), the pipeline reads the undone
  records again, and sends none of their dead letters twice;
- rewind: `offsets reset` skips a range holding bad records, later dead letters pass it, and
  a rewind reads it again: each bad record is sent once, and no run is fenced;
- recreated topic: a topic deleted and created again with more records than the stored
  offsets: with fail_on_data_loss the run stops (exit 2) writing nothing; without, it is read
  from its first record;
- log cleanup: other writers commit, a Delta checkpoint is written and the JSON commits it
  covers are deleted, as Delta's cleanup does; restarts with the checkpoint kept and deleted.

After each scenario an independent reader (delta-rs and confluent-kafka directly) checks rows ==
distinct ids == produced, the dead-letter table, and stored == group committed == latest.
Last line:

    ops: scenarios=<S> sinks=<K> produced=<N> table_rows=<N> distinct_ids=<N> missing=0 \
duplicates=0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from deltalake import DeltaTable, write_deltalake
from kafka_delta.sources.kafka_datasource import KafkaStreamReader, ReadAllAvailable
from kafka_delta_dev import produce
from kafka_delta_dev.broker import EmbeddedBroker

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

BAD_VALUES = [b"not json", b'{"id": 1, "event_ty', b'{"id": "seven"}']


def log(message: str) -> None:
    harness.log("ops", message)


class Feed:
    """Produces events with consecutive unique ids, and bad records, counting both."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.produced = 0
        self.bad = 0
        self.rng = random.Random(11)

    def events(self, topics: list[str], count: int) -> None:
        self.produced += produce.produce_events(
            self.bootstrap, topics, count, first_id=self.produced
        )

    def bad_records(self, topic: str) -> None:
        values = [(i % 2, v) for i, v in enumerate(BAD_VALUES)]
        produce.produce_values(self.bootstrap, topic, values)
        self.bad += len(values)

    def transaction(self, topic: str, count: int, *, abort: bool, txn_id: str) -> None:
        """``count`` events in one transaction; aborted ones get ids the table must never hold."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": txn_id})
        producer.init_transactions(10)
        producer.begin_transaction()
        first = 10**9 if abort else self.produced
        for i in range(count):
            value = produce.event(first + i, self.rng)
            producer.produce(topic, value=value, partition=i % 2)
        if abort:
            producer.abort_transaction(10)
        else:
            producer.commit_transaction(10)
            self.produced += count


class Sink:
    """One sink's pipeline: its config, checkpoints, and runs of it as OS processes."""

    def __init__(
        self, ops: Ops, name: str, settings: dict[str, Any], jars: str | None = None
    ) -> None:
        self.ops, self.name, self.jars = ops, name, jars
        base = ops.project.conf
        self.topics = list(base["kafka"]["topics"])
        self.work = ops.workdir / name
        self.work.mkdir(parents=True)
        self.table = str(self.work / "table")
        self.checkpoint = str(self.work / "checkpoint")
        self.conf = {
            **base,
            "pipeline_id": f"ops-{name.replace('_', '-')}",
            "engine": settings["engine"],
            "delta": {**base["delta"], "table": self.table},
            "dead_letters": {"enabled": True, "table": self.table + "_dead_letters"},
            "checkpoint": self.checkpoint,
            "trigger": {"mode": "available_now", "interval_seconds": 1},
            "commit_back": {"enabled": True, "timeout_seconds": 5},
        }
        self.conf["kafka"] = {
            **base["kafka"],
            "consumer_group": f"ops-{name}",
            "max_records_per_trigger": 400,
        }
        self.conf["spark"] = {
            **base["spark"],
            "conf": {**base["spark"]["conf"], **settings.get("spark_conf", {})},
        }
        self.runs = 0
        self.last: harness.Check | None = None

    def config(self, topics: list[str] | None = None, **overrides: Any) -> Path:
        conf = {**self.conf, **overrides}
        conf["kafka"] = {**conf["kafka"], "topics": topics or self.topics}
        self.runs += 1
        return self.ops.project.write_config(f"ops-{self.name}-{self.runs}", conf)

    def run(
        self,
        topics: list[str] | None = None,
        *,
        checkpoint: str | None = None,
        env: dict[str, str] | None = None,
        expect: int | None = 0,
        **overrides: Any,
    ) -> str:
        config = self.config(topics, checkpoint=checkpoint or self.checkpoint, **overrides)
        command = self.ops.project.command(config, self.ops.bootstrap)
        log_path = self.work / f"run-{self.runs:02d}.log"
        code, output = harness.run(
            command, self.ops.project.root, self.ops.project.env(**(env or {})), log_path
        )
        if expect is not None and code != expect:
            raise RuntimeError(
                f"{self.name}: run {self.runs} exited {code}, expected {expect}; see {log_path}:\n"
                + output[-3000:]
            )
        return output

    def offsets(self, *args: str, expect: int = 0) -> str:
        """``python -m <package> offsets <args>`` on this sink's pipeline, as an operator runs
        it."""
        config = self.config()
        project = self.ops.project
        command = [sys.executable, "-m", project.package, "offsets", *args]
        command += ["--config", str(config), "--bootstrap-servers", self.ops.bootstrap]
        log_path = self.work / f"offsets-{self.runs:02d}.log"
        code, output = harness.run(command, project.root, project.env(), log_path)
        if code != expect:
            raise RuntimeError(
                f"{self.name}: offsets {' '.join(args)} exited {code}, expected {expect}:\n"
                + output[-3000:]
            )
        return output

    def versions(self) -> tuple[int, int | None]:
        """The Delta versions of the table and of the dead-letter table (None: not created)."""
        dead = self.conf["dead_letters"]["table"]
        dead_version = DeltaTable(dead).version() if Path(dead, "_delta_log").is_dir() else None
        return DeltaTable(self.table).version(), dead_version

    def check(self, topics: list[str] | None = None) -> harness.Check:
        """The independent reader's verdict, not asserted."""
        feed = self.ops.feeds[self.name]
        return harness.check(
            self.table,
            self.conf["dead_letters"]["table"],
            feed.produced,
            feed.bad,
            self.conf["pipeline_id"],
            self.ops.bootstrap,
            self.conf["kafka"]["consumer_group"],
            topics or self.topics,
        )

    def verify(self, scenario: str, topics: list[str] | None = None) -> harness.Check:
        verdict = self.check(topics)
        log(f"{self.name} {scenario}: {verdict.summary()}")
        if not verdict.ok:
            raise AssertionError(f"{self.name} {scenario}: {verdict.summary()}")
        self.ops.scenarios.add(scenario)
        self.last = verdict
        return verdict


class Ops:
    def __init__(self, project: harness.Project, bootstrap: str, workdir: Path) -> None:
        self.project, self.bootstrap, self.workdir = project, bootstrap, workdir
        self.feeds: dict[str, Feed] = {}
        self.scenarios: set[str] = set()
        self.notes: list[str] = []


# -- scenarios --------------------------------------------------------------------------------


def scenario_topics(sink: Sink, feed: Feed) -> None:
    extra = f"{sink.topics[0]}-{sink.name}-added"
    produce.ensure_topics(sink.ops.bootstrap, [extra], 2)
    feed.events([extra], 120)  # already holds records when it is added: they must land
    feed.events(sink.topics, 200)
    sink.topics = [*sink.topics, extra]
    sink.run()
    sink.verify("topics: added")
    # Removed, written to meanwhile, added back: it resumes where the table stopped it.
    feed.events(sink.topics[:-1], 100)
    sink.run(sink.topics[:-1])
    sink.verify("topics: removed", sink.topics[:-1])
    feed.events([extra], 80)  # while it is not subscribed
    feed.events(sink.topics, 100)
    sink.run()
    sink.verify("topics: re-added")


def scenario_partitions(sink: Sink, feed: Feed) -> None:
    topic = f"{sink.topics[0]}-{sink.name}-grown"
    produce.ensure_topics(sink.ops.bootstrap, [topic], 1)
    feed.events([topic], 60)
    sink.topics = [*sink.topics, topic]
    sink.run()
    admin = AdminClient({"bootstrap.servers": sink.ops.bootstrap})
    try:
        admin.create_partitions([NewPartitions(topic, 3)], request_timeout=10)[topic].result()
    except Exception as exc:
        refused = str(exc)
    else:
        time.sleep(2)  # metadata propagation
        feed.events([topic], 90)  # round-robin: the new partitions get records
        sink.run()
        sink.verify("partitions: added")
        return
    # The broker refuses CreatePartitions (Tansu 0.6): check the rule on the planning code
    # against this broker's real metadata. A checkpoint's previous end that does not name
    # partition 1 of a 2-partition topic must plan it from its earliest offset.
    planned_topic = f"{topic}-two"
    produce.ensure_topics(sink.ops.bootstrap, [planned_topic], 2)
    feed.events([planned_topic], 40)
    reader = KafkaStreamReader(
        {"kafka.bootstrap.servers": sink.ops.bootstrap, "subscribe": planned_topic}
    )
    end = reader.latestOffset({planned_topic: {"0": 0}}, ReadAllAvailable())
    tasks = reader.partitions({planned_topic: {}}, end)
    ranges = {(r.partition, r.start, r.end) for task in tasks for r in task.ranges}
    assert (1, 0, end[planned_topic]["1"]) in ranges, (ranges, end)
    note = (
        f"partitions: broker refused CreatePartitions ({refused}); planning checked on its metadata"
    )
    if note not in sink.ops.notes:
        sink.ops.notes.append(note)
    sink.topics = [*sink.topics, planned_topic]
    sink.run()
    sink.verify("partitions: new to the checkpoint")


def set_aside_copies(checkpoint: str) -> list[Path]:
    """The copies recovery (I9) left of ``checkpoint``: ``<checkpoint>.set-aside-<UTC time>``."""
    path = Path(checkpoint)
    return sorted(path.parent.glob(f"{path.name}.set-aside-*"))


def scenario_retries(sink: Sink, feed: Feed) -> None:
    retried = str(sink.work / "checkpoint-retried")
    feed.events(sink.topics, 150)
    feed.bad_records(sink.topics[0])
    # A second job's batch 0 is planned, then the process dies before its Delta commit.
    sink.run(checkpoint=retried, env={"KAFKA_DELTA_CRASH_AT": "before_delta_commit"}, expect=None)
    feed.events(sink.topics, 150)
    sink.run()  # the main job moves the table on
    sink.verify("retries: table moved on")
    # The retried job's planned batch is behind the table: recovery sets its checkpoint aside
    # and the run resumes from the table (I9), reading what arrived since, exit 0.
    feed.events(sink.topics, 90)
    output = sink.run(checkpoint=retried)
    if not set_aside_copies(retried) or "set aside" not in output:
        raise AssertionError(f"{sink.name}: the retried checkpoint was not set aside:\n{output}")
    sink.verify("retries: retried job fenced by the table, set aside, resumed from the table")


def fenced_once(text: str) -> str | None:
    """Why a run's output is not that of a fenced run (one ``error:`` line, no traceback)."""
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    if len(errors) != 1:
        return f"{len(errors)} error: lines"
    if "restart the pipeline" not in errors[0]:
        return f"not a fencing sentence: {errors[0]}"
    if "Traceback" in text:
        return "a stack trace"
    return None


def scenario_concurrency(sink: Sink, feed: Feed) -> None:
    second = str(sink.work / "checkpoint-second")
    config_a = sink.config(trigger={"mode": "processing_time", "interval_seconds": 1})
    config_b = sink.config(
        checkpoint=second, trigger={"mode": "processing_time", "interval_seconds": 1}
    )
    procs = []
    for i, config in enumerate((config_a, config_b)):
        out = open(sink.work / f"concurrent-{i}.log", "wb")
        procs.append(
            subprocess.Popen(
                sink.ops.project.command(config, sink.ops.bootstrap),
                cwd=sink.ops.project.root,
                env=sink.ops.project.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    try:
        for _ in range(6):  # records keep arriving while both run
            time.sleep(5)
            feed.events(sink.topics, 120)
        time.sleep(10)
    finally:
        for proc in procs:
            if proc.poll() is None:
                # The driver stops after the current micro-batch (so would the whole process
                # group: see kafka_delta/runtime/graceful_stop.py).
                proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=120))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes.append(proc.wait())
    log(f"{sink.name} concurrency: exit codes {codes} (3 = fenced: lost a race)")
    for i, code in enumerate(codes):
        text = (sink.work / f"concurrent-{i}.log").read_text(errors="replace")
        wrong = None if code == 0 else fenced_once(text) if code == 3 else f"exit {code}"
        if wrong:
            raise AssertionError(
                f"{sink.name}: concurrent run {i}: {wrong}; its output:\n{text[-3000:]}"
            )
    # Both checkpoints restart as they are, the loser too (I9: one behind the table is set
    # aside and resumes from it): both exit 0, and the table holds every record once.
    feed.events(sink.topics, 60)
    sink.run()
    feed.events(sink.topics, 60)
    sink.run(checkpoint=second)
    sink.verify("concurrency: two checkpoints at once, both restarted")


def aborts_are_filtered(bootstrap: str, topic: str) -> bool:
    """Whether the broker hides an aborted transaction from read_committed consumers."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"probe-{topic}"})
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(700):  # several record batches, as a real aborted transaction has
        producer.produce(topic, value=b"probe %d" % i, partition=0)
        if i % 100 == 99:
            producer.flush(10)
    producer.abort_transaction(10)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{topic}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = False
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is None:
                seen = True
                continue
            break  # end of partition
    finally:
        consumer.close()
    return not seen


def scenario_transactions(sink: Sink, feed: Feed) -> None:
    topic = sink.topics[0]
    feed.transaction(topic, 100, abort=False, txn_id=f"ops-{sink.name}-commit")
    probe = f"probe-{sink.name}"
    produce.ensure_topics(sink.ops.bootstrap, [probe], 1)
    if aborts_are_filtered(sink.ops.bootstrap, probe):
        # A producer aborts (ids the table must never hold), then retries and commits.
        feed.transaction(topic, 300, abort=True, txn_id=f"ops-{sink.name}-abort")
        feed.transaction(topic, 300, abort=False, txn_id=f"ops-{sink.name}-abort")
        scenario = "transactions: committed and aborted"
    else:
        note = (
            "transactions: the broker returns aborted records to read_committed readers "
            "(Tansu 0.6), so only committed transactions were run; aborts need a real Kafka"
        )
        if note not in sink.ops.notes:
            sink.ops.notes.append(note)
        scenario = "transactions: committed"
    sink.run()
    sink.verify(scenario)


def pipeline_versions(table: str, pipeline_id: str, after: int) -> list[int]:
    """The Delta versions above ``after`` that are commits of the pipeline, oldest first."""
    found = []
    for commit in DeltaTable(table).history():
        try:
            body = json.loads(commit.get("userMetadata") or "null")
        except ValueError:
            continue
        if (
            commit["version"] > after
            and isinstance(body, dict)
            and body.get("kafka_delta", {}).get("pipeline_id") == pipeline_id
        ):
            found.append(commit["version"])
    return sorted(found)


def scenario_restore(sink: Sink, feed: Feed) -> None:
    """A Delta RESTORE undoes pipeline commits: the restarted pipeline (checkpoint kept) must
    read the undone records again, and their dead letters, already sent, not twice."""
    before = DeltaTable(sink.table).version()
    feed.events(sink.topics, 500)
    feed.bad_records(sink.topics[0])
    feed.events(sink.topics, 400)
    sink.run()  # batches of at most 400 records: three pipeline commits
    commits = pipeline_versions(sink.table, sink.conf["pipeline_id"], before)
    if len(commits) < 2:
        raise AssertionError(f"{sink.name}: one run made {commits}, not several batches")
    version = commits[0]
    sink.verify("restore: before the RESTORE")
    # The operator rolls the later batches back with the sink's own engine's RESTORE.
    harness.restore_table(sink.table, version, sink.name, sink.jars, sink.ops.project.env())
    rows = DeltaTable(sink.table).to_pyarrow_table(columns=["id"]).num_rows
    if rows >= feed.produced:
        raise AssertionError(f"{sink.name}: RESTORE to version {version} undid nothing")
    copies = len(set_aside_copies(sink.checkpoint))
    output = sink.run()  # the checkpoint, ahead of the restored table, is kept
    if len(set_aside_copies(sink.checkpoint)) != copies + 1 or "set aside" not in output:
        raise AssertionError(f"{sink.name}: the checkpoint was not set aside:\n{output}")
    log(f"{sink.name} restore: table restored to version {version}, the checkpoint set aside")
    sink.verify("restore: RESTORE undid pipeline commits, restarted, checkpoint set aside")


def scenario_rewind(sink: Sink, feed: Feed) -> None:
    """A reset skips a range holding bad records, later dead letters move the dead-letter
    table past them, and a rewind reads the range again: its records land once, each bad record
    in the dead-letter table once (dead letters are tracked by position, not by the highest
    offset), and no run is fenced. No good record arrives between the skip and the rewind,
    so the rewind re-reads nothing the table already holds: in append mode it would be written
    twice, as asked, and the table would no longer be exact."""
    topic = sink.topics[0]
    group = sink.conf["kafka"]["consumer_group"]
    before = harness.kafka_view(sink.ops.bootstrap, group, [topic])["latest"][topic]
    feed.events([topic], 80)
    feed.bad_records(topic)
    skipped_bad = len(BAD_VALUES)
    versions = sink.versions()
    sink.offsets("reset", "--topic", topic, "--to-latest")  # a preview: writes nothing
    if sink.versions() != versions:
        raise AssertionError(f"{sink.name}: offsets reset without --execute wrote a commit")
    sink.offsets("reset", "--topic", topic, "--to-latest", "--allow-skip", "--execute")
    feed.bad_records(topic)  # past the skipped ones, on both partitions
    sink.run()
    partial = sink.check()
    if (partial.missing, partial.dead_rows) != (80, feed.bad - skipped_bad):
        raise AssertionError(f"{sink.name}: the skip did not skip: {partial.summary()}")
    spec = ",".join(f"{topic}:{p}={o}" for p, o in sorted(before.items()))
    sink.offsets("reset", "--to-offsets", spec, "--allow-rewind", "--execute")
    output = sink.run()
    if "error:" in output or "Traceback" in output:
        raise AssertionError(f"{sink.name}: the run after the rewind:\n{output[-3000:]}")
    sink.verify("rewind over dead letters: skipped range read again, each dead letter once")


def scenario_recreated_topic(sink: Sink, feed: Feed) -> None:
    """A topic deleted and created again is another topic (its Kafka id): with
    fail_on_data_loss the run stops writing nothing; without, it reads the new one from its
    first record, although the new topic holds more records than the stored offsets."""
    topic = f"{sink.topics[0]}-{sink.name}-recreated"
    bootstrap = sink.ops.bootstrap
    produce.ensure_topics(bootstrap, [topic], 2)
    feed.events([topic], 60)
    sink.topics = [*sink.topics, topic]
    sink.run()
    sink.verify("recreated topic: first life")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], request_timeout=10)[topic].result()
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=10).topics:
        if time.monotonic() > deadline:
            raise AssertionError(f"{sink.name}: topic {topic} still listed after its deletion")
        time.sleep(0.5)
    produce.ensure_topics(bootstrap, [topic], 2)
    feed.events([topic], 120)  # 60 a partition: past the 30 the table stores for each
    versions = sink.versions()
    output = sink.run(expect=2)  # kafka.fail_on_data_loss: true
    if "were deleted and created again" not in output or "Traceback" in output:
        raise AssertionError(f"{sink.name}: the recreated topic's stop:\n{output[-3000:]}")
    if sink.versions() != versions:
        raise AssertionError(f"{sink.name}: the stopped run wrote to a table")
    sink.run(kafka={**sink.conf["kafka"], "fail_on_data_loss": False})
    sink.verify("recreated topic: fail_on_data_loss stops; off, read from its first record")


def clean_up_the_log(table_uri: str) -> None:
    """Other writers commit, a Delta checkpoint is written, and the JSON commits it covers are
    deleted: the log as Delta's cleanup leaves it once they are past the retention period."""
    schema = pa.schema(DeltaTable(table_uri).schema().to_arrow())
    for _ in range(3):
        write_deltalake(table_uri, schema.empty_table(), mode="append")
    table = DeltaTable(table_uri)
    table.create_checkpoint()
    log_dir = Path(table_uri) / "_delta_log"
    for commit in log_dir.glob("*.json"):
        if int(commit.stem) < table.version():
            commit.unlink()
            for crc in (log_dir / f".{commit.name}.crc", log_dir / f"{commit.stem}.crc"):
                crc.unlink(missing_ok=True)


def scenario_log_cleanup(sink: Sink, feed: Feed) -> None:
    clean_up_the_log(sink.table)
    feed.events(sink.topics, 150)
    sink.run()
    sink.verify("log cleanup: checkpoint kept")
    clean_up_the_log(sink.table)
    shutil.rmtree(sink.checkpoint)
    feed.events(sink.topics, 150)
    sink.run()
    sink.verify("log cleanup: checkpoint deleted")


SCENARIOS: list[Callable[[Sink, Feed], None]] = [
    scenario_topics,
    scenario_partitions,
    scenario_retries,
    scenario_concurrency,
    scenario_transactions,
    scenario_restore,
    scenario_rewind,
    scenario_recreated_topic,
    scenario_log_cleanup,
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=harness.REPO / ".ops")
    parser.add_argument(
        "--sinks", default="delta_rs,delta_spark", help="comma-separated: delta_rs,delta_spark"
    )
    parser.add_argument(
        "--scenarios",
        default="",
        help="comma-separated scenario names to run (e.g. restore,recreated_topic); default all",
    )
    args = parser.parse_args(argv)
    chosen = [s for s in args.scenarios.split(",") if s]
    unknown = set(chosen) - {f.__name__.removeprefix("scenario_") for f in SCENARIOS}
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    scenarios = [
        f for f in SCENARIOS if not chosen or f.__name__.removeprefix("scenario_") in chosen
    ]
    jars = os.environ.get(harness.JARS_ENV)
    sinks = [s for s in args.sinks.split(",") if s]
    if "delta_spark" in sinks and not jars:
        log(f"delta_spark skipped: {harness.JARS_ENV} names no folder of delta-spark jars")
        sinks.remove("delta_spark")
    shutil.rmtree(args.workdir, ignore_errors=True)
    project = harness.generate(args.workdir)
    broker = EmbeddedBroker(log_path=args.workdir / "broker.log").start()
    ops = Ops(project, broker.bootstrap_servers, args.workdir)
    totals = {"produced": 0, "rows": 0, "distinct": 0, "missing": 0, "duplicates": 0}
    try:
        for name in sinks:
            sink = Sink(ops, name, harness.sink_settings(name, jars), jars)
            sink.topics = [f"{t}-{name}" for t in sink.topics]
            feed = ops.feeds.setdefault(name, Feed(ops.bootstrap))
            produce.ensure_topics(ops.bootstrap, sink.topics, 2)
            feed.events(sink.topics, 300)
            sink.run()
            sink.verify("baseline")
            for scenario in scenarios:
                log(f"{name}: {scenario.__name__}")
                scenario(sink, feed)
            # The last independent verdict of this sink (delta_spark's is taken before its
            # log cleanup stop, which writes nothing).
            assert sink.last is not None
            for key in totals:
                totals[key] += getattr(sink.last, key)
    finally:
        broker.stop()
    for note in ops.notes:
        log(note)
    print(
        f"ops: scenarios={len(ops.scenarios)} sinks={len(sinks)} produced={totals['produced']} "
        f"table_rows={totals['rows']} distinct_ids={totals['distinct']} "
        f"missing={totals['missing']} duplicates={totals['duplicates']}"
    )
    return 0


if __name__ == "__main__":
    from process_exit import run_and_exit  # leaves with the real status, see there

    run_and_exit(main)
