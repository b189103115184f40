"""The orchestrator: renders a project, starts the development broker (Apache Kafka), produces the
topics, runs each measurement in its own worker process, and turns the workers' records into
rows."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from . import memory, startup
from .cli import JARS_ENV, REPO
from .freshness import FreshnessRun
from .procs import WorkerError, run_worker
from .report import (
    Results,
    floor_text,
    many_batch_costs,
    many_batch_text,
    print_table,
    say,
    write_chart,
    write_csv,
)
from .report import last_line as format_last_line
from .rows import (
    DELTA_SPARK_ROWS,
    FRESHNESS_ROW,
    KAFKA_SOURCE_ROWS,
    REPEATED,
    ROW_NAMES,
    Row,
    busy_rate,
    steady,
    step_split,
    time_split,
    verify_paid,
    verify_table,
)
from .spark_run import BATCH
from .sweep import steady_batch_cost

DELTA_SPARK_ENGINE = {"source": "embedded", "sink": "delta_spark"}
CLUSTER_ENGINE = {"source": "spark_kafka", "sink": "delta_spark"}
RSS_KEYS = ("driver_rss_first", "driver_rss_last", "jvm_rss_first", "jvm_rss_last")


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out.resolve()
        self.results = Results(args)
        self.topics: dict[tuple[int, int, str], str] = {}
        self.registry: Any = None

    @property
    def problems(self) -> list[str]:
        return self.results.problems

    # -- set-up ---------------------------------------------------------------------------

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
        # Imported here, not at the top: a worker process imports this module too, and its
        # start-up is measured.
        from kafka_delta.kafka import admin
        from kafka_delta.runtime import jvm_archive, python_launcher
        from kafka_delta_dev import broker, produce

        self.src = str(project / "src")
        self.schema_file = str(project / "schemas" / "order_event.ddl")
        self.broker_mod, self.produce_mod, self.admin_mod = broker, produce, admin
        # The workers run the generated project's engine (its src/ holds kafka_delta and
        # kafka_delta_dev); Spark's Python workers import it by name and must run this
        # interpreter.
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env["PYTHONPATH"] = self.src
        # ... through the engine's launcher, as the project's runs do: Spark's Python processes
        # import the installed, compiled pyspark instead of Spark's source zip
        # (kafka_delta.runtime.python_launcher).
        python = python_launcher.interpreter(sys.executable)
        self.env["PYSPARK_PYTHON"] = python
        self.env["PYSPARK_DRIVER_PYTHON"] = python
        # Spark workers map the JVM class archive the first run records (record_class_archive),
        # kept in this run's folder; SPARK_CLASS_ARCHIVE=off measures starts without one.
        self.archive = jvm_archive
        shutil.rmtree(self.out / "jvm-archive", ignore_errors=True)
        if self.archive.directory(self.env) is not None:
            self.env[self.archive.ENV] = str(self.out / "jvm-archive")

    def delta_jars(self, kafka_source: bool = False) -> tuple[list[str], str]:
        """(jars for rows 6 and 7, "") or ([], why there are none): the engine's own reading of
        a jar folder (kafka_delta.runtime.connectors.local_connector_jars), as its pytest plugin
        does. ``kafka_source``: rows 12-14 also need Spark's kafka source among them."""
        from kafka_delta.runtime.connectors import ConnectorMissingError, local_connector_jars

        folder = self.args.delta_jars
        if not folder:
            why = self.args.delta_jars_why or f"set {JARS_ENV}=<folder of jars> or --delta-jars"
            return [], f"no delta-spark jars ({why})"
        try:
            jars = local_connector_jars(folder)
        except ConnectorMissingError as exc:
            return [], f"no delta-spark jars: {exc}"
        if kafka_source and not any(Path(j).name.startswith("spark-sql-kafka") for j in jars):
            return [], f"no jar of Spark's kafka source (spark-sql-kafka) in {folder}"
        return jars, ""

    @property
    def registry_url(self) -> str:
        """The development Schema Registry (kafka_delta_dev.schema_registry_server), started on
        first use (Avro rows), stopped by pid when the run ends."""
        if self.registry is None:
            from kafka_delta_dev.schema_registry_server import LocalSchemaRegistry

            self.registry = LocalSchemaRegistry(log_path=self.out / "logs" / "registry.log").start()
        return str(self.registry.url)

    def decoding(self, value_format: str = "json") -> dict[str, Any]:
        """The pipeline's decoding section: JSON against the generated project's schema file
        (as its conf/local.yaml), or Avro through the registry."""
        if value_format == "avro":
            return {"value": {"format": "avro"}, "schema_registry": {"url": self.registry_url}}
        return {"value": {"format": "json", "schema_file": self.schema_file}}

    def topic(
        self, records: int, partitions: int, value_format: str = "json"
    ) -> tuple[str, dict[int, int]]:
        """A topic holding ``records`` events over ``partitions``, produced once per run."""
        key = (records, partitions, value_format)
        name = self.topics.get(key)
        if name is None:
            suffix = "" if value_format == "json" else f"-{value_format}"
            name = f"bench-n{records}-p{partitions}{suffix}"
            started = time.perf_counter()
            self.produce_mod.ensure_topics(self.bootstrap, [name], partitions)
            self.produce_mod.produce_events(
                self.bootstrap,
                [name],
                records,
                value_format=value_format,
                registry_url=self.registry_url if value_format != "json" else None,
            )
            say(
                f"    produced {records:,} events to {name} ({partitions} partitions) in "
                f"{time.perf_counter() - started:.1f}s"
            )
            self.topics[key] = name
        admin = self.admin_mod.KafkaAdmin({"bootstrap.servers": self.bootstrap})
        latest = admin.latest({name: list(range(partitions))})[name]
        return name, latest

    def topic_group(self, records: int, topics: int, partitions: int) -> list[str]:
        """``topics`` topics of ``partitions`` partitions each, holding ``records`` events in
        all (ids 0..records-1 round-robin over them), produced once per run."""
        key = (records, partitions, f"x{topics}")
        names = self.topics.get(key)
        if names is None:
            names = [f"bench-n{records}-t{topics}of{partitions}-{i}" for i in range(topics)]
            started = time.perf_counter()
            self.produce_mod.ensure_topics(self.bootstrap, names, partitions)
            self.produce_mod.produce_events(self.bootstrap, names, records)
            say(
                f"    produced {records:,} events to {topics} topics of {partitions} partitions "
                f"in {time.perf_counter() - started:.1f}s"
            )
            self.topics[key] = names  # type: ignore[assignment]
        return list(names)

    def spec(self, topic: str, ends: dict[int, int], **extra: Any) -> dict[str, Any]:
        return {
            "src": self.src,
            "bootstrap": self.bootstrap,
            "topic": topic,
            "ends": {str(p): o for p, o in ends.items()},
            "batch_size": self.args.batch_size,
            "master": self.args.spark_master,
            "decoding": self.decoding(),
            **extra,
        }

    def point(self, label: str, topic: str, batch_size: int, **extra: Any) -> dict[str, Any]:
        """One pipeline run of a sweep or memory worker."""
        return {
            "name": label,
            "topic": topic,
            "batch_size": batch_size,
            "table": str(self.out / "tables" / label),
            "checkpoint": str(self.out / "checkpoints" / label),
            "exactly_once": True,
            "decoding": self.decoding(),
            **extra,
        }

    def session_spec(self, **extra: Any) -> dict[str, Any]:
        return {
            "src": self.src,
            "bootstrap": self.bootstrap,
            "master": self.args.spark_master,
            **extra,
        }

    # -- the main rows ----------------------------------------------------------------------

    def measure(
        self,
        row: Row,
        kind: str,
        spec: dict[str, Any],
        table: Path | None,
        env: dict[str, str] | None = None,
    ) -> Row:
        label = f"{row.number}-{kind}" + (f"-{row.repeat}" if row.repeat else "")
        say(f"==> {row.number}. {row.name}" + (f" (run {row.repeat + 1})" if row.repeat else ""))
        try:
            result, started, sampler = run_worker(
                kind, spec, self.out, label, env or self.env, self.args.timeout
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
            if kind in ("pipeline", "stream"):
                self._pipeline_figures(row, result, started, first_end, label)
            elif kind == "ceiling":
                self._ceiling_figures(row, result, started)

            if len(batches) > 1:
                row.extra["rss_after_first_batch_mb"] = _round(sampler.rss_mb_at(batches[0][0]))
                row.extra["rss_after_last_batch_mb"] = _round(sampler.rss_mb_at(batches[-1][0]))
        self.check(row, table)
        say(
            f"    {row.rps:,.0f} records/s steady, {row.wall_s:.1f}s wall, start-up "
            f"{_fmt(row.startup_s, '{:.1f}s')}, peak RSS {row.peak_rss_mb:,.0f} MB (tree)"
            + (
                f", driver {_fmt(row.extra.get('driver_peak_mb'), '{:,.0f}')} MB Python + "
                f"{_fmt(row.extra.get('jvm_peak_mb'), '{:,.0f}')} MB JVM"
                if kind in ("pipeline", "ceiling")
                else ""
            )
            + f", {row.check}"
        )
        if kind == "ceiling" and "floor_batch_s" in row.extra:
            say(f"    Spark's floor (scripts/spark_floor, run first here): {floor_text(row)}")
        return row

    def _pipeline_figures(
        self, row: Row, result: dict[str, Any], started: float, first_end: float | None, label: str
    ) -> None:
        batches = result["batches"]
        row.busy_rps = busy_rate(batches)
        row.extra.update(time_split(batches))
        row.extra.update(step_split(batches))
        row.extra["driver_peak_mb"] = _round(result.get("driver_peak_mb"))
        row.extra["jvm_peak_mb"] = _round(result.get("jvm_peak_mb"))
        row.extra["spark_session_s"] = round(result.get("spark_session_s", 0.0), 2)
        row.extra["run_start_to_first_batch_s"] = (
            round(first_end - result["begin"], 2) if first_end else None
        )
        log = (self.out / "logs" / f"{label}.log").read_text(errors="replace").splitlines()
        for phase, seconds in startup.phases(log, started).items():
            row.extra[startup.column(phase)] = seconds
        row.extra["commit_back_ok"] = result.get("commit_back_ok")
        row.extra["commit_back_failed"] = result.get("commit_back_failed")

    def fan_out_points(self) -> list[dict[str, Any]]:
        """Row 11's runs, last in the session, on the main rows' events and batch size: one
        pipeline writing two tables from one read (``all``, and ``paid`` by route), between the
        two single-table pipelines that fill the same tables by reading the topic twice (every
        event; the paid orders alone)."""
        a = self.args
        topic, _ = self.topic(a.records, a.partitions)
        both = self.point("11-two-tables", topic, a.batch_size, role="fan_out", side="both")
        where = Path(both.pop("table"))
        both["tables"] = {
            "all": {"path": str(where / "all")},
            "paid": {"path": str(where / "paid"), "route": "event_type = 'paid'"},
        }
        return [
            self.point("11-pipeline-all", topic, a.batch_size, role="fan_out", side="all"),
            both,
            self.point(
                "11-pipeline-paid",
                topic,
                a.batch_size,
                role="fan_out",
                side="paid",
                transform="benchlib.spark_run:paid_orders",
                count_read=True,  # its rate counts the records it reads, as the others
            ),
        ]

    def fan_out_row(self, points: dict[str, dict[str, Any]]) -> Row:
        """Row 11 from its three runs: its records/s is the two-table pipeline's (records
        read: the rows of ``all``); the two single-table pipelines' rates beside it. Every
        table is checked: ``all`` tables each id once, ``paid`` tables each paid order once."""
        a = self.args
        r = Row(11, ROW_NAMES[11], a.records, a.batch_size, partitions=a.partitions)
        r.note = "in the session's Spark session, after its other runs"
        both = points["both"]
        tables = {key: Path(value["path"]) for key, value in both["tables"].items()}
        both["table"] = str(tables["all"])
        both["rows"] = both["records_read"]  # the rows of `all`: the records read
        self._point_row(r, both)
        problems = [] if r.verified else [f"two tables: all: {r.check}"]
        rates = {}
        for side in ("all", "paid"):
            run = points[side]
            rates[side], _ = steady(run["batches"])
            r.extra[f"{side}_pipeline_rps"] = round(rates[side], 1)
            if side == "all":
                ok, _, _, message = verify_table(Path(run["table"]), a.records)
            else:
                ok, found, message = verify_paid(Path(run["table"]), a.records)
                r.extra["paid_pipeline_ids"] = found
            if not ok:
                problems.append(f"{side} pipeline: {message}")
        ok, found, message = verify_paid(tables["paid"], a.records)
        r.extra["two_tables_paid_ids"] = found
        if not ok:
            problems.append(f"two tables: paid: {message}")
        if not a.keep_tables:
            for path in (tables["all"].parent, points["all"]["table"], points["paid"]["table"]):
                shutil.rmtree(path, ignore_errors=True)
        if problems:
            r.verified = False
            r.check = "FAILED: " + "; ".join(problems)
            self.problems.append(f"row 11 ({r.name}): {'; '.join(problems)}")
        else:
            r.check += f"; paid {found:,} paid ids"
        say(
            f"==> 11. {r.name}\n    {r.rps:,.0f} records/s steady into two tables; two "
            f"single-table pipelines: {rates['all']:,.0f} (every event) and {rates['paid']:,.0f} "
            f"(the paid orders alone) records/s, each reading the topic; {r.check}"
        )
        return r

    def _ceiling_figures(self, row: Row, result: dict[str, Any], started: float) -> None:
        """Row 10's process ran Spark's floor first (:func:`.spark_run.work_ceiling`): its
        figures, timed from this process's start as row 4's start-up is; the row's own start-up
        came after the floor's queries and is no start-up at all."""
        batches = result["batches"]
        row.startup_s = None
        row.busy_rps = busy_rate(batches)
        row.extra.update(time_split(batches))
        row.extra["driver_peak_mb"] = _round(result.get("driver_peak_mb"))
        row.extra["jvm_peak_mb"] = _round(result.get("jvm_peak_mb"))
        floor = result["floor"]
        row.extra["floor_session_s"] = round(floor["session_ready_at"] - started, 2)
        row.extra["floor_first_batch_s"] = round(floor["first_batch_at"] - started, 2)
        row.extra["floor_batch_s"] = round(floor["batch_s"], 3)
        row.extra["floor_batch_no_job_s"] = round(floor["batch_no_job_s"], 3)
        row.extra["floor_batch_python_write_s"] = round(floor["batch_python_write_s"], 3)

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

    def record_class_archive(self) -> None:
        """Before any timed Spark run: one short pipeline run whose JVM records the class-data
        archive of Spark's classes as it exits, as a user's first local run does. Every later
        Spark worker maps it; without one, they all start cold."""
        a = self.args
        spark_rows = {4, 5, 8, 10, 11, FRESHNESS_ROW} | (
            set(DELTA_SPARK_ROWS) if self.delta_jars()[0] else set()
        )
        if not (spark_rows & set(a.rows) or a.sweep or a.memory):
            return
        archive, env = self.archive, self.env
        folder, key = archive.directory(env), archive.key(env)
        if folder is None or key is None:
            self.results.class_archive = (
                f"none ({archive.ENV}=off)"
                if folder is None
                else "none (this JDK or class path cannot record one)"
            )
            return
        say("==> 0. a first pipeline run, whose JVM records the class archive as it exits")
        topic, ends = self.topic(a.batch_size, a.partitions)
        label = "0-first-run"
        table, checkpoint = self.out / "tables" / label, self.out / "checkpoints" / label
        spec = self.spec(
            topic, ends, name="bench-first", table=str(table), checkpoint=str(checkpoint)
        )
        try:
            result, started, _ = run_worker("pipeline", spec, self.out, label, env, a.timeout)
        except WorkerError as exc:
            result, started = {}, 0.0
            self.problems.append(str(exc))
        path = archive.promote(folder, key)
        shutil.rmtree(table, ignore_errors=True)
        if path is None:
            env[archive.ENV] = "off"  # no worker records again: all start cold, as said
            self.results.class_archive = "none: the first run recorded none (see its log)"
            self.problems.append(f"{label}: no JVM class archive recorded")
        else:
            batches = result.get("batches") or []
            first = batches[0][0] - started if batches else float("nan")
            self.results.class_archive = (
                f"recorded by a first run (start-up {first:.1f}s; its JVM's exit, writing "
                f"{path.stat().st_size / 2**20:,.0f} MB, {result.get('jvm_exit_s') or 0:.1f}s); "
                "every later Spark start maps it"
            )
        say(f"    JVM class archive: {self.results.class_archive}")

    def run_main(self) -> None:
        a = self.args
        rows = self.results.rows
        topic, ends = self.topic(a.records, a.partitions)
        tables, checkpoints = self.out / "tables", self.out / "checkpoints"

        def row(number: int, repeat: int = 0, **names: Any) -> Row:
            name = ROW_NAMES[number].format(**names)
            return Row(
                number, name, a.records, a.batch_size, repeat=repeat, partitions=a.partitions
            )

        procs = max(1, min(a.consumers, len(ends)))
        if 1 in a.rows:
            spec = self.spec(topic, ends, processes=a.consumers)
            rows.append(self.measure(row(1, procs=procs), "consume", spec, None))
            rows[-1].batch_size = None
        for number, kind in ((2, "write"), (3, "simple")):
            if number in a.rows:
                table = tables / f"{number}-{kind}"
                spec = self.spec(topic, ends, table=str(table))
                rows.append(self.measure(row(number), kind, spec, table))
        for repeat in range(a.repeats):
            order = REPEATED if repeat % 2 == 0 else REPEATED[::-1]
            for number in order:
                if number not in a.rows:
                    continue
                exactly_once = number == 4
                label = f"{number}-pipeline-{repeat}"
                spec = self.spec(
                    topic,
                    ends,
                    name=f"bench-{'eo' if exactly_once else 'plain'}-{repeat}",
                    table=str(tables / label),
                    checkpoint=str(checkpoints / label),
                    exactly_once=exactly_once,
                )
                rows.append(self.measure(row(number, repeat), "pipeline", spec, tables / label))
        if 15 in a.rows:
            rows.append(self.run_on_cluster(row(15), topic, ends))
        # The delta-spark rows, the pipeline's (6) between the two hand-written ones (12, 13)
        # and beside its plain foreachBatch write (7), so that drift of the machine touches
        # their ratios least; the cluster engine (14) last.
        for number in (12, 6, 7, 13, 14):
            if number in a.rows:
                rows.append(self.run_delta_spark(row(number), topic, ends))
        if {8, 9} & set(a.rows):
            avro_topic, avro_ends = self.topic(a.records, a.partitions, "avro")
            if 8 in a.rows:
                label = "8-pipeline-avro"
                spec = self.spec(
                    avro_topic,
                    avro_ends,
                    name="bench-avro",
                    table=str(tables / label),
                    checkpoint=str(checkpoints / label),
                    exactly_once=True,
                    decoding=self.decoding("avro"),
                )
                rows.append(self.measure(row(8), "pipeline", spec, tables / label))
            if 9 in a.rows:
                table = tables / "9-simple-avro"
                spec = self.spec(
                    avro_topic, avro_ends, table=str(table), registry_url=self.registry_url
                )
                rows.append(self.measure(row(9), "simple_avro", spec, table))
        if 10 in a.rows:  # the ceiling, and Spark's floor in the same process
            label = "10-ceiling"
            spec = self.spec(
                topic,
                ends,
                name="bench-ceiling",
                table=str(tables / label),
                checkpoint=str(checkpoints / label),
                floor_batches=a.floor_batches,
            )
            rows.append(self.measure(row(10), "ceiling", spec, None))

    def run_on_cluster(self, row: Row, topic: str, ends: dict[int, int]) -> Row:
        """Row 15: row 4's pipeline and data on a Spark standalone cluster of two workers of one
        core and 1 GiB each (kafka_delta_dev.standalone_cluster, on 127.0.0.1), the driver in
        the worker process as in row 4: what leaving local mode costs when the same two cores
        run the driver, two executor JVMs and their Python workers. The cluster starts before
        the row's clock and stops after it."""
        from kafka_delta_dev.standalone_cluster import StandaloneCluster

        say("==> starting a standalone cluster (a master, 2 workers x 1 core) on 127.0.0.1")
        cluster = StandaloneCluster(self.out / "cluster", workers=2, cores=1, memory="1g")
        cluster.start()
        try:
            label = "15-pipeline-cluster"
            spec = self.spec(
                topic,
                ends,
                name="bench-cluster",
                table=str(self.out / "tables" / label),
                checkpoint=str(self.out / "checkpoints" / label),
                exactly_once=True,
                master=cluster.master_url,
            )
            row.note = "2 executors x 1 core, driver beside them"
            env = {**self.env, "SPARK_LOCAL_IP": "127.0.0.1"}  # the driver on loopback too
            return self.measure(row, "pipeline", spec, self.out / "tables" / label, env)
        finally:
            cluster.stop()

    def run_delta_spark(self, row: Row, topic: str, ends: dict[int, int]) -> Row:
        """Row 6: the same pipeline, exactly-once on, with the delta-spark sink (engine
        {source: embedded, sink: delta_spark}); row 7: the same engine, each batch written as
        Databricks documents an idempotent foreachBatch (txnAppId/txnVersion, nothing else);
        rows 12 and 13: Structured Streaming as a user writes it by hand (:mod:`.handwritten`);
        row 14: the pipeline on the cluster engine (Spark's kafka source, delta-spark). Without
        jars the row says so and is skipped."""
        jars, why_not = self.delta_jars(kafka_source=row.number in KAFKA_SOURCE_ROWS)
        if not jars:
            say(f"==> {row.number}. {row.name}\n    skipped: {why_not}")
            row.skipped = row.check = f"skipped: {why_not}"
            return row
        kind, extra = "pipeline", {}
        if row.number == 6:
            label, extra = "6-pipeline-delta-spark", {"engine": DELTA_SPARK_ENGINE}
        elif row.number == 7:
            label = "7-pipeline-delta-spark-plain"
            extra = {"engine": DELTA_SPARK_ENGINE, "exactly_once": False, "txn": True}
        elif row.number == 14:
            label, extra = "14-pipeline-cluster", {"engine": CLUSTER_ENGINE}
        else:
            kind = "stream"
            style = "write_stream" if row.number == 12 else "foreach_batch"
            label, extra = f"{row.number}-hand-written-{style}", {"style": style}
        if row.number in KAFKA_SOURCE_ROWS and self.args.jvm_fetch_max_wait_ms is not None:
            # Spark's kafka source reads with the Java client: the broker quirk's setting, on
            # the three rows alike (rows 4-11 read with librdkafka, as conf/local.yaml sets).
            extra["jvm_client"] = {"fetch.max.wait.ms": str(self.args.jvm_fetch_max_wait_ms)}
        tables = self.out / "tables"
        spec = {
            **self.spec(
                topic,
                ends,
                name=f"bench-{label}",
                table=str(tables / label),
                checkpoint=str(self.out / "checkpoints" / label),
                exactly_once=True,
                jars=jars,
            ),
            **extra,
        }
        row.note = f"jars: {self.args.delta_jars}"
        return self.measure(row, kind, spec, tables / label)

    # -- the session: driver memory, then the sweep ----------------------------------------

    def session_points(self) -> list[dict[str, Any]]:
        """Pipeline runs for one Spark session, in order: the driver-RSS points (smallest
        batches first, each --rss-batches batches of its size; peaks reset before each), the
        many-batch memory run, the sweep (batch sizes x partition counts), then the scale runs
        asked for (--wide-topics: a sweep point over many topics; --many-batches)."""
        a = self.args
        points = []
        if a.memory:
            for size in a.rss_batch_sizes:
                topic, _ = self.topic(size * a.rss_batches, a.partitions)
                points.append(self.point(f"memory-b{size}", topic, size, role="rss", peak=True))
            if a.memory_batches:
                topic, _ = self.topic(a.memory_batches * a.memory_batch_size, a.partitions)
                label = f"memory-flat-{a.memory_batches}"
                points.append(self.point(label, topic, a.memory_batch_size, role="flat"))
        if a.sweep:
            for partitions in a.sweep_partitions:
                topic, _ = self.topic(a.sweep_records, partitions)
                for size in a.sweep_batch_sizes:
                    label = f"sweep-p{partitions}-b{size}"
                    points.append(
                        self.point(label, topic, size, role="sweep", partitions=partitions)
                    )
        if a.wide_topics:
            each = a.wide_partitions // a.wide_topics
            names = self.topic_group(a.sweep_records, a.wide_topics, each)
            size = min(a.sweep_batch_sizes)
            label = f"sweep-p{a.wide_partitions}-t{a.wide_topics}-b{size}"
            points.append(
                self.point(
                    label,
                    names[0],
                    size,
                    role="sweep",
                    partitions=a.wide_partitions,
                    topics=names,
                )
            )
        if a.many_batches and a.many_batches_sink in ("delta_rs", "both"):
            topic, _ = self.topic(a.many_batches * a.many_batch_size, a.partitions)
            label = f"many-{a.many_batches}"
            points.append(self.point(label, topic, a.many_batch_size, role="many"))
        if 11 in a.rows:
            points.extend(self.fan_out_points())
        return points

    def run_session(self) -> None:
        a = self.args
        points = self.session_points()
        if not points:
            return
        if a.memory:
            say(
                "==> driver memory: peak RSS of the driver (its Python process; the JVM apart) "
                f"with batches of {', '.join(f'{s:,}' for s in a.rss_batch_sizes)} records"
                + (
                    f", then RSS per batch over {a.memory_batches} batches of "
                    f"{a.memory_batch_size:,}"
                    if a.memory_batches
                    else ""
                )
            )
        if a.wide_topics:
            say(
                f"==> wide: pipeline over {a.wide_topics} topics, {a.wide_partitions} partitions "
                f"in all, {min(a.sweep_batch_sizes):,}-record batches, {a.sweep_records:,} records"
            )
        if a.many_batches and a.many_batches_sink in ("delta_rs", "both"):
            say(
                f"==> many batches: {a.many_batches:,} of {a.many_batch_size:,} records, the "
                "per-batch cost at the start against the end"
            )
        if a.sweep:
            say(
                f"==> sweep: pipeline (exactly-once on) over batch sizes "
                f"{', '.join(f'{s:,}' for s in a.sweep_batch_sizes)} x partitions "
                f"{', '.join(map(str, a.sweep_partitions))}, {a.sweep_records:,} records each"
            )
        if 11 in a.rows:
            say(
                "==> 11: one pipeline into two tables, between two single-table pipelines "
                "reading the topic twice (last in the session)"
            )
        say("    (one Spark session runs them all in turn; its log: logs/session.log)")
        spec = self.session_spec(points=points)
        try:
            result, _, _ = run_worker("session", spec, self.out, "session", self.env, a.timeout)
        except WorkerError as exc:
            self.problems.append(str(exc))
            say(f"    {exc}")
            return
        fan_out: dict[str, dict[str, Any]] = {}
        for point in result["points"]:
            if "error" in point:
                self.problems.append(
                    f"{point['role']} point {point['name']} failed: {point['error']}"
                )
                say(f"    {point['name']}: FAILED ({point['error']}); see logs/session.log")
            elif point["role"] == "rss":
                self.results.memory.append(self._rss_row(point))
            elif point["role"] == "flat":
                self.results.memory.append(self._flat_row(point))
            elif point["role"] == "many":
                self.results.scale.append(self._many_row(point))
            elif point["role"] == "fan_out":
                fan_out[point["side"]] = point
            else:
                self.results.sweep.append(self._sweep_row(point))
        if len(fan_out) == 3:
            self.results.rows.append(self.fan_out_row(fan_out))

    def _sweep_row(self, point: dict[str, Any]) -> Row:
        topics = len(point.get("topics") or [point["topic"]])
        r = Row(
            0,
            f"sweep p={point['partitions']} batch={point['batch_size']}"
            + (f" over {topics} topics" if topics > 1 else ""),
            self.args.sweep_records,
            point["batch_size"],
            partitions=point["partitions"],
        )
        r.extra["topics"] = topics
        self._point_row(r, point)
        cost = steady_batch_cost(point["batches"])
        if cost is not None:
            r.extra["steady_records_per_batch"] = round(cost[0], 1)
            r.extra["steady_s_per_batch"] = round(cost[1], 4)
        say(
            f"    sweep p={point['partitions']:<3} batch={point['batch_size']:>9,}  "
            f"{r.rps:>10,.0f} records/s  {r.batches:>3} batches  "
            f"{_fmt(cost and cost[1], '{:.3f}')} s/batch  {r.check}"
            + (f" (over {topics} topics)" if topics > 1 else "")
        )
        return r

    def run_many_delta_spark(self) -> None:
        """``--many-batches`` on the delta-spark sink (``--many-batches-sink delta_spark`` or
        ``both``): row 6's pipeline over that many small batches, in a worker process of its
        own (the session's Spark has no Delta jars), so the per-batch cost of its log reads at
        the start of the run is set against the end, the table then at that many versions."""
        a = self.args
        if not a.many_batches or a.many_batches_sink not in ("delta_spark", "both"):
            return
        say(
            f"==> many batches on the delta-spark sink: {a.many_batches:,} of "
            f"{a.many_batch_size:,} records, the per-batch cost (and its log reads) at the start "
            "against the end"
        )
        jars, why_not = self.delta_jars()
        if not jars:
            say(f"    skipped: {why_not}")
            return
        topic, ends = self.topic(a.many_batches * a.many_batch_size, a.partitions)
        label = f"many-{a.many_batches}-delta-spark"
        point = self.point(label, topic, a.many_batch_size, role="many")
        spec = {
            **self.spec(topic, ends, jars=jars, engine=DELTA_SPARK_ENGINE),
            **point,
            "name": f"bench-{label}",
        }
        try:
            result, _, _ = run_worker("pipeline", spec, self.out, label, self.env, a.timeout)
        except WorkerError as exc:
            self.problems.append(str(exc))
            say(f"    {exc}")
            return
        self.results.scale.append(self._many_row({**point, **result}, sink="delta-spark"))

    def _many_row(self, point: dict[str, Any], sink: str = "delta-rs") -> Row:
        """The many-small-batches run: what a steady batch costs (commit to commit, and in the
        batch function, and of that in the sink; the sink's log reads where the engine timed
        them) over its first and its last steady batches."""
        a = self.args
        r = Row(
            0,
            f"{a.many_batches} batches of {a.many_batch_size} ({sink} sink)",
            a.many_batches * a.many_batch_size,
            a.many_batch_size,
            partitions=a.partitions,
        )
        try:
            from deltalake import DeltaTable

            r.extra["table_versions"] = DeltaTable(point["table"]).version() + 1
        except Exception:
            r.extra["table_versions"] = None
        self._point_row(r, point)
        r.extra.update(many_batch_costs(point["batches"]))
        say(f"    {many_batch_text(r)}  {r.check}")
        return r

    def _rss_row(self, point: dict[str, Any]) -> Row:
        a = self.args
        size = point["batch_size"]
        r = Row(0, f"driver peak RSS batch={size}", size * a.rss_batches, size)
        r.partitions = a.partitions
        self._point_row(r, point)
        r.extra["driver_peak_mb"] = _round(point.get("driver_peak_mb"))
        r.extra["jvm_peak_mb"] = _round(point.get("jvm_peak_mb"))
        if not point.get("peak_reset"):
            r.note = "peak RSS could not be reset: it covers the session before this run"
        say(
            f"    memory batch={size:>9,}  driver peak "
            f"{_fmt(r.extra['driver_peak_mb'], '{:,.0f}')} MB Python, "
            f"{_fmt(r.extra['jvm_peak_mb'], '{:,.0f}')} MB JVM  {r.check}"
        )
        return r

    def _point_row(self, r: Row, point: dict[str, Any]) -> None:
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

    def _flat_row(self, point: dict[str, Any]) -> Row:
        a = self.args
        r = Row(
            0,
            f"driver RSS over {a.memory_batches} batches",
            a.memory_batches * a.memory_batch_size,
            a.memory_batch_size,
            partitions=a.partitions,
        )
        self._point_row(r, point)
        for side in ("driver", "jvm"):
            moved = memory.drift([b[BATCH[f"{side}_mb"]] for b in point["batches"]])
            if moved is None:
                continue
            r.extra[f"{side}_rss_first_mb"] = round(moved.first_mb, 1)
            r.extra[f"{side}_rss_last_mb"] = round(moved.last_mb, 1)
            r.extra[f"{side}_rss_growth_pct"] = round(moved.growth_pct, 2)
        mb = {k: _fmt(r.extra.get(f"{k}_mb"), "{:,.0f}") for k in RSS_KEYS}
        say(
            f"    {r.batches} batches: driver RSS {mb['driver_rss_first']} -> "
            f"{mb['driver_rss_last']} MB Python, {mb['jvm_rss_first']} -> {mb['jvm_rss_last']} "
            f"MB JVM  {r.check}"
        )
        return r

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> int:
        say(f"==> generating a project from conf/embedded-local.yaml into {self.out / 'project'}")
        self.prepare()
        broker = self.broker_mod.dev_broker(
            log_path=self.out / "logs" / "broker.log", folder=self.out / "kafka"
        )
        say(f"==> starting the broker ({broker.kind}) on 127.0.0.1")
        self.results.broker = "Apache Kafka" if broker.kind == "kafka" else "Tansu (stand-in)"
        self.broker_mod.start_broker(broker)
        try:
            self.bootstrap = broker.bootstrap_servers
            say(f"    {self.bootstrap}")
            self.record_class_archive()
            if set(self.args.rows) - {FRESHNESS_ROW}:
                self.run_main()
            self.run_session()
            self.run_many_delta_spark()
            if FRESHNESS_ROW in self.args.rows:
                FreshnessRun(self).run()
        finally:
            broker.stop()
            if self.registry is not None:
                self.registry.stop()
            shutil.rmtree(self.out / "jvm-archive", ignore_errors=True)  # ~150 MB
        csv_path = write_csv(self.results, self.out)
        chart = write_chart(self.results, self.out)
        print_table(self.results)
        say(f"wrote {csv_path}" + (f" and {chart}" if chart else ""))
        for problem in self.problems:
            say(f"PROBLEM: {problem.splitlines()[0]}")
        say(format_last_line(self.results))
        return 1 if self.problems else 0


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)
