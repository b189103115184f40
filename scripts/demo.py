"""The demo: generate a project, start the embedded broker, produce events, run the pipeline
until caught up with spark-submit, then show the table, its stored offsets and the consumer
group's lag, and draw records/s and lag per batch as a PNG (the project's `report` command).
The last line is machine-checkable:

    demo: produced=<N> table_rows=<N> distinct_ids=<N> group_lag=<L>
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
from kafka_delta.kafka import admin as admin_mod
from kafka_delta.sinks.delta_rs import offset_store as store_mod
from kafka_delta_dev import broker as broker_mod
from kafka_delta_dev import produce as produce_mod
from kafka_delta_dev import registry as registry_mod

REPO = Path(__file__).resolve().parents[1]


def say(message: str) -> None:
    print(f"\n==> {message}", flush=True)


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
    args = parser.parse_args(argv)

    say(f"generating a project from conf/{args.preset}.yaml into {args.workdir}")
    shutil.rmtree(args.workdir, ignore_errors=True)
    project = Path(
        cookiecutter(
            str(REPO / "template"),
            no_input=True,
            config_file=str(REPO / "conf" / f"{args.preset}.yaml"),
            output_dir=str(args.workdir),
            extra_context={"value_format": args.format},
        )
    )
    # The project's own package, beside the engine in its src/: cookiecutter names it after the
    # project's folder (package_name = project_slug, "-" as "_").
    package = project.name.replace("-", "_")
    print(f"    {project} (package {package})")

    config = config_mod.load_config(project / "conf" / "local.yaml")
    topics = list(config.kafka.topics)

    say("starting the embedded Kafka-compatible broker (Tansu) on 127.0.0.1")
    broker = broker_mod.EmbeddedBroker(log_path=args.workdir / "broker.log").start()
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
        started = time.perf_counter()
        run = subprocess.run(
            [
                str(project / "scripts" / "run_local.sh"),
                "--env",
                "local",
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

        from deltalake import DeltaTable

        table = DeltaTable(config.delta.table)
        data = table.to_pyarrow_table()
        ids = data.column("id").to_pylist()
        say(f"Delta table {config.delta.table}: {data.num_rows} rows, version {table.version()}")
        shown = ["id", "event_type", "amount", "event_time", "topic", "partition", "offset"]
        if "channel" in data.column_names:  # the field schema v2 added, null before it
            shown.insert(4, "channel")
        by_id = data.sort_by("id")
        rows = [*range(3), *range(max(3, data.num_rows - 2), data.num_rows)]
        print(by_id.take(rows).select(shown).to_pandas().to_string(index=False))

        stored = store_mod.DeltaRsOffsetStore(config.delta.table, config.pipeline_id).read()
        admin = admin_mod.KafkaAdmin({"bootstrap.servers": bootstrap})
        partitions = admin.partitions(topics)
        latest = admin.latest(partitions)
        committed = admin.committed(config.kafka.consumer_group, partitions)
        say(
            f"offsets stored in the table (Delta version {stored.delta_version}) vs consumer "
            f"group {config.kafka.consumer_group!r}"
        )
        header = ("topic", "part", "stored", "committed", "latest", "lag")
        print("    {:<12}{:>5}{:>10}{:>11}{:>10}{:>6}".format(*header))
        for topic, parts in sorted(latest.items()):
            for p, hi in sorted(parts.items()):
                s = stored.offsets.get(topic, {}).get(p, "-")
                c = committed.get(topic, {}).get(p, "-")
                lag = hi - c if isinstance(c, int) else hi
                print(f"    {topic:<12}{p:>5}{s:>10}{c:>11}{hi:>10}{lag:>6}")
        group_lag = admin_mod.total_lag(latest, committed)
        rps = data.num_rows / wall if wall else 0.0
        print(f"\n    end to end: {data.num_rows} rows in {wall:.1f}s = {rps:,.0f} records/s")

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
    )
    ok = produced == data.num_rows == len(set(ids)) and group_lag == 0
    return 0 if ok else 1


if __name__ == "__main__":
    from kafka_delta.runtime.process_exit import run_and_exit  # the real exit status, see there

    run_and_exit(main)
