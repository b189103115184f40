"""The repository suite's plugin, for both of its trees (tests/ and engine/tests/; pyproject.toml
loads it with ``-p suite_plugin``, a conftest.py would reach one tree only): every skip must be
one this machine really has (tests/skips.py), the heaviest tests start first, spread over the
workers (``scripts/test`` runs two), and the Spark JVMs the tests start map one class archive of
Spark's classes, recorded once per run."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_delta.runtime import jvm_archive
from skips import is_allowed

# The heaviest tests, by the seconds each took in `scripts/test --durations` on a 2-core build
# machine (both workers busy). xdist's worksteal hands each worker a
# contiguous share of the collection and lets an idle worker steal from the end of the other's
# queue, so tests collected last run last: left in collection order, these (most of them in
# tests/test_*.py, collected after engine/tests) ended the run on one worker while the other
# idled. Started first, one share each by weight, the run ends on short tests that stealing
# spreads evenly.
HEAVY = {
    # From the CI machine's run of 0969b56 on Apache Kafka (68 min, `--durations`), halved:
    # the weights only order and share the work, so a common factor changes nothing.
    "tests/test_bench.py::test_tiny_benchmark": 220,
    "tests/test_ops.py::test_random_operator_moves_on_two_tables": 170,
    "engine/tests/test_spark_connect.py::test_the_engine_contract_passes_through": 160,
    "engine/tests/test_standalone_cluster.py::test_executors_sigkilled": 150,
    "tests/test_ops.py::test_the_races_of_seed_29110": 145,
    "engine/tests/test_maintain.py::test_maintenance_beside_a_running_pipeline": 130,
    "tests/test_ops.py::test_random_operator_moves": 120,
    "tests/test_ops.py::test_two_tables_racing": 115,
    "tests/test_chaos.py::test_repeated_sigkills": 75,
    "engine/tests/test_standalone_cluster.py::test_the_cluster_engine": 85,
    "tests/test_quick_start.py::test_readme_cluster_commands": 85,
    "engine/tests/test_kafka_outage.py::test_a_continuous_run_rides_out": 80,
    "engine/tests/test_kafka_outage.py::test_spark_kafka_source_stops": 70,
    "engine/tests/test_debezium.py::test_debezium_avro_through_a_kill": 70,
    "engine/tests/test_recovery.py::test_a_run_fenced_mid_batch": 55,
    "tests/test_bench.py::test_tiny_freshness_row": 55,
    "tests/test_quick_start.py::test_readme_commands": 50,
    "tests/test_cruft.py::test_a_project_that_carried_a_copy": 50,
    "tests/test_generated_project.py::test_a_generated_projects_own_suite": 45,
    "engine/tests/test_run_compaction.py::test_a_low_latency_run_compacts": 45,
    "tests/test_ops.py::test_the_shrunk_case": 35,
    "tests/test_ops.py::test_a_partition_added_beside_a_live_run": 35,
    "engine/tests/test_object_storage.py::test_two_runs_racing": 30,
    # Real Kafka's and secure Kafka's cases (a broker or three of their own each; a quiet
    # 2-core machine's seconds).
    "engine/tests/test_kafka_secrets.py::test_no_secret_is_written_anywhere": 80,
    "engine/tests/test_real_kafka.py::test_the_leader_of_a_partition": 45,
    "engine/tests/test_real_kafka.py::test_a_run_reads_and_commits_from_two_brokers": 45,
    "engine/tests/test_real_kafka.py::test_a_broker_sigkilled_and_restarted": 35,
    "engine/tests/test_secure_kafka.py::test_each_production_shape": 30,
    "engine/tests/test_real_kafka.py::test_an_open_transaction": 20,
    "engine/tests/test_many_tables.py::test_a_table_written_before_tables_existed": 18,
    "engine/tests/test_many_tables.py::test_topic_routing_lands_each_topic": 14,
    "engine/tests/test_graceful_stop.py::test_a_signal_during_a_batch": 14,
    "engine/tests/test_graceful_stop.py::test_a_second_signal": 13,
    "tests/test_spark_floor.py::test_the_floor_prints": 11,
    "engine/tests/test_avro_evolution.py::test_a_crash_between_the_nested_field_commit": 11,
}


def _weight(item: pytest.Item) -> int:
    return next((s for prefix, s in HEAVY.items() if item.nodeid.startswith(prefix)), 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: order the collection as worksteal's first shares, heaviest first.
    Every worker computes the same order (xdist requires identical collections)."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers < 2:
        return
    heavy = sorted((i for i in items if _weight(i)), key=lambda i: (-_weight(i), i.nodeid))
    light = [i for i in items if not _weight(i)]
    # worksteal's first distribution: worker k takes len(pending) // (workers left) in turn.
    sizes, left = [], len(items)
    for k in range(workers, 0, -1):
        sizes.append(left // k)
        left -= sizes[-1]
    shares: list[list[pytest.Item]] = [[] for _ in sizes]
    loads = [0] * workers
    for item in heavy:  # the longest first into the least-loaded share that has room
        k = min((k for k in range(workers) if len(shares[k]) < sizes[k]), key=loads.__getitem__)
        shares[k].append(item)
        loads[k] += _weight(item)
    for k in range(workers):
        room = sizes[k] - len(shares[k])
        shares[k].extend(light[:room])
        light = light[room:]
    items[:] = [item for share in shares for item in share]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    vacuous = [
        (report.nodeid, report.longrepr[2])
        for report in skipped
        if isinstance(report.longrepr, tuple) and not is_allowed(report.longrepr[2], os.environ)
    ]
    if vacuous:
        for nodeid, reason in vacuous:
            reporter.write_line(f"skipped on a machine that can run it: {nodeid}: {reason}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# What the recording JVM runs: a streaming query on a Python data source through Arrow, as a
# pipeline run does, so that the classes a run loads are in the archive.
RECORDING_RUN = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Reader(DataSourceStreamReader):
        def initialOffset(self):
            return {"at": 0}
        def latestOffset(self):
            return {"at": 2}
        def partitions(self, start, end):
            return [InputPartition(i) for i in range(start["at"], end["at"])]
        def read(self, partition):
            yield (partition.value, b"x")

    class Source(DataSource):
        @classmethod
        def name(cls):
            return "recording"
        def schema(self):
            return "id long, value binary"
        def streamReader(self, schema):
            return Reader()

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", sys.argv[1])
        .getOrCreate()
    )
    spark.dataSource.register(Source)
    frame = spark.readStream.format("recording").load()

    def batch(df, batch_id):
        df.mapInArrow(lambda batches: batches, df.schema).toArrow()

    query = frame.writeStream.foreachBatch(batch).trigger(availableNow=True).start()
    query.awaitTermination()
    spark.stop()
    """
)


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive() -> Iterator[Path]:
    """One class archive of Spark's classes for every Spark JVM the tests start
    (kafka_delta.runtime.jvm_archive): ``SPARK_CLASS_ARCHIVE`` names it for the whole session,
    so the workers' own Spark sessions, ``python -m`` runs and ``scripts/run_local.sh`` map it
    (about 2.5 s off each JVM's start) and none records one into the user's cache. It is kept in
    the test environment (``.venv``); where there is none yet (a fresh clone, a new pyspark or
    JDK), the first worker to get here records it (~20 s, once) and the other goes on: the JVMs
    it starts meanwhile neither record nor map. test_jvm_archive.py, test_quick_start.py and the
    benchmark name folders of their own."""
    folder = Path(sys.prefix) / "spark-class-archive"
    folder.mkdir(exist_ok=True)
    env = {**os.environ, jvm_archive.ENV: str(folder)}
    with (folder / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _record(folder, env)
            fcntl.flock(lock, fcntl.LOCK_UN)
        except BlockingIOError:
            pass  # the other worker records it
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(jvm_archive.ENV, str(folder))
        yield folder


def _record(folder: Path, env: dict[str, str]) -> None:
    """Record the archive, unless there is one (or another JVM records it now)."""
    archive_key = jvm_archive.key(env)
    options = jvm_archive.java_options(os.getpid(), env) if archive_key else []
    if not options or not options[0].startswith("-XX:ArchiveClassesAtExit="):
        return
    try:
        subprocess.run(
            [sys.executable, "-c", RECORDING_RUN, jvm_archive.option_string(options)],
            env=env,
            capture_output=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        return  # the archive only saves time: the tests run without it
    # The JVM writes the archive as it exits, after the Python process that started it.
    deadline = time.monotonic() + 120
    while jvm_archive.promote(folder, archive_key) is None and time.monotonic() < deadline:
        time.sleep(0.5)
