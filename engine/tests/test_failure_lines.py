"""A run that fails inside Spark ends with one line a person can act on: the Python error that
ended it (type and message, not the JVM's ``PythonException: An exception was thrown from the
Python worker:``) and whose it is (the transform, the decoder, Kafka, the sink); the traces stay
in the log. Each check runs the project's command as a process on a real broker."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kafka_delta.runtime.task_errors import describe
from kafka_delta_dev.produce import event, produce_values
from support import PACKAGE, PROJECT, project_env

BOOM_TRANSFORM = """
from pyspark.sql import functions as F
from pyspark.sql.types import LongType


@F.udf(LongType())
def _explode(offset):
    raise ValueError("boom")


def transform(df):
    return df.withColumn("exploded", _explode("offset"))
"""


def _config(tmp_path: Path, bootstrap: str, topic: str, transform: str) -> Path:
    conf = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text(encoding="utf-8"))
    conf["delta"]["table"] = str(tmp_path / "table")
    conf["dead_letters"]["table"] = str(tmp_path / "dead_letters")
    conf["checkpoint"] = str(tmp_path / "checkpoint")
    conf["decoding"]["value"]["schema_file"] = str(PROJECT / "schemas" / "order_event.ddl")
    conf["kafka"]["bootstrap_servers"] = bootstrap
    conf["kafka"]["topics"] = [topic]
    conf["transform"] = transform
    conf["progress"]["path"] = None
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(conf), encoding="utf-8")
    return path


@pytest.mark.spark
@pytest.mark.broker
def test_an_exception_in_the_transforms_udf_ends_the_run_with_its_type_message_and_origin(
    tmp_path: Path, kafka_bootstrap: str, new_topics
) -> None:
    (topic,) = new_topics(1, partitions=1)
    rng = random.Random(0)
    produce_values(kafka_bootstrap, topic, [(0, event(i, rng)) for i in range(5)])
    code = tmp_path / "code"
    code.mkdir()
    (code / "boom_transform.py").write_text(BOOM_TRANSFORM, encoding="utf-8")
    config = _config(tmp_path, kafka_bootstrap, topic, "boom_transform:transform")
    env = project_env()
    env["PYTHONPATH"] = f"{code}:{env['PYTHONPATH']}"

    run = subprocess.run(
        [sys.executable, "-m", PACKAGE, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PROJECT,
        env=env,
    )

    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1, run.stderr[-3000:]
    assert last.endswith(
        "ERROR kafka_delta.cli: pipeline orders-stream failed: ValueError: boom, raised in the "
        "transform (boom_transform.py line 8, in _explode) (--log-level DEBUG shows the whole "
        "failure)"
    ), run.stderr[-3000:]
    # The traces stay in the log above it: the worker's traceback, as Spark logged it.
    assert 'raise ValueError("boom")' in run.stderr


@pytest.mark.spark
def test_an_error_in_a_task_is_named_by_its_python_type_message_and_the_engine_part_it_came_from(
    spark,
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    # Local functions: Spark's workers get them by value (they cannot import a test module).
    def _bad_frame(value):
        # The decoder's own code, raising in a task: a message index that is not a varint.
        from kafka_delta.decoding.wire_format import _varint

        return _varint(b"\x80", 0)[0] + value

    def _chained(value):
        try:
            return _bad_frame(value)
        except ValueError as exc:
            raise KeyError(f"record {value}") from exc

    with pytest.raises(Exception) as failed:
        spark.range(1).select(F.udf(_bad_frame, LongType())("id")).collect()
    text = describe(failed.value, transform=None)
    assert text is not None and text.startswith(
        "ValueError: the message indexes end before the record does, raised in the decoder "
        "(kafka_delta/decoding/wire_format.py line "
    ), text
    assert text.endswith(", in _varint)"), text
    # A transform the engine ships is told by its own module: the decoder's frame is not its.
    shipped = describe(failed.value, transform="kafka_delta.contract:passthrough")
    assert shipped is not None and ", raised in the decoder (" in shipped, shipped
    # Spark's own text says nothing after its colon.
    assert str(failed.value).splitlines()[0].rstrip().endswith("Python worker:")

    # A chained error: the one raised last (the outermost) is the one the run failed with.
    with pytest.raises(Exception) as failed:
        spark.range(1).select(F.udf(_chained, LongType())("id")).collect()
    text = describe(failed.value, transform="test_failure_lines:anything")
    assert text is not None and text.startswith("KeyError: 'record 0', raised in the transform")
    assert "test_failure_lines.py line " in text and text.endswith(", in _chained)"), text


@pytest.mark.spark
@pytest.mark.broker
def test_a_read_task_that_finds_no_records_where_the_plan_said_is_named_as_kafkas(
    spark, kafka_bootstrap, new_topics
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    (topic,) = new_topics(1, partitions=1)  # empty: offsets 0-4 were never written

    def read(value):
        from kafka_delta.sources.kafka_datasource import OffsetRange, read_range

        conf = (("bootstrap.servers", kafka_bootstrap),)
        return sum(b.num_rows for b in read_range(OffsetRange(topic, 0, 0, 5, conf, 1000)))

    with pytest.raises(Exception) as failed:
        spark.range(1).select(F.udf(read, LongType())("id")).collect()
    text = describe(failed.value, transform="orders_stream.transform:transform")
    assert text is not None and text.startswith(
        f"TimeoutError: {topic}[0]: no records between offsets 0 and 5 within 1000 ms, although "
        "the plan said they exist (the broker says the partition ends at 0), raised reading "
        "Kafka (kafka_delta/sources/kafka_datasource.py line "
    ), text
    assert text.endswith(", in read_range)"), text


def test_an_error_raised_on_the_driver_is_named_with_its_own_frames() -> None:
    from kafka_delta.commands.reset import parse_offsets_spec

    with pytest.raises(Exception) as failed:
        parse_offsets_spec("orders:0=x")
    text = describe(failed.value, transform=None)
    assert text is not None and text.startswith(
        "CommandError: --to-offsets: 'orders:0=x' is not TOPIC:PARTITION=OFFSET"
    ), text


CONNECT = """
import sys

from pyspark.sql import SparkSession, functions as F
from pyspark.sql.types import LongType

from kafka_delta.runtime.task_errors import describe

spark = SparkSession.builder.remote("local[1]").config("spark.ui.enabled", "false").getOrCreate()


def explode(value):
    raise ValueError("boom")


try:
    spark.range(1).select(F.udf(explode, LongType())("id")).collect()
except Exception as exc:
    print(type(exc).__module__)
    print(describe(exc, transform=None))
spark.stop()
"""


@pytest.mark.spark
def test_under_spark_connect_the_same_line_is_read_from_the_message() -> None:
    # Spark Connect's exception classes are others (pyspark.errors.exceptions.connect), with
    # the worker's traceback in the message too: the text decides, never the class.
    pytest.importorskip("grpc_status", reason="Spark Connect's client needs grpcio-status")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17: java is not on PATH and JAVA_HOME is unset")
    run = subprocess.run(
        [sys.executable, "-c", CONNECT],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    module, line = run.stdout.strip().splitlines()[-2:]
    assert module == "pyspark.errors.exceptions.connect", run.stdout
    assert line.startswith("ValueError: boom, raised at <string> line "), run.stdout
    assert line.endswith(", in explode"), run.stdout
