"""Shared fixtures: one local Spark session, a real Kafka-compatible broker, fresh topics."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
# Spark's Python workers and its data-source planner import this package by name; they inherit
# PYTHONPATH from the JVM, which inherits it from this process.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
os.environ["PYSPARK_PYTHON"] = sys.executable
# scripts/run_local.sh, started by some tests, would record a ~150 MB class archive of Spark's
# JVM classes into the user's cache as it exits; tests/test_jvm_archive.py tests that apart.
os.environ["SPARK_CLASS_ARCHIVE"] = "off"

from {{ cookiecutter.package_name }}.config import PipelineConfig  # noqa: E402
from {{ cookiecutter.package_name }}.python_launcher import use_for_spark  # noqa: E402

# Spark's Python processes import the installed, compiled pyspark, not Spark's source zip, as in a
# run (src/{{ cookiecutter.package_name }}/python_launcher.py).
use_for_spark()

# KAFKA_DELTA_CONNECTORS=packages: the test session fetches the cluster engine's connector jars
# (delta-spark, spark-sql-kafka) with spark.jars.packages, so its tests run instead of being
# skipped. Needs access to Maven Central (or spark.jars.repositories).
WITH_CONNECTORS = os.environ.get("KAFKA_DELTA_CONNECTORS") == "packages"
# KAFKA_DELTA_JARS=<folder>: every jar in that folder goes on spark.jars instead (an air-gapped
# machine's copy of the connectors; the template's CI points it at shared/jars/delta-4.4.0).
JARS_DIR = os.environ.get("KAFKA_DELTA_JARS") or None
NO_JAVA = shutil.which("java") is None and not os.environ.get("JAVA_HOME")
NEEDS_JAVA = "Spark needs Java 17: java is not on PATH and JAVA_HOME is unset"


@pytest.fixture(scope="session")
def spark():
    if NO_JAVA:
        pytest.skip(NEEDS_JAVA)
    from pyspark.sql import SparkSession

    from {{ cookiecutter.package_name }}.connectors import (
        DELTA_SESSION_CONFS,
        connector_packages,
        local_connector_jars,
    )

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        # as conf/local.yaml: streaming queries disable it anyway, with a warning
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.databricks.delta.snapshotPartitions", "2")  # as conf/local.yaml
    )
    if WITH_CONNECTORS:
        builder = builder.config("spark.jars.packages", ",".join(connector_packages()))
    if JARS_DIR:
        builder = builder.config("spark.jars", ",".join(local_connector_jars(JARS_DIR)))
    if WITH_CONNECTORS or JARS_DIR:
        for key, value in DELTA_SESSION_CONFS.items():
            builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def engine_config(name: str) -> dict[str, str]:
    """``engine:`` of a config for a parametrized engine id (a preset, or source+sink)."""
    from {{ cookiecutter.package_name }}.config import ENGINE_PRESETS

    if name in ENGINE_PRESETS:
        return dict(ENGINE_PRESETS[name])
    source, sink = name.split("+")
    return {"source": source, "sink": sink}


def skip_without_connectors(spark, engine: dict[str, str]) -> None:
    """Skip (with the reason the suite reports) when the session lacks the engine's jars."""
    from {{ cookiecutter.package_name }}.connectors import (
        connectors_missing_reason,
        missing_connectors,
        required_connectors,
    )

    missing = missing_connectors(spark, required_connectors(engine["source"], engine["sink"]))
    if missing:
        pytest.skip(connectors_missing_reason(missing))


@pytest.fixture(params=["delta_rs", "delta_spark"])
def sink_engine(request, spark) -> dict[str, str]:
    """The embedded source with each sink; skipped (with its reason) without delta-spark."""
    engine = {"source": "embedded", "sink": request.param}
    skip_without_connectors(spark, engine)
    return engine


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """KAFKA_BOOTSTRAP_SERVERS when set (any real Kafka), else the embedded Tansu broker."""
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        yield configured
        return
    from {{ cookiecutter.package_name }}.devtools.broker import BrokerError, EmbeddedBroker

    try:
        broker = EmbeddedBroker().start()
    except BrokerError as exc:
        pytest.skip(f"no Kafka broker: {exc}")
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()


@pytest.fixture
def new_topics(kafka_bootstrap: str) -> Callable[..., list[str]]:
    """Create uniquely named topics: ``new_topics(2, partitions=3)``."""
    from {{ cookiecutter.package_name }}.devtools.produce import ensure_topics

    def create(count: int = 1, partitions: int = 3) -> list[str]:
        names = [f"t{i}-{uuid.uuid4().hex[:10]}" for i in range(count)]
        ensure_topics(kafka_bootstrap, names, partitions)
        return names

    return create


@pytest.fixture
def make_config(tmp_path: Path, kafka_bootstrap: str) -> Callable[..., PipelineConfig]:
    """A PipelineConfig on fresh table/checkpoint paths under tmp_path."""

    def make(
        topics: list[str],
        *,
        engine: str | dict[str, str] = "embedded",
        delta: dict[str, object] | None = None,
        **kafka: object,
    ) -> PipelineConfig:
        return PipelineConfig.model_validate(
            {
                "pipeline_id": "test-pipeline",
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


class TcpProxy:
    """A loopback TCP forwarder that can be down (connections refused) or up: stands in for
    an unreachable broker or group coordinator."""

    def __init__(self, target: str) -> None:
        import socket

        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._server: object | None = None
        self._sockets: list[object] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        import socket
        import threading

        server = socket.create_server(("127.0.0.1", self.port))
        self._server = server

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.close()
                    except OSError:
                        pass

        def accept() -> None:
            while True:
                try:
                    client, _ = server.accept()
                except OSError:
                    return
                upstream = socket.create_connection(self.target)
                self._sockets += [client, upstream]
                threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
                threading.Thread(target=pump, args=(upstream, client), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()

    def stop(self) -> None:
        for sock in [self._server, *self._sockets]:
            if sock is not None:
                try:
                    sock.close()  # type: ignore[attr-defined]
                except OSError:
                    pass
        self._server, self._sockets = None, []


@pytest.fixture
def tcp_proxy(kafka_bootstrap: str) -> Iterator[TcpProxy]:
    proxy = TcpProxy(kafka_bootstrap.split(",")[0])
    yield proxy
    proxy.stop()


# --- the development Schema Registry (devtools/registry.py) ---------------------------------


class SchemaRegistryProcess:
    """The local Schema Registry in its own process on a fixed loopback port, its state in a
    file: ``stop()`` then ``start()`` brings it back on the same URL with the same ids, which is
    how a test plays "registry down" and "registry up"."""

    def __init__(self, data_path: Path) -> None:
        from {{ cookiecutter.package_name }}.devtools.registry import LocalSchemaRegistry

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
    from {{ cookiecutter.package_name }}.devtools.object_store import LocalS3

    store = LocalS3(log_path=tmp_path_factory.mktemp("s3") / "moto.log").start()
    try:
        yield store
    finally:
        store.stop()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchemaRegistryProcess]:
    """The development Schema Registry on a free loopback port (``.url``), stopped by its pid
    at the end of the session; ``.stop()``, ``.start()`` and ``.down()`` for outage tests."""
    from {{ cookiecutter.package_name }}.devtools.registry import RegistryError

    registry = SchemaRegistryProcess(tmp_path_factory.mktemp("schema-registry") / "state.json")
    try:
        registry.start()
    except RegistryError as exc:
        pytest.skip(f"no schema registry: {exc}")
    try:
        yield registry
    finally:
        registry.stop()
