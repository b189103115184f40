"""The demo: generate a project, start the development broker, produce events, run the pipeline
until caught up with spark-submit, then show the table, its stored offsets and the consumer
group's lag, and draw records/s and lag per batch as a PNG (the project's `report` command).
The last line is machine-checkable:

    demo: produced=<N> table_rows=<N> distinct_ids=<N> group_lag=<L>

With ``--fan-out``, one stream into two tables: the project reads the topics ``orders`` and
``payments`` and routes each to its own table (``tables:`` in ``conf/fan-out.yaml``); the rows
are counted across both tables and the last line ends `` tables=2``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cookiecutter.main import cookiecutter
from kafka_delta import config as config_mod
from kafka_delta.delta import rs_offset_store as store_mod
from kafka_delta.kafka import admin as admin_mod
from kafka_delta_dev import broker as broker_mod
from kafka_delta_dev import produce as produce_mod
from kafka_delta_dev import schema_registry_server as registry_mod

REPO = Path(__file__).resolve().parents[1]


def say(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def run_figures(progress_path: str | None, started_at: float) -> str:
    """The run's start-up and steady records/s apart, as scripts/bench reports them, from the
    progress lines the pipeline wrote (one per committed batch): start-up from the process
    start to the first committed batch, steady records/s from the first committed batch to the
    last. JVM start and warm-up are in the first, not in the second."""
    from kafka_delta.progress.batch import run_rate
    from kafka_delta.progress.log_file import ProgressFileError, read_progress

    if not progress_path:
        return "run figures: none (the project's config sets no progress.path)"
    try:
        batches = read_progress(Path(progress_path))
    except ProgressFileError as exc:
        return f"run figures: none ({exc})"
    this_run = [b for b in batches if b.run_id == batches[-1].run_id] if batches else []
    rate = run_rate(this_run)
    if rate is None:
        return "run figures: none (no batch was committed)"
    startup = (
        f"start-up {rate.first_committed_at - started_at:.1f}s: process start to the first "
        "committed batch (JVM start and warm-up)"
    )
    steady = rate.steady_records_per_s
    if steady is None:
        return f"{startup}\n    steady records/s: none (one batch)"
    return (
        f"{startup}\n    steady {steady:,.0f} records/s: {rate.steady_records:,} records in the "
        f"{rate.batches - 1} batches after the first, {rate.steady_s:.1f}s from the first "
        "committed batch to the last"
    )


def fan_out_config(project: Path) -> Path:
    """``conf/fan-out.yaml``: the project's local config with ``tables:`` in place of
    ``delta:``: topic ``orders`` into one table, ``payments`` into another."""
    import yaml

    data = yaml.safe_load((project / "conf" / "local.yaml").read_text())
    data.pop("delta", None)
    data["tables"] = {
        topic: {"path": f"data/tables/{topic}", "topics": [topic]}
        for topic in ("orders", "payments")
    }
    path = project / "conf" / "fan-out.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000, help="events to produce")
    parser.add_argument("--partitions", type=int, default=4, help="partitions per topic")
    parser.add_argument(
        "--batch-records",
        type=int,
        default=12_500,
        help="max records per micro-batch (several batches make the picture worth drawing)",
    )
    parser.add_argument("--preset", default="embedded-local", help="a preset in conf/")
    parser.add_argument(
        "--format",
        choices=["json", "avro", "protobuf"],
        default="json",
        help="the events' format (the project's value_format answer): avro and protobuf go "
        "through a local Schema Registry, and switch to a second schema version (an added "
        "field) halfway, which the table follows",
    )
    parser.add_argument("--workdir", type=Path, default=REPO / ".demo")
    parser.add_argument(
        "--fan-out",
        action="store_true",
        help="one stream into two tables: topics orders and payments, each routed to its own "
        "table (tables: in conf/fan-out.yaml)",
    )
    args = parser.parse_args(argv)

    say(f"generating a project from conf/{args.preset}.yaml into {args.workdir}")
    shutil.rmtree(args.workdir, ignore_errors=True)
    project = Path(
        cookiecutter(
            str(REPO / "template"),
            no_input=True,
            config_file=str(REPO / "conf" / f"{args.preset}.yaml"),
            output_dir=str(args.workdir),
            extra_context={
                "value_format": args.format,
                **({"topics": "orders,payments"} if args.fan_out else {}),
            },
        )
    )
    # The project's own package, alone in its src/ (the engine is installed): named after the
    # project's folder (package_name = project_slug, "-" as "_").
    package = project.name.replace("-", "_")
    print(f"    {project} (package {package})")

    env_name = "fan-out" if args.fan_out else "local"
    if args.fan_out:
        fan_out_config(project)
    config = config_mod.load_config(project / "conf" / f"{env_name}.yaml")
    topics = list(config.kafka.topics)

    say("starting a Kafka broker (Apache Kafka, one KRaft node) on 127.0.0.1")
    broker = broker_mod.start_broker(
        broker_mod.dev_broker(log_path=args.workdir / "broker.log", folder=args.workdir / "kafka")
    )
    registry = None
    try:
        bootstrap = broker.bootstrap_servers
        print(f"    bootstrap servers: {bootstrap}")
        registry_args: list[str] = []
        if args.format != "json":
            say("starting the development Schema Registry on 127.0.0.1")
            registry = registry_mod.LocalSchemaRegistry(
                log_path=args.workdir / "registry.log"
            ).start()
            registry_args = ["--schema-registry-url", registry.url]
            print(f"    schema registry: {registry.url}")

        evolve = args.format != "json"
        say(
            f"producing {args.records} {args.format} events to {', '.join(topics)}"
            + (" (schema v2, with a field `channel`, from halfway)" if evolve else "")
        )
        produce_mod.ensure_topics(bootstrap, topics, args.partitions)
        started = time.perf_counter()
        produced = produce_mod.produce_events(
            bootstrap,
            topics,
            args.records,
            value_format=args.format,
            registry_url=registry.url if registry else None,
            evolve=evolve,
        )
        print(f"    {produced} events in {time.perf_counter() - started:.1f}s")

        say(
            "running the pipeline until caught up: scripts/run_local.sh --trigger available-now "
            f"--max-records-per-trigger {args.batch_records}"
        )
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
        env.pop("PYTHONPATH", None)
        started, started_at = time.perf_counter(), time.time()
        run = subprocess.run(
            [
                str(project / "scripts" / "run_local.sh"),
                "--env",
                env_name,
                "--bootstrap-servers",
                bootstrap,
                "--trigger",
                "available-now",
                "--max-records-per-trigger",
                str(args.batch_records),
                *registry_args,
            ],
            cwd=project,
            env=env,
            check=False,
        )
        wall = time.perf_counter() - started
        if run.returncode != 0:
            print(f"demo: the pipeline failed with exit code {run.returncode}", file=sys.stderr)
            return run.returncode
        print(f"    pipeline wall time {wall:.1f}s (JVM start included)")
        pace = run_figures(config.progress.path, started_at)

        import pyarrow as pa
        from deltalake import DeltaTable

        views = config.table_configs()  # each table of tables: (--fan-out), else the one
        parts = []
        for view in views:
            table = DeltaTable(view.delta.table)
            part = table.to_pyarrow_table()
            named = "" if view.table_name is None else f"{view.table_name} "
            version = table.version()
            say(f"Delta table {named}{view.delta.table}: {part.num_rows} rows, version {version}")
            parts.append(part)
        data = pa.concat_tables(parts, promote_options="default")
        ids = data.column("id").to_pylist()
        shown = ["id", "event_type", "amount", "event_time", "topic", "partition", "offset"]
        if "channel" in data.column_names:  # the field schema v2 added, null before it
            shown.insert(4, "channel")
        by_id = data.sort_by("id")
        rows = [*range(3), *range(max(3, data.num_rows - 2), data.num_rows)]
        print(by_id.take(rows).select(shown).to_pandas().to_string(index=False))

        held: dict[str, dict[int, int]] = {}
        for view in views:  # each table stores the offsets of the topics it reads
            found = store_mod.DeltaRsOffsetStore(view.delta.table, view.pipeline_id).read()
            for topic in view.kafka.topics:
                held[topic] = dict(found.offsets.get(topic, {}))
        stored = found
        admin = admin_mod.KafkaAdmin({"bootstrap.servers": bootstrap})
        partitions = admin.partitions(topics)
        latest = admin.latest(partitions)
        committed = admin.committed(config.kafka.consumer_group, partitions)
        say(
            (
                f"offsets stored in the table (Delta version {stored.delta_version})"
                if len(views) == 1
                else f"offsets stored in the {len(views)} tables (each its topics)"
            )
            + f" vs consumer group {config.kafka.consumer_group!r}"
        )
        header = ("topic", "part", "stored", "committed", "latest", "lag")
        print("    {:<12}{:>5}{:>10}{:>11}{:>10}{:>6}".format(*header))
        for topic, parts in sorted(latest.items()):
            for p, hi in sorted(parts.items()):
                s = held.get(topic, {}).get(p, "-")
                c = committed.get(topic, {}).get(p, "-")
                lag = hi - c if isinstance(c, int) else hi
                print(f"    {topic:<12}{p:>5}{s:>10}{c:>11}{hi:>10}{lag:>6}")
        group_lag = admin_mod.total_lag(latest, committed)
        print(f"\n    {pace}")

        say(f"drawing the run's progress: python -m {package} report")
        report = subprocess.run(
            [sys.executable, "-m", package, "report"],
            cwd=project,
            env=dict(env, PYTHONPATH=str(project / "src")),
            capture_output=True,
            text=True,
            check=False,
        )
        if report.returncode != 0:
            print(f"demo: report failed: {report.stderr.strip()}", file=sys.stderr)
            return report.returncode
        picture = report.stdout.splitlines()[-1]
        print(f"    {report.stdout.splitlines()[0]}")
        print(f"    picture (records/s and lag per micro-batch): {picture}")
    finally:
        say("stopping the broker" + (" and the registry" if registry else ""))
        # Kafka clients still alive when the broker goes would log reconnect noise after
        # the last line: drop them first.
        admin = None
        gc.collect()
        broker.stop()
        if registry is not None:
            registry.stop()

    print(
        f"demo: produced={produced} table_rows={data.num_rows} "
        f"distinct_ids={len(set(ids))} group_lag={group_lag}"
        + (f" tables={len(views)}" if args.fan_out else "")
    )
    ok = produced == data.num_rows == len(set(ids)) and group_lag == 0
    return 0 if ok else 1


if __name__ == "__main__":
    from kafka_delta.runtime.process_exit import run_and_exit  # the real exit status, see there

    run_and_exit(main)
