"""The Spark session a plain ``python -m`` run starts (runtime/spark_session.py), in a real JVM:
the driver options a project's config sets join the engine's (its log configuration, the class
archive) instead of replacing them; its Parquet is what every Delta reader reads (timestamps as
INT64 microseconds, not Spark's INT96)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kafka_delta_dev.pytest_plugin import NEEDS_JAVA, NO_JAVA

RUN = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from kafka_delta.config import PipelineConfig
    from kafka_delta.runtime.spark_session import build_spark

    settings, log4j = json.loads(sys.argv[1]), Path(sys.argv[2])
    spark = build_spark(PipelineConfig.model_validate(settings), log4j)
    system = spark.sparkContext._jvm.java.lang.System
    print(json.dumps({
        "master": spark.sparkContext.master,
        **{
            name: system.getProperty(name)
            for name in ("kafka_delta.own", "log4j2.configurationFile")
        },
        **{
            name: spark.conf.get(name)
            for name in (
                "spark.sql.parquet.outputTimestampType",
                "spark.sql.parquet.datetimeRebaseModeInWrite",
            )
        },
    }))
    spark.stop()
    """
)


def _build(tmp_path: Path, conf: dict[str, str]) -> dict[str, str]:
    """What the session build_spark starts in a process of its own says (RUN)."""
    log4j = tmp_path / "log4j2.properties"
    log4j.write_text("rootLogger.level = error\n")
    settings = {
        "pipeline_id": "p",
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["t"], "consumer_group": "g"},
        "delta": {"table": str(tmp_path / "table")},
        "checkpoint": str(tmp_path / "checkpoint"),
        "spark": {"master": "local[1]", "conf": {"spark.ui.enabled": "false", **conf}},
    }
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS")}
    run = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(settings), str(log4j)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(NO_JAVA, reason=NEEDS_JAVA)
def test_the_configs_driver_options_join_the_engines_and_win_where_both_set_one(
    tmp_path: Path,
) -> None:
    seen = _build(tmp_path, {"spark.driver.extraJavaOptions": "-Dkafka_delta.own=kept"})
    # A plain run (no spark-submit, no session before it) takes the config's master.
    assert seen["master"] == "local[1]"
    # The project's own option, and the engine's log configuration beside it.
    assert seen["kafka_delta.own"] == "kept"
    assert seen["log4j2.configurationFile"] == f"file:{(tmp_path / 'log4j2.properties').resolve()}"


@pytest.mark.skipif(NO_JAVA, reason=NEEDS_JAVA)
def test_the_session_writes_parquet_timestamps_every_delta_reader_reads(tmp_path: Path) -> None:
    """Spark's default is INT96, which deltalake cannot read outside 1677-2262; a conf the
    project's config sets is its own."""
    seen = _build(tmp_path, {"spark.sql.parquet.datetimeRebaseModeInWrite": "LEGACY"})
    assert seen["spark.sql.parquet.outputTimestampType"] == "TIMESTAMP_MICROS"
    assert seen["spark.sql.parquet.datetimeRebaseModeInWrite"] == "LEGACY"


@pytest.mark.skipif(NO_JAVA, reason=NEEDS_JAVA)
def test_a_run_submitted_with_a_master_runs_on_it_not_on_the_configs(tmp_path: Path) -> None:
    """spark-submit's --master wins over the config's spark.master (local[1] here against the
    config's local[2]): under spark-submit, SparkConf says nothing of the master before the
    session exists, and a run that asked it ran on the config's master instead."""
    seen = _submitted(tmp_path, ["--master", "local[1]"], {"spark.master": "local[2]"})
    assert seen["master"] == "local[1]"


def _submitted(tmp_path: Path, options: list[str], spark: dict[str, str]) -> dict[str, str]:
    """What build_spark's session says in a process spark-submit started with ``options``, on
    a config whose ``spark:`` section is ``spark``."""
    log4j = tmp_path / "log4j2.properties"
    log4j.write_text("rootLogger.level = error\n")
    script = tmp_path / "run.py"
    script.write_text(RUN)
    settings = {
        "pipeline_id": "p",
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["t"], "consumer_group": "g"},
        "delta": {"table": str(tmp_path / "table")},
        "checkpoint": str(tmp_path / "checkpoint"),
        "spark": {"master": spark["spark.master"], "conf": {"spark.ui.enabled": "false"}},
    }
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    submit = Path(sys.executable).parent / "spark-submit"
    run = subprocess.run(
        [str(submit), *options, str(script), json.dumps(settings), str(log4j)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
