"""The pipeline on Spark Connect, as Databricks serverless jobs and standard access compute run
it: the process holds a Connect client (no SparkContext, no JVM), and ``foreachBatch`` runs the
batch function in a Python process the server starts.

The server is pyspark's own (:mod:`kafka_delta_dev.connect_server`), in a process of its own on
loopback. What this file proves, on the embedded engine and the stand-in of Spark's kafka source,
against the real broker and real tables:

- a run lands every record exactly once, and the run's own process still receives every batch
  (its figures, the progress listeners, the commit-back hook: I4) from the server's process;
- a crash after the Delta commit replays as a no-op through Connect (I1, I2);
- the run's compaction runs in a session of its own, so it never commits with the txn and record
  a batch's MERGE sets as confs of the session the batch shares with the run;
- the command line runs on a Connect server named by ``SPARK_REMOTE`` (``spark.remote`` in the
  config does the same), and stops with one sentence where the compute refuses its trigger;
- the whole contract suite passes through Connect (``SPARK_REMOTE=local[2]``), in a pytest of its
  own whose process, at the end, holds no classic SparkContext; this file's Connect tests run
  there too (pyspark refuses a Connect session beside the suite's classic one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import STANDIN
from kafka_delta.pipeline import Pipeline
from kafka_delta.runtime.run_loop import TriggerNotSupportedError, trigger_refused
from kafka_delta.runtime.spark_session import default_parallelism, is_connect
from kafka_delta_dev.produce import produce_events
from kafka_delta_dev.pytest_plugin import JARS_DIR
from support import REPO, assert_exactly_once, assert_offsets_agree, forget_last_spark_commit

pytestmark = [pytest.mark.spark, pytest.mark.broker]


# pyspark refuses a Connect session in a process that holds a classic one (the suite's usual
# `spark`): these tests run where the suite itself runs through Connect, which the last test of
# this file starts in a process of its own (SPARK_REMOTE=local[2]).
THROUGH_CONNECT = bool(os.environ.get("SPARK_REMOTE"))
through_connect = pytest.mark.skipif(
    not THROUGH_CONNECT,
    reason="runs in the suite through Spark Connect (SPARK_REMOTE=local[2]), which "
    "test_the_engine_contract_passes_through_spark_connect starts",
)


@pytest.fixture
def connect(spark):
    assert is_connect(spark)
    return spark


class Collect:
    """A progress listener that keeps what it is given."""

    def __init__(self) -> None:
        self.batches: list = []

    def on_batch(self, progress) -> None:
        self.batches.append(progress)

    def on_run_end(self, commit_back) -> None:
        pass

    def close(self) -> None:
        pass


@through_connect
@pytest.mark.parametrize("source", ["embedded", "standin"])
def test_a_run_on_spark_connect_lands_exactly_once_and_reports_each_batch_to_its_process(
    connect, kafka_bootstrap, new_topics, make_config, source
) -> None:
    assert is_connect(connect)
    with pytest.raises(Exception):  # noqa: B017 (Connect raises its own class)
        _ = connect.sparkContext
    topics = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, topics, 1200)
    engine = {"source": "embedded" if source == "embedded" else STANDIN, "sink": "delta_rs"}
    cfg = make_config(topics, engine=engine, max_records_per_trigger=300)
    listener = Collect()

    summary = Pipeline(connect, cfg, listeners=[listener]).run()

    assert_exactly_once(cfg, 1200)
    assert_offsets_agree(cfg)  # the group holds the table's offsets (I4), from this process
    assert summary.batches == len(listener.batches) >= 4
    assert summary.rows_written == sum(p.rows_written for p in listener.batches) == 1200
    assert [p.batch_id for p in listener.batches] == sorted(p.batch_id for p in listener.batches)
    assert summary.commit_back is not None and summary.commit_back.failed == 0
    assert summary.commit_back.succeeded >= 1
    # The reports the server's process posted were taken, and none is left behind.
    assert not list(Path(cfg.checkpoint, "_kafka_delta", "batches").glob("*/*.json"))


@through_connect
def test_a_crash_after_the_delta_commit_replays_as_a_no_op_through_connect(
    connect, kafka_bootstrap, new_topics, make_config
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 400)
    cfg = make_config(topics, max_records_per_trigger=150)
    Pipeline(connect, cfg).run()

    forget_last_spark_commit(cfg)
    summary = Pipeline(connect, cfg).run()

    assert summary.replayed_batches == 1 and summary.rows_written == 0
    produce_events(kafka_bootstrap, topics, 100, first_id=400)
    Pipeline(connect, cfg).run()
    assert_exactly_once(cfg, 500)
    assert_offsets_agree(cfg)


@through_connect
def test_the_runs_compaction_has_a_session_of_its_own_beside_the_batches_merge(
    connect, kafka_bootstrap, new_topics, make_config
) -> None:
    """Here the batch's MERGE sets its txn confs in the client's session, the one the run is
    given: the run's compaction clones it (Connect's cloneSession), so its OPTIMIZE commits
    without them (test_run_compaction.py proves the same on a classic session)."""
    from test_run_compaction import (
        test_the_runs_compaction_never_commits_with_the_txn_and_record_of_a_batchs_merge as check,
    )

    check(connect, kafka_bootstrap, new_topics, make_config)


@through_connect
def test_default_parallelism_on_connect_is_the_local_masters_cores(connect) -> None:
    assert default_parallelism(connect) == 2  # local[2], without a SparkContext to ask


@through_connect
def test_the_command_line_runs_on_the_connect_server_spark_remote_names(
    connect, kafka_bootstrap, new_topics, make_config, tmp_path: Path
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 300)
    cfg = make_config(topics, max_records_per_trigger=100)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")), encoding="utf-8")

    result = subprocess.run(
        [sys.executable, "-m", "kafka_delta", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),  # SPARK_REMOTE: the suite's server
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert "batches=3 " in result.stderr and "rows=300 " in result.stderr, result.stderr[-2000:]
    assert_exactly_once(cfg, 300)
    assert_offsets_agree(cfg)


def test_a_processing_time_trigger_the_compute_refuses_stops_with_one_sentence() -> None:
    # Databricks serverless's refusal (its error class and message, as its docs give them).
    refusal = RuntimeError(
        "[INFINITE_STREAMING_TRIGGER_NOT_SUPPORTED] Trigger type ProcessingTime is not "
        "supported for this cluster type. Use a different trigger type e.g. AvailableNow, "
        "Once. SQLSTATE: 0A000"
    )
    sentence = trigger_refused(refusal, "processing_time")
    assert sentence is not None and "available_now" in sentence and "\n" not in sentence
    assert trigger_refused(refusal, "available_now") is None
    assert trigger_refused(RuntimeError("something else"), "processing_time") is None

    from kafka_delta.cli import EXIT_REFUSED, _failed

    assert _failed("p", TriggerNotSupportedError(sentence)) == EXIT_REFUSED


def test_the_engine_contract_passes_through_spark_connect(tmp_path: Path) -> None:
    """The contract suite and this file in a pytest of their own with
    ``SPARK_REMOTE=local[2]``: its spark fixture is a Connect session to a server in another
    process (the plugin checks, as the session ends, that the process made no classic
    SparkContext). Where the connector jars are at hand, Spark's kafka source itself runs
    through the server (the contract collects its stand-in only where they cannot be had)."""
    chosen = "not passes_through_spark_connect"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            "--basetemp",
            str(tmp_path / "t"),
            "-k",
            chosen,
            str(Path(__file__).with_name("test_engine_contract.py")),
            __file__,
        ],
        capture_output=True,
        text=True,
        timeout=2400,
        cwd=REPO,
        env={**os.environ, "SPARK_REMOTE": "local[2]"},
    )
    tail = result.stdout[-4000:]
    assert result.returncode == 0, tail
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    # Every skip is for connector jars: nothing of the embedded engine or the stand-in skipped;
    # where this machine has the jars (Maven's cache), none: the cluster engine and the
    # delta-spark sink ran through the Connect server too, which holds Delta's jars and session
    # extension but no Delta Connect plugin (the engine reaches Delta through Spark SQL alone).
    skips = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("jars not on the classpath" in line for line in skips), skips
    if JARS_DIR:
        assert skips == [], skips


def test_a_connect_server_that_is_down_stops_the_run_at_once_with_one_sentence(
    kafka_bootstrap, new_topics, make_config, tmp_path: Path
) -> None:
    # A port nobody listens on: pyspark's own client would retry for minutes.
    from kafka_delta_dev.children import free_port

    (topic,) = new_topics(1, partitions=1)
    cfg = make_config([topic])
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")), encoding="utf-8")
    remote = f"sc://127.0.0.1:{free_port()}"

    result = subprocess.run(
        [sys.executable, "-m", "kafka_delta", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SPARK_REMOTE": remote},
    )

    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert f"cannot reach the Spark Connect server at {remote}" in line
    assert "Connection refused" in line
    assert not Path(cfg.delta.table).exists() and not Path(cfg.checkpoint).exists()
