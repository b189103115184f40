"""The pytest plugin of a kafka_delta project (the ``dev`` extra; never in the deployed wheel):
real parts for tests of a transform, a config or a whole pipeline, started on loopback and
stopped by their pids when the session ends.

Enable it in ``pyproject.toml`` (a generated project does)::

    [tool.pytest.ini_options]
    addopts = "-p kafka_delta_dev.pytest_plugin"

Fixtures:

- ``spark``: one local Spark session (``local[2]``, UTC, UI off) for the whole test session,
  with the connector jars (delta-spark, Spark's kafka source) that
  :mod:`kafka_delta_dev.connector_jars` fetched through Maven into the user's cache;
  ``KAFKA_DELTA_JARS=<folder>`` puts a folder of one's own instead,
  ``KAFKA_DELTA_CONNECTORS=packages`` has Spark fetch them (``spark.jars.packages``);
- ``kafka_bootstrap``: ``KAFKA_BOOTSTRAP_SERVERS`` when set (any real Kafka), else the
  development broker (``kafka_broker``: Apache Kafka, one KRaft node, on a free loopback port;
  the stand-in Tansu only where Kafka's jars cannot be had); ``apache_kafka`` skips a test of
  what only Kafka does where the broker is the stand-in;
- ``new_topics(count, partitions=3)``: uniquely named topics on it;
- ``make_config(topics, *, engine=..., delta=..., transform=..., **kafka)``: a validated
  :class:`kafka_delta.PipelineConfig` on fresh table and checkpoint paths under ``tmp_path``;
- ``schema_registry``: the development Schema Registry (``.url``; ``.down()`` for outages);
- ``object_store``: an S3 API (moto's server) for tables in a bucket;
- ``spark_cluster``: a Spark standalone cluster on 127.0.0.1 from pyspark's own jars (a master
  and two workers of one core and 1 GiB; :mod:`kafka_delta_dev.standalone_cluster`), for runs
  submitted to a real cluster (``.master_url``) whose executors a test can SIGKILL
  (``.executor_pids(worker)``, ``.kill_worker(i)``, ``.start_worker(i)``).

:func:`connector_conf` gives a run in a process of its own the jars of an engine that needs
them (the cluster engine), or skips the test with the reason when this machine has none.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import kafka_delta
from kafka_delta.runtime.python_launcher import use_for_spark
from kafka_delta_dev import connector_jars

if TYPE_CHECKING:
    from kafka_delta.config import PipelineConfig
    from kafka_delta_dev.broker import Broker

# Spark's Python workers and its data-source planner import the engine (and the project) by
# name; they inherit PYTHONPATH from the JVM, which inherits it from this process. An installed
# project needs nothing; a project run from its source tree gets its src/ folder.
_SRC = str(Path(kafka_delta.__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC, os.environ.get("PYTHONPATH")) if p)
os.environ["PYSPARK_PYTHON"] = sys.executable
# Spark's Python processes import the installed, compiled pyspark, not Spark's source zip, as in
# a run (kafka_delta.runtime.python_launcher).
use_for_spark()

# KAFKA_DELTA_CONNECTORS=packages: the session fetches the cluster engine's connector jars
# (delta-spark, spark-sql-kafka) with spark.jars.packages. Needs access to Maven Central (or
# spark.jars.repositories).
WITH_CONNECTORS = os.environ.get("KAFKA_DELTA_CONNECTORS") == "packages"
# The folder whose jars go on spark.jars: KAFKA_DELTA_JARS=<folder> (a copy of one's own), else
# the jars scripts/bootstrap fetched through Maven (kafka_delta_dev.connector_jars). JARS_WHY
# says, in the words a skip reports, why there is none.
JARS_DIR, JARS_WHY = connector_jars.local_folder()
# Whether Spark's kafka source itself can run here (its jar fetched, or named by a folder): where
# it can, tests run it; where it cannot, its stand-in (kafka_delta_dev.spark_kafka_standin).
KAFKA_SOURCE_AT_HAND = WITH_CONNECTORS or (
    bool(JARS_DIR) and any(Path(JARS_DIR).expanduser().glob("spark-sql-kafka*.jar"))
)
NO_JAVA = shutil.which("java") is None and not os.environ.get("JAVA_HOME")
NEEDS_JAVA = "Spark needs Java 17: java is not on PATH and JAVA_HOME is unset"


def connector_conf(source: str, sink: str) -> dict[str, str]:
    """The Spark confs a run of the engine ``source`` + ``sink`` in a process of its own needs
    for its connector jars on this machine (``{}`` for the embedded engine); skips the calling
    test, with the reason the suite reports, when they cannot be had here."""
    from kafka_delta.runtime.connectors import (
        DELTA_SESSION_CONFS,
        connector_packages,
        local_connector_jars,
        required_connectors,
    )

    needed = required_connectors(source, sink)
    if not needed:
        return {}
    if WITH_CONNECTORS:
        return {"spark.jars.packages": ",".join(connector_packages()), **DELTA_SESSION_CONFS}
    if JARS_DIR:
        missing = [] if KAFKA_SOURCE_AT_HAND else [c for c in needed if c == "spark-sql-kafka"]
        if not missing:
            jars = ",".join(local_connector_jars(JARS_DIR))
            return {"spark.jars": jars, **DELTA_SESSION_CONFS}
        pytest.skip(connector_skip_reason(missing))
    pytest.skip(connector_skip_reason(needed))


def connector_skip_reason(missing: list[str]) -> str:
    """The one sentence a test skipped for want of ``missing`` connectors reports: which, and
    why this machine has none (no Maven, Maven refused, a folder without them)."""
    from kafka_delta.runtime.connectors import connectors_missing_reason

    why = JARS_WHY or f"KAFKA_DELTA_JARS={JARS_DIR} holds no jar of them"
    return connectors_missing_reason(missing, why)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "broker: needs a Kafka broker (the development one, or KAFKA_BOOTSTRAP_SERVERS)"
    )
    config.addinivalue_line("markers", "spark: needs a local Spark session")


@pytest.fixture(scope="session")
def spark():
    if NO_JAVA:
        pytest.skip(NEEDS_JAVA)
    from kafka_delta_dev.local_spark import connector_confs, local_session

    confs = connector_confs(JARS_DIR, WITH_CONNECTORS)
    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        yield from _connect_session(remote, confs)
        return
    session = local_session("tests", confs)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _connect_session(remote: str, confs: dict[str, str]) -> Iterator[object]:
    """``SPARK_REMOTE=local[N]``: a Spark Connect server of that master in a process of its
    own (:mod:`kafka_delta_dev.connect_server`), and a Connect session to it, so this process
    holds no SparkContext, as a Databricks serverless job's Python holds none; processes the
    tests start (the CLI) reach the same server through ``SPARK_REMOTE``. ``sc://...``: that
    server."""
    from kafka_delta_dev.connect_server import ConnectServer
    from kafka_delta_dev.local_spark import remote_session, session_confs

    server = None
    if not remote.startswith("sc://"):
        log = Path(os.environ.get("KAFKA_DELTA_CONNECT_LOG", os.devnull))
        server = ConnectServer(remote, session_confs(confs), log_path=log).start()
        remote = server.url
        os.environ["SPARK_REMOTE"] = remote
    try:
        session = remote_session(remote)
        yield session
        session.stop()
        from pyspark import SparkContext

        # What the suite run through Connect proves beside its own tests: nothing in it (the
        # engine, the fixtures) made a classic session in this process.
        assert SparkContext._active_spark_context is None, (
            "a classic SparkContext was created in a process that runs on Spark Connect"
        )
    finally:
        if server is not None:
            server.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker | None]:
    """The session's development broker (:mod:`kafka_delta_dev.broker`): Apache Kafka, one
    KRaft node on a free loopback port (Tansu only where Kafka's jars cannot be had, which it
    says); None when ``KAFKA_BOOTSTRAP_SERVERS`` names a Kafka of one's own."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield None
        return
    from kafka_delta_dev.broker import BrokerError, dev_broker, start_broker

    folder = tmp_path_factory.mktemp("kafka")
    try:
        broker = start_broker(dev_broker(folder=folder, log_path=folder / "console.log"))
    except BrokerError as exc:
        pytest.skip(f"no Kafka broker: {exc}")
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: Broker | None) -> str:
    """KAFKA_BOOTSTRAP_SERVERS when set (any real Kafka), else the session's development
    broker's address (:func:`kafka_broker`)."""
    if kafka_broker is None:
        return os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    return kafka_broker.bootstrap_servers


@pytest.fixture
def apache_kafka(kafka_broker: Broker | None) -> None:
    """For a test of what only a real Kafka does (transactions filtered for read_committed,
    CreatePartitions, DeleteRecords, compaction): skips, saying why, where the session's broker
    is the stand-in Tansu."""
    if kafka_broker is not None and kafka_broker.kind != "kafka":
        from kafka_delta_dev.broker import broker_kind

        pytest.skip(f"needs Apache Kafka's broker, not its stand-in: {broker_kind()[1]}")


@pytest.fixture
def new_topics(kafka_bootstrap: str) -> Callable[..., list[str]]:
    """Create uniquely named topics: ``new_topics(2, partitions=3)``; ``config`` sets topic
    settings (``new_topics(1, config={"cleanup.policy": "compact"})``)."""
    from kafka_delta_dev.produce import ensure_topics

    def create(
        count: int = 1, partitions: int = 3, config: dict[str, str] | None = None
    ) -> list[str]:
        names = [f"t{i}-{uuid.uuid4().hex[:10]}" for i in range(count)]
        ensure_topics(kafka_bootstrap, names, partitions, config=config)
        return names

    return create


@pytest.fixture
def make_config(tmp_path: Path, kafka_bootstrap: str) -> Callable[..., PipelineConfig]:
    """A PipelineConfig on fresh table/checkpoint paths under tmp_path, against the session's
    broker: ``make_config(topics, engine=..., delta={...}, transform="pkg.mod:fn", **kafka)``."""
    from kafka_delta.config import PipelineConfig

    def make(
        topics: list[str],
        *,
        engine: str | dict[str, str] = "embedded",
        delta: dict[str, object] | None = None,
        transform: str | None = None,
        **kafka: object,
    ) -> PipelineConfig:
        return PipelineConfig.model_validate(
            {
                "pipeline_id": "test-pipeline",
                "transform": transform,
                "engine": engine,
                "kafka": {
                    "bootstrap_servers": kafka_bootstrap,
                    "topics": topics,
                    "consumer_group": f"g-{uuid.uuid4().hex[:10]}",
                    "client": {"fetch.wait.max.ms": 100},
                    **kafka,
                },
                "delta": {"table": str(tmp_path / "table"), **(delta or {})},
                "checkpoint": str(tmp_path / "checkpoint"),
                "commit_back": {"timeout_seconds": 10},
            }
        )

    return make


# --- the development Schema Registry (schema_registry_server.py) ----------------------------


class SchemaRegistryProcess:
    """The local Schema Registry in its own process on a fixed loopback port, its state in a
    file: ``stop()`` then ``start()`` brings it back on the same URL with the same ids, which is
    how a test plays "registry down" and "registry up"."""

    def __init__(self, data_path: Path) -> None:
        from kafka_delta_dev.schema_registry_server import LocalSchemaRegistry

        self._registry = LocalSchemaRegistry(
            data_path=data_path, log_path=data_path.with_suffix(".log")
        )
        self.data_path = data_path

    @property
    def url(self) -> str:
        return self._registry.url

    @property
    def pid(self) -> int | None:
        process = self._registry.process
        return process.pid if process is not None else None

    def start(self) -> None:
        if self._registry.process is None:
            self._registry.start()

    def stop(self) -> None:
        self._registry.stop()

    def down(self):
        """``with schema_registry.down(): ...``: stopped inside, running again after, even when
        the block fails (the session's other tests share this registry)."""
        import contextlib

        @contextlib.contextmanager
        def stopped() -> Iterator[None]:
            self.stop()
            try:
                yield
            finally:
                self.start()

        return stopped()


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory):
    """moto's S3 API on a free loopback port (``.endpoint``, ``.storage_options()``,
    ``.create_bucket(name)``), stopped by its pid at the end of the session."""
    from kafka_delta_dev.object_store import LocalS3

    store = LocalS3(log_path=tmp_path_factory.mktemp("s3") / "moto.log").start()
    try:
        yield store
    finally:
        store.stop()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchemaRegistryProcess]:
    """The development Schema Registry on a free loopback port (``.url``), stopped by its pid
    at the end of the session; ``.stop()``, ``.start()`` and ``.down()`` for outage tests."""
    from kafka_delta_dev.schema_registry_server import RegistryError

    registry = SchemaRegistryProcess(tmp_path_factory.mktemp("schema-registry") / "state.json")
    try:
        registry.start()
    except RegistryError as exc:
        pytest.skip(f"no schema registry: {exc}")
    try:
        yield registry
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A Spark standalone cluster on 127.0.0.1: a master and two workers of one core and 1 GiB,
    from the installed pyspark's jars, their work folders and logs under the session's tmp
    path; stopped by their pids at the end of the session (and tied to this process, so a
    session killed hard leaves none)."""
    if NO_JAVA:
        pytest.skip(NEEDS_JAVA)
    from kafka_delta_dev.standalone_cluster import StandaloneCluster

    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2).start()
    try:
        yield cluster
    finally:
        cluster.stop()
