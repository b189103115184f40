"""The crash harness's parts (scripts/chaos.py): a generated project, the development broker (Apache
Kafka, kafka_delta_dev), the pipeline as an OS process (``python -m <package>``), and an
independent check of the result that reads the table with delta-rs and Kafka with confluent-kafka
directly, never the engine's code. (The operations harness, scripts/ops.py, runs in one process:
its parts are in opslib/.)"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from cookiecutter.main import cookiecutter
from deltalake import DeltaTable
from kafka_delta_dev.object_store import LocalS3
from kafka_delta_dev.schema_registry_server import LocalSchemaRegistry

REPO = Path(__file__).resolve().parents[1]
# A folder of delta-spark jars of one's own; by default the ones scripts/bootstrap fetched
# through Maven (kafka_delta_dev.connector_jars): the delta_spark sink runs only with them.
JARS_ENV = "KAFKA_DELTA_JARS"


def default_jars() -> str | None:
    """$KAFKA_DELTA_JARS, else the connector jars Maven put in the cache; None: neither."""
    from kafka_delta_dev.connector_jars import local_folder

    return local_folder()[0]


DELTA_SESSION_CONFS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def log(tag: str, message: str) -> None:
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Project:
    """A project generated from the template: its folder, its own package (the pipeline runs as
    ``python -m <package>``) and its conf/local.yaml."""

    root: Path
    package: str
    conf: dict[str, Any]

    def registry(self, log_path: Path) -> LocalSchemaRegistry:
        """The development Schema Registry (kafka_delta_dev.schema_registry_server), started on a
        free loopback port (its ``stop()`` ends it by pid)."""
        return LocalSchemaRegistry(log_path=log_path).start()

    def object_store(self, log_path: Path) -> LocalS3:
        """The local S3 API (kafka_delta_dev.object_store, moto's server), started on a free
        loopback port (its ``stop()`` ends it by pid)."""
        return LocalS3(log_path=log_path).start()

    def write_config(self, name: str, conf: dict[str, Any]) -> Path:
        path = self.root / "conf" / f"{name}.yaml"
        path.write_text(yaml.safe_dump(conf), encoding="utf-8")
        return path

    def command(self, config: Path, bootstrap: str, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            self.package,
            "--config",
            str(config),
            "--bootstrap-servers",
            bootstrap,
            *extra,
        ]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_DELTA_")}
        env.update(PYTHONPATH=str(self.root / "src"), PYSPARK_PYTHON=sys.executable, **extra)
        return env


def generate(workdir: Path) -> Project:
    project = Path(
        cookiecutter(
            str(REPO / "template"),
            no_input=True,
            config_file=str(REPO / "conf" / "embedded-local.yaml"),
            output_dir=str(workdir),
        )
    )
    conf = yaml.safe_load((project / "conf" / "local.yaml").read_text(encoding="utf-8"))
    return Project(root=project, package=package_of(project), conf=conf)


def package_of(project: Path) -> str:
    """The generated project's own package, beside kafka_delta and kafka_delta_dev in its src/:
    cookiecutter names it after the project's folder (package_name = project_slug, ``-`` as
    ``_``)."""
    package = project.name.replace("-", "_")
    if not (project / "src" / package / "__init__.py").is_file():
        raise FileNotFoundError(f"{project}: no package {package} in src/")
    return package


def sink_settings(sink: str, jars_dir: str | None) -> dict[str, Any]:
    """Config entries that put the pipeline on the embedded source and ``sink``; delta_spark
    needs a folder of delta-spark jars (``jars_dir``) on the session's spark.jars."""
    settings: dict[str, Any] = {"engine": {"source": "embedded", "sink": sink}}
    if sink == "delta_spark":
        if not jars_dir:
            raise ValueError(
                "the delta_spark sink needs delta-spark's jars: run scripts/bootstrap where mvn "
                f"can fetch them, or set {JARS_ENV}=<folder of delta-spark jars>"
            )
        jars = sorted(str(j.resolve()) for j in Path(jars_dir).glob("*.jar"))
        if not jars:
            raise ValueError(f"{jars_dir} holds no .jar file")
        settings["spark_conf"] = {"spark.jars": ",".join(jars), **DELTA_SESSION_CONFS}
    return settings


# RESTORE with delta-spark's own SQL, in a Spark session of its own (argv: table, version,
# the session's Spark conf as JSON).
def stored_offsets_independently(
    table_uri: str,
    pipeline_id: str,
    partitions: dict[str, list[int]],
    storage_options: dict[str, str] | None = None,
) -> dict[str, dict[str, int]]:
    """The pipeline's stored offsets of ``partitions``, straight from the Delta log: its newest
    commit's userMetadata, or (after log cleanup) its per-partition txn actions."""
    table = DeltaTable(table_uri, storage_options=storage_options)
    for commit in table.history():
        try:
            body = json.loads(commit.get("userMetadata") or "null")
        except ValueError:
            continue
        if isinstance(body, dict) and body.get("kafka_delta", {}).get("pipeline_id") == pipeline_id:
            stored = body["kafka_delta"]["offsets"]
            return {t: stored[t] for t in partitions if t in stored}
    found: dict[str, dict[str, int]] = {}
    for topic, parts in partitions.items():
        for p in parts:
            version = table.transaction_version(f"{pipeline_id}:offset:{topic}:{p}")
            if version is not None:
                found.setdefault(topic, {})[str(p)] = version
    return found


def kafka_view(bootstrap: str, group: str, topics: list[str]) -> dict[str, Any]:
    """Partitions, the group's committed offsets and the latest offsets of ``topics``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=10)
    partitions = {t: sorted(metadata.topics[t].partitions) for t in topics}
    request = [TopicPartition(t, p) for t, parts in partitions.items() for p in parts]
    # A consumer of the group that joins nothing, not the admin API: librdkafka 2.16's admin
    # ListConsumerGroupOffsets can die with SIGSEGV when the coordinator moves or is loading
    # (kafka_delta.kafka.admin.KafkaAdmin.committed).
    reader = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        answered = reader.committed(request, timeout=30)
    finally:
        reader.close()
    committed: dict[str, dict[str, int]] = {}
    for tp in answered:
        if tp.offset >= 0:
            committed.setdefault(tp.topic, {})[str(tp.partition)] = tp.offset
    ends: dict[str, dict[str, int]] = {}
    for tp, future in admin.list_offsets({tp: OffsetSpec.latest() for tp in request}).items():
        ends.setdefault(tp.topic, {})[str(tp.partition)] = future.result().offset
    return {"partitions": partitions, "committed": committed, "latest": ends}


@dataclass
class Check:
    """An independent verdict on the table against what was produced."""

    produced: int
    rows: int
    distinct: int
    missing: int
    duplicates: int
    unexpected: int
    dead_rows: int
    dead_distinct: int
    dead_expected: int
    offsets_ok: bool

    @property
    def ok(self) -> bool:
        return (
            self.missing == self.duplicates == self.unexpected == 0
            and self.produced == self.rows == self.distinct
            and self.dead_rows == self.dead_distinct == self.dead_expected
            and self.offsets_ok
        )

    def summary(self) -> str:
        return (
            f"produced={self.produced} table_rows={self.rows} distinct_ids={self.distinct} "
            f"missing={self.missing} duplicates={self.duplicates} unexpected={self.unexpected} "
            f"dead_letters={self.dead_rows} distinct={self.dead_distinct} "
            f"expected={self.dead_expected} offsets_ok={self.offsets_ok}"
        )


def check(
    table: str | list[str],
    dead_table: str | None,
    produced: int,
    dead_expected: int,
    pipeline_id: str,
    bootstrap: str,
    group: str,
    topics: list[str],
    storage_options: dict[str, str] | None = None,
) -> Check:
    """Rows == distinct ids == produced (ids 0..produced-1), the dead-letter table holds
    exactly ``dead_expected`` distinct positions, and stored == group committed == latest.
    ``table`` a list: the tables of one pipeline (``tables:``, each reading every topic), the
    rows counted across them, and each table's stored offsets == committed == latest."""
    tables = [table] if isinstance(table, str) else table
    ids: Counter[object] = Counter()
    for each in tables:
        rows = DeltaTable(each, storage_options=storage_options).to_pyarrow_table(columns=["id"])
        ids.update(rows.column("id").to_pylist())
    dead_positions: list[tuple[object, ...]] = []
    if dead_table and Path(dead_table, "_delta_log").is_dir():
        dead = DeltaTable(dead_table).to_pyarrow_table(columns=["topic", "partition", "offset"])
        dead_positions = list(zip(*(dead[c].to_pylist() for c in dead.column_names), strict=True))
    view = kafka_view(bootstrap, group, topics)
    stored = [
        stored_offsets_independently(each, pipeline_id, view["partitions"], storage_options)
        for each in tables
    ]
    return Check(
        produced=produced,
        rows=sum(ids.values()),
        distinct=len(ids),
        missing=len(set(range(produced)) - set(ids)),
        duplicates=sum(n - 1 for n in ids.values() if n > 1),
        unexpected=len(set(ids) - set(range(produced))),
        dead_rows=len(dead_positions),
        dead_distinct=len(set(dead_positions)),
        dead_expected=dead_expected,
        offsets_ok=all(s == view["committed"] == view["latest"] for s in stored),
    )
