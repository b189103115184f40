"""The first batch's Python workers are started while the stream is set up
(:mod:`kafka_delta.runtime.python_workers`): the modules warmed are imported in the very workers
Spark then reuses, every module an engine names exists, and a failed warm-up changes nothing."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from kafka_delta.config import KafkaConfig
from kafka_delta.decoding.spec import DecodeSpec, FieldSpec, RegistrySettings
from kafka_delta.runtime.python_workers import warm_up
from kafka_delta.sinks.delta_rs.sink import DeltaRsSink
from kafka_delta.sources.embedded import EmbeddedSource
from kafka_delta.sources.spark_kafka import SparkKafkaSource
from kafka_delta_dev.pytest_plugin import NEEDS_JAVA, NO_JAVA

pytestmark = pytest.mark.spark

# A standard-library module nothing in Spark, this project or its tests imports: it is in a
# worker only if the warm-up put it there.
PROBE = "colorsys"


# A fresh session, as a run's, whose only idle Python workers are the first probe's, one per
# core (it runs before the warm-up, so the probe is not vacuous). The suite's shared session
# would not do: Spark keeps idle Python workers in a FIFO queue (PythonWorkerFactory), so after
# earlier tests left more idle workers than cores, the probe's tasks would take ones the warm-up
# never touched.
FRESH_SESSION = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from kafka_delta.runtime.python_workers import warm_up

    module = sys.argv[1]
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    tasks = spark.sparkContext.defaultParallelism

    def imported() -> list:
        def probe(batches):
            for batch in batches:
                present = [module in sys.modules] * batch.num_rows
                yield pa.RecordBatch.from_pydict({"imported": present})

        frame = spark.range(0, tasks, 1, tasks).mapInArrow(probe, "imported boolean")
        return [row.imported for row in frame.collect()]

    before = imported()
    thread = warm_up(spark, [module])
    thread.join(timeout=120)
    print(json.dumps({
        "reuse": spark.sparkContext.getConf().get("spark.python.worker.reuse", "true"),
        "tasks": tasks,
        "before": before,
        "alive": thread.is_alive(),
        "after": imported(),
    }))
    spark.stop()
    """
)


@pytest.mark.skipif(NO_JAVA, reason=NEEDS_JAVA)
def test_the_warmed_modules_are_imported_in_the_workers_the_next_tasks_reuse(tmp_path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", FRESH_SESSION, PROBE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])

    assert seen["reuse"] == "true" and seen["tasks"] >= 2, seen
    assert not any(seen["before"]), seen  # the probe is not vacuous
    assert not seen["alive"], seen
    assert seen["after"] == [True] * seen["tasks"], seen


def test_a_warm_up_that_fails_is_ignored(spark, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="kafka_delta.runtime.python_workers"):
        thread = warm_up(spark, ["no_such_module_anywhere"])
        assert thread is not None
        thread.join(timeout=120)
    assert any("warming the Python workers failed" in r.getMessage() for r in caplog.records)
    assert warm_up(spark, []) is None  # nothing to warm: no job
    assert spark.range(3).count() == 3  # the session is untouched


def test_every_module_an_engine_warms_exists() -> None:
    # A renamed module would make the warm-up fail quietly (and the first batch slow again).
    order = pa.schema([pa.field("id", pa.int64())])
    spec = DecodeSpec(
        FieldSpec("avro", "confluent", order),
        key=FieldSpec("protobuf", "confluent", order, message="Key"),
        registry=RegistrySettings("http://127.0.0.1:1"),
    )
    kafka = KafkaConfig(bootstrap_servers="127.0.0.1:1", topics=("t",), consumer_group="g")
    names = {
        *EmbeddedSource(kafka).worker_modules(spec),
        *EmbeddedSource(kafka).worker_modules(DecodeSpec(FieldSpec("json", "none", order))),
        *SparkKafkaSource(kafka).worker_modules(spec),
        *DeltaRsSink("/tmp/unused", "p").worker_modules(),
    }
    assert {
        "kafka_delta.sources.kafka_datasource",
        "kafka_delta.sinks.delta_rs.file_writer",
        "kafka_delta.decoding.avro_decoder",
        "kafka_delta.decoding.protobuf_decoder",
        "kafka_delta.decoding.json_decoder",
        "kafka_delta.decoding.schema_registry",
        "confluent_kafka",
    } <= names
    for name in names:
        importlib.import_module(name)
    assert EmbeddedSource(kafka).worker_modules(None) == (
        "confluent_kafka",
        "kafka_delta.sources.kafka_datasource",
    )
    assert SparkKafkaSource(kafka).worker_modules(None) == ()
