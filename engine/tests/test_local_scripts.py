"""The local run scripts with connector jars from a folder (KAFKA_DELTA_JARS, no Maven access):
scripts/run_local.sh runs the embedded source with the delta-spark sink through a real
spark-submit, and scripts/run_cluster_local.sh, which forces Spark's kafka source, says at once
when the folder lacks that source's jars."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from kafka_delta.runtime.connectors import connector_packages
from kafka_delta_dev.produce import produce_events
from kafka_delta_dev.pytest_plugin import JARS_DIR, WITH_CONNECTORS, connector_skip_reason
from support import PROJECT, assert_exactly_once

RECORDS = 300


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_DELTA_", "PYTHONPATH"))}
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        **extra,
    )
    return env


def _config(tmp_path: Path, bootstrap: str, topic: str, engine: object) -> Path:
    conf = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text(encoding="utf-8"))
    conf["engine"] = engine
    conf["kafka"].update(
        bootstrap_servers=bootstrap, topics=[topic], consumer_group=f"g-{uuid.uuid4().hex[:10]}"
    )
    conf["kafka"]["max_records_per_trigger"] = 100
    conf["delta"]["table"] = str(tmp_path / "table")
    conf["dead_letters"]["table"] = str(tmp_path / "dead_letters")
    conf["checkpoint"] = str(tmp_path / "checkpoint")
    # The config moves out of the project: its schema file is named where it is.
    conf["decoding"]["value"]["schema_file"] = str(PROJECT / "schemas" / "order_event.ddl")
    path = tmp_path / "conf" / "local.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(conf), encoding="utf-8")
    return path


@pytest.mark.broker
def test_run_local_with_a_jar_folder_writes_through_the_delta_spark_sink(
    kafka_bootstrap, new_topics, tmp_path: Path
) -> None:
    if JARS_DIR:
        connectors = {"KAFKA_DELTA_JARS": JARS_DIR}
    elif WITH_CONNECTORS:  # Maven access: the same run, delta-spark fetched instead
        connectors = {"SPARK_SUBMIT_EXTRA": f"--packages {connector_packages()[0]}"}
    else:
        pytest.skip(connector_skip_reason(["delta-spark"]))
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], RECORDS)
    mix = {"source": "embedded", "sink": "delta_spark"}
    config = _config(tmp_path, kafka_bootstrap, topic, mix)
    if WITH_CONNECTORS and not JARS_DIR:
        extensions = (
            " --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension"
            " --conf spark.sql.catalog.spark_catalog="
            "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        connectors["SPARK_SUBMIT_EXTRA"] += extensions

    run = subprocess.run(
        [str(PROJECT / "scripts" / "run_local.sh"), "--config", str(config)],
        cwd=PROJECT,
        env=_env(**connectors),
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert run.returncode == 0, run.stderr[-4000:]
    if JARS_DIR:
        assert f"connector jars from {JARS_DIR} on --jars" in run.stderr
    cfg_table = str(tmp_path / "table")
    history = DeltaTable(cfg_table).history()
    # delta-spark wrote it: its commits name Spark's engine, delta-rs's name delta-rs.
    writes = [c for c in history if c.get("operation") in {"WRITE", "STREAMING UPDATE"}]
    assert writes and all("Apache-Spark" in str(c.get("engineInfo", "")) for c in writes), writes
    assert len(writes) >= RECORDS // 100  # one commit per micro-batch of 100 records

    from kafka_delta.config import load_config

    assert_exactly_once(load_config(config), RECORDS)


def test_run_cluster_local_with_delta_jars_alone_says_the_kafka_source_jars_are_missing(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "jars"
    folder.mkdir()
    (folder / "delta-spark_2.13-4.4.0.jar").touch()  # never opened: the check comes first

    run = subprocess.run(
        [str(PROJECT / "scripts" / "run_cluster_local.sh")],
        cwd=PROJECT,
        env=_env(KAFKA_DELTA_JARS=str(folder)),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr  # one sentence, before Spark starts
    assert "Spark's kafka source" in lines[0] and "spark-sql-kafka-0-10" in lines[0]
    assert f"KAFKA_DELTA_JARS={folder} scripts/run_local.sh" in lines[0]
    assert "sink: delta_spark" in lines[0]


def test_run_local_refuses_a_jar_folder_that_is_missing_or_empty(tmp_path: Path) -> None:
    for folder, says in ((tmp_path / "nope", "is not a folder"), (tmp_path, "holds no .jar file")):
        run = subprocess.run(
            [str(PROJECT / "scripts" / "run_local.sh"), "--help"],
            cwd=PROJECT,
            env=_env(KAFKA_DELTA_JARS=str(folder)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 2 and says in run.stderr, run.stderr


@pytest.mark.parametrize(
    "master",
    [
        {"SPARK_MASTER": "spark://127.0.0.1:7077"},
        {"SPARK_SUBMIT_EXTRA": "--conf spark.ui.enabled=false --master spark://127.0.0.1:7077"},
        {"SPARK_SUBMIT_EXTRA": "--master=yarn"},
    ],
    ids=["SPARK_MASTER", "--master", "--master="],
)
def test_run_local_refuses_a_clusters_master_naming_submit(master: dict[str, str]) -> None:
    # It ships nothing to a cluster's executors: a UDF calling the project's module failed
    # there with ModuleNotFoundError. One sentence, before Spark starts.
    run = subprocess.run(
        [str(PROJECT / "scripts" / "run_local.sh"), "--help"],
        cwd=PROJECT,
        env=_env(**master),
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    target = "yarn" if "yarn" in str(master) else "spark://127.0.0.1:7077"
    assert lines[0] == (
        f"error: master {target} is a cluster's, and scripts/run_local.sh ships nothing to its "
        f"executors: run scripts/submit.sh --master {target}, which ships this project and the "
        "engine"
    )


def test_run_local_with_a_local_master_in_spark_submit_extra_is_not_refused() -> None:
    run = subprocess.run(
        [str(PROJECT / "scripts" / "run_local.sh"), "--help"],
        cwd=PROJECT,
        env=_env(SPARK_SUBMIT_EXTRA="--master local[1]"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "--bootstrap-servers" in run.stdout, run.stderr[-2000:]


def test_run_local_refuses_an_abbreviated_option_instead_of_overriding_it(tmp_path: Path) -> None:
    # The script adds the address of the broker scripts/broker.sh started (.broker.json) unless
    # --bootstrap-servers is given: argparse taking `--bootstrap-server` for it let that address
    # silently win. A project of its own (its scripts, links to the rest) holds the state file.
    from kafka_delta_dev.broker import dev_broker

    project = tmp_path / "project"
    project.mkdir()
    for name in ("scripts", "conf"):
        shutil.copytree(PROJECT / name, project / name)
    for name in ("src", "schemas"):
        (project / name).symlink_to(PROJECT / name)
    with dev_broker() as broker:
        state = {
            "pid": broker.pid(),
            "kind": broker.kind,
            "bootstrap_servers": broker.bootstrap_servers,
        }
        (project / ".broker.json").write_text(json.dumps(state), encoding="utf-8")
        run = subprocess.run(
            [str(project / "scripts" / "run_local.sh"), "--bootstrap-server", "127.0.0.1:1"],
            cwd=project,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    # spark-submit passes the Python driver's stderr on to its stdout
    said = run.stdout + run.stderr
    assert run.returncode == 2, said[-2000:]
    assert "error: unrecognized arguments: --bootstrap-server 127.0.0.1:1" in said, said
