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

from {{ cookiecutter.package_name }}.config import PipelineConfig  # noqa: E402


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17: java is not on PATH and JAVA_HOME is unset")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


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

    def make(topics: list[str], **kafka: object) -> PipelineConfig:
        return PipelineConfig.model_validate(
            {
                "pipeline_id": "test-pipeline",
                "kafka": {
                    "bootstrap_servers": kafka_bootstrap,
                    "topics": topics,
                    "consumer_group": f"g-{uuid.uuid4().hex[:10]}",
                    "client": {"fetch.wait.max.ms": 100},
                    **kafka,
                },
                "delta": {"table": str(tmp_path / "table")},
                "checkpoint": str(tmp_path / "checkpoint"),
                "commit_back": {"timeout_seconds": 10},
            }
        )

    return make
