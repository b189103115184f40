"""Kafka outages during a run (kafka.unavailable_timeout_seconds, kafka/outage.py): a broker
that stops answering is waited out, nothing is committed meanwhile, and every record lands
exactly once; a broker that stays away ends the run with one sentence naming it (exit 4).

The same holds for Spark's kafka source (the cluster engine), whose Java Kafka client fails with
its own timeouts instead (kafka_delta.kafka.outage.kafka_down takes them for the outage).

Each test pauses (SIGSTOP) or kills a broker of its own: the session's broker is shared by the
worker's other tests."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from conftest import engine_config, skip_without_connectors
from kafka_delta.cli import EXIT_UNAVAILABLE, _failed
from kafka_delta.config import PipelineConfig
from kafka_delta.kafka.admin import KafkaAdmin, KafkaUnavailableError, total_lag
from kafka_delta.kafka.outage import kafka_down
from kafka_delta.pipeline import Pipeline
from kafka_delta.sources.kafka_datasource import OffsetRange, read_range
from kafka_delta_dev.broker import Broker, BrokerError, dev_broker, start_broker
from kafka_delta_dev.orders import TRANSFORM as ORDERS
from kafka_delta_dev.produce import ensure_topics, produce_events
from kafka_delta_dev.pytest_plugin import connector_conf
from support import assert_exactly_once, table_ids

# The pause a run rides out here: longer than a metadata request's 30 s, which the run used to
# give up after. By hand: KAFKA_DELTA_OUTAGE_PAUSE_S=120 (the run then waits as long).
PAUSE_S = float(os.environ.get("KAFKA_DELTA_OUTAGE_PAUSE_S", "45"))


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Broker]:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        pytest.skip("pauses a broker process of its own: needs the development broker")
    try:
        broker = start_broker(dev_broker(folder=tmp_path / "kafka"))
    except BrokerError as exc:
        pytest.skip(f"no Kafka broker: {exc}")
    assert broker.process is not None
    try:
        yield broker
    finally:
        if broker.process.poll() is None:
            os.kill(broker.process.pid, signal.SIGCONT)  # a stopped process ignores SIGTERM
        broker.stop()


def _wait_for(what: str, done: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``done()``; fails naming ``what`` after ``timeout_s``."""
    started = time.monotonic()
    while not done():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.5)
    return time.monotonic() - started


def _rows(cfg: PipelineConfig) -> int:
    try:
        return sum(table_ids(cfg).values())
    except Exception:  # no table yet
        return 0


# -- the read task ---------------------------------------------------------------------------


@pytest.mark.parametrize("outage", ["paused", "killed"])
def test_a_read_task_whose_broker_stops_answering_says_kafka_is_unavailable_naming_it(
    own_broker: Broker, outage: str
) -> None:
    """It used to say "no records ... although the plan said they exist" (paused), or fail at
    the first transport error (killed): neither names Kafka, and the run did not wait."""
    bootstrap = own_broker.bootstrap_servers
    topic = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topics(bootstrap, [topic], 1)
    produce_events(bootstrap, [topic], 10)
    assert own_broker.process is not None
    if outage == "paused":
        os.kill(own_broker.process.pid, signal.SIGSTOP)
    else:
        own_broker.process.kill()
        own_broker.process.wait(10)
    task = OffsetRange(topic, 0, 0, 10, (("bootstrap.servers", bootstrap),), 3000)

    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError) as raised:
        list(read_range(task))
    took = time.monotonic() - started

    assert str(raised.value).startswith(
        f"Kafka at {bootstrap} delivered no records of {topic}[0] from offset 0 "
        "(the batch reads to 10) within 3 s"
    ), raised.value
    assert 3 <= took < 15, took


def test_a_plan_past_the_end_the_broker_reports_is_not_an_outage(
    kafka_bootstrap: str, new_topics
) -> None:
    """A broker that answers, with fewer records than the plan says: the plan is wrong, and the
    run must not wait for Kafka to come back."""
    (topic,) = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, [topic], 10)
    task = OffsetRange(topic, 0, 0, 15, (("bootstrap.servers", kafka_bootstrap),), 2000)
    with pytest.raises(TimeoutError, match="although the plan said they exist") as raised:
        list(read_range(task))
    assert "(the broker says the partition ends at 10)" in str(raised.value), raised.value


# -- a continuous run --------------------------------------------------------------------------


def test_a_continuous_run_rides_out_a_paused_broker_and_stops_with_one_sentence_when_it_is_gone(
    spark, own_broker: Broker, tmp_path: Path, caplog, capsys
) -> None:
    """Records flow before and after a pause longer than a metadata request may take (the run
    used to stop 30 s into it): every record lands once, and the group ends with no lag. Then
    the broker is killed: the run retries for kafka.unavailable_timeout_seconds, commits
    nothing more, and stops with one sentence naming the broker, exit status 4."""
    bootstrap = own_broker.bootstrap_servers
    assert own_broker.process is not None
    pid = own_broker.process.pid
    topic = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topics(bootstrap, [topic], 2)
    cfg = PipelineConfig.model_validate(
        {
            "pipeline_id": "outage",
            "transform": ORDERS,
            "kafka": {
                "bootstrap_servers": bootstrap,
                "topics": [topic],
                "consumer_group": f"g-{uuid.uuid4().hex[:10]}",
                "client": {"fetch.wait.max.ms": 100},
                "max_records_per_trigger": 100,
                # Longer than the pause: a read in flight waits it out itself.
                "poll_timeout_seconds": PAUSE_S + 15,
                "unavailable_timeout_seconds": max(30.0, PAUSE_S),
            },
            "delta": {"table": str(tmp_path / "table")},
            "checkpoint": str(tmp_path / "checkpoint"),
            "trigger": {"mode": "processing_time", "interval_seconds": 1},
            "commit_back": {"timeout_seconds": 5},
        }
    )
    produce_events(bootstrap, [topic], 300)
    caplog.set_level(logging.WARNING, logger="kafka_delta.kafka.outage")
    pipeline = Pipeline(spark, cfg)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            pipeline.run()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        _wait_for("the first 300 records", lambda: _rows(cfg) >= 300 or bool(outcome), 120)
        assert not outcome, outcome

        os.kill(pid, signal.SIGSTOP)
        paused = time.monotonic()
        time.sleep(PAUSE_S)
        os.kill(pid, signal.SIGCONT)
        resumed = time.monotonic()
        produce_events(bootstrap, [topic], 300, first_id=300)
        caught_up = _wait_for(
            "the 300 records produced after the pause",
            lambda: _rows(cfg) >= 600 or bool(outcome),
            240,
        )
        assert not outcome, outcome
        admin = KafkaAdmin(cfg.kafka.client_config())
        partitions = admin.partitions([topic])

        def no_lag() -> bool:
            committed = admin.committed(cfg.kafka.consumer_group, partitions)
            return total_lag(admin.latest(partitions), committed) == 0

        _wait_for("the group's lag 0", no_lag, 60)
        assert_exactly_once(cfg, 600)
        attempts = [
            r.getMessage() for r in caplog.records if "Kafka is unavailable" in r.getMessage()
        ]
        assert attempts, "the pause was ridden out without a retry: it did not outlast a request"
        print(
            f"paused {resumed - paused:.0f} s; {len(attempts)} retries; caught up "
            f"{caught_up:.0f} s after the pause"
        )
        caplog.clear()

        version = DeltaTable(cfg.delta.table).version()
        own_broker.process.kill()
        own_broker.process.wait(10)
        killed = time.monotonic()
        runner.join(cfg.kafka.unavailable_timeout_seconds + 150)
        assert not runner.is_alive(), "the run did not stop"
        stopped = time.monotonic() - killed
    finally:
        pipeline.request_stop()
        runner.join(60)

    (error,) = outcome
    assert isinstance(error, KafkaUnavailableError), repr(error)
    sentence = str(error)
    assert sentence.startswith(f"Kafka at {bootstrap} did not answer for "), sentence
    assert "kafka.unavailable_timeout_seconds" in sentence and "\n" not in sentence
    assert cfg.kafka.unavailable_timeout_seconds <= stopped, stopped
    assert [r for r in caplog.records if "Kafka is unavailable" in r.getMessage()]
    capsys.readouterr()
    assert _failed(cfg.pipeline_id, error) == EXIT_UNAVAILABLE
    assert capsys.readouterr().err == f"error: {sentence}\n"
    # Nothing committed after the broker went: the table is the one of the last good batch.
    assert DeltaTable(cfg.delta.table).version() == version
    assert_exactly_once(cfg, 600)
    print(f"stopped {stopped:.0f} s after the broker was killed: {sentence}")


# -- Spark's kafka source (the cluster engine) -------------------------------------------------

# What the Java Kafka client of Spark's kafka source said in these outages (spark-sql-kafka
# 4.2.0, kafka-clients 3.9.2), as the driver got it: the driver's offset lookup between
# batches, and a read task's position lookup (inside the Py4J error of the batch function).
PLANNING_TIMED_OUT = (
    "[STREAM_FAILED] Query [id = f9712796-f94f-4ceb-bdf6-7d7f25b9b80b, runId = 8e05e2ef-45ab-"
    "4b18-a294-1d79a1625600] terminated with exception: org.apache.kafka.common.errors."
    "TimeoutException: Timed out waiting for a node assignment. Call: listNodes SQLSTATE: XXKST\n"
    "=== Streaming Query ===\n"
)
READ_TASK_TIMED_OUT = (
    "py4j.protocol.Py4JJavaError: An error occurred while calling o1234.save.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 "
    "failed 1 times, most recent failure: Lost task 0.0 in stage 0.0 (TID 0) (192.0.2.2 executor "
    "driver): org.apache.kafka.common.errors.TimeoutException: Timeout of 10000ms expired before "
    "the position for partition t-3576e1d6-0 could be determined\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages\n"
)


def test_the_java_clients_timeouts_are_an_outage_and_sparks_data_loss_verdict_is_not() -> None:
    """The texts the run decides by (the proofs with a real broker are below): a timeout of the
    Java client is the outage, in one line; a failure that says records are gone is never one,
    whatever it carries, as failOnDataLoss is a decision, not a wait (I5)."""
    assert kafka_down(RuntimeError(PLANNING_TIMED_OUT)) == (
        "Spark's kafka source: org.apache.kafka.common.errors.TimeoutException: Timed out "
        "waiting for a node assignment. Call: listNodes"
    )
    assert kafka_down(RuntimeError(READ_TASK_TIMED_OUT)) == (
        "Spark's kafka source: org.apache.kafka.common.errors.TimeoutException: Timeout of "
        "10000ms expired before the position for partition t-3576e1d6-0 could be determined"
    )
    polled = "java.util.concurrent.TimeoutException: Cannot fetch record for offset 7 in 5000 "
    assert kafka_down(RuntimeError(f"Lost task 0.0: {polled}milliseconds\n\tat x")) == (
        f"Spark's kafka source: {polled}milliseconds"
    )
    lost = (  # Spark's text (its KAFKA_DATA_LOSS error class), here with a timeout beside it
        "[KAFKA_DATA_LOSS.COULD_NOT_READ_OFFSET_RANGE] Some data may have been lost because they "
        "are not available in Kafka any more; either the data was aged out by Kafka or the topic "
        "may have been deleted before all the data in the topic was processed. If you don't want "
        "your streaming query to fail on such cases, set the source option failOnDataLoss to "
        "false. Reason: Could not read records in offset [5, 10) for topic partition t-0 with "
        "consumer group spark-kafka-source-1. SQLSTATE: 22000\n"
        "Caused by: org.apache.kafka.common.errors.TimeoutException: Timeout of 10000ms expired\n"
    )
    assert kafka_down(RuntimeError(lost)) is None
    assert (
        kafka_down(RuntimeError("java.util.concurrent.TimeoutException: Futures timed out")) is None
    )


def test_a_run_that_ends_on_the_java_clients_timeout_exits_4_in_one_sentence(capsys) -> None:
    """A run of Spark's kafka source stopped while it waited an outage out ends on the Java
    client's timeout, with no exception of the engine's to name it: the same exit 4 and one
    sentence as the embedded source's outage (exit 1 and a trace before)."""
    from kafka_delta.cli import EXIT_UNAVAILABLE, _failed

    assert _failed("p", RuntimeError(PLANNING_TIMED_OUT)) == EXIT_UNAVAILABLE
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: Kafka did not answer (Spark's kafka source: org.apache.kafka.")
    assert line.endswith("start again once the brokers are back")


@pytest.fixture
def cluster_engine(spark) -> dict[str, str]:
    """Spark's kafka source and delta-spark, skipped (with the reason) without their jars."""
    engine = engine_config("cluster")
    skip_without_connectors(spark, engine)
    return engine


def _cluster_config(
    engine: dict[str, str], bootstrap: str, topic: str, tmp_path: Path, **kafka: object
) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "pipeline_id": "outage",
            "transform": ORDERS,
            "engine": engine,
            "kafka": {
                "bootstrap_servers": bootstrap,
                "topics": [topic],
                "consumer_group": f"g-{uuid.uuid4().hex[:10]}",
                "client": {"fetch.wait.max.ms": 100},
                "max_records_per_trigger": 100,
                **kafka,
            },
            "delta": {"table": str(tmp_path / "table")},
            "checkpoint": str(tmp_path / "checkpoint"),
            "trigger": {"mode": "processing_time", "interval_seconds": 1},
            "commit_back": {"timeout_seconds": 5},
        }
    )


def _retries(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "Kafka is unavailable" in r.getMessage()]


# A retry taken for the Java client's timeout (not for the driver's own librdkafka requests).
JVM_RETRY = "Kafka is unavailable (Spark's kafka source: org.apache.kafka.common.errors."
# Seconds after the last batch's rows land before the broker is paused: the batch's progress
# line still asks Kafka for the lag (30 s when the broker is away, never failing the batch), so
# a pause then would reach Spark's source only that much later. Paused once the run idles,
# Spark's source is what meets the outage first.
IDLE_S = 5


def test_spark_kafka_source_rides_out_a_paused_broker_and_every_record_lands_once(
    spark, cluster_engine, own_broker: Broker, tmp_path: Path, caplog
) -> None:
    """Spark's kafka source, idle between batches, when its broker stops answering: its offset
    lookups end in the Java client's TimeoutException after about 30 s (three tries of
    10 s), which used to end the run with exit 1 and a trace. Now the run takes it for the
    outage: it retries from the checkpoint until the broker is back, and every record lands
    once. The pause outlasts the lookups, so the run does fail in it."""
    bootstrap = own_broker.bootstrap_servers
    assert own_broker.process is not None
    pid = own_broker.process.pid
    topic = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topics(bootstrap, [topic], 2)
    cfg = _cluster_config(
        cluster_engine, bootstrap, topic, tmp_path, unavailable_timeout_seconds=PAUSE_S + 60
    )
    produce_events(bootstrap, [topic], 300)
    caplog.set_level(logging.WARNING, logger="kafka_delta.kafka.outage")
    pipeline = Pipeline(spark, cfg)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            pipeline.run()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        _wait_for("the first 300 records", lambda: _rows(cfg) >= 300 or bool(outcome), 180)
        assert not outcome, outcome
        time.sleep(IDLE_S)

        os.kill(pid, signal.SIGSTOP)
        time.sleep(PAUSE_S)
        os.kill(pid, signal.SIGCONT)
        produce_events(bootstrap, [topic], 300, first_id=300)
        caught_up = _wait_for(
            "the 300 records produced after the pause",
            lambda: _rows(cfg) >= 600 or bool(outcome),
            240,
        )
        assert not outcome, outcome
        admin = KafkaAdmin(cfg.kafka.client_config())
        partitions = admin.partitions([topic])

        def no_lag() -> bool:
            committed = admin.committed(cfg.kafka.consumer_group, partitions)
            return total_lag(admin.latest(partitions), committed) == 0

        _wait_for("the group's lag 0", no_lag, 60)
        assert_exactly_once(cfg, 600)
        retries = _retries(caplog)
        assert any(r.startswith(JVM_RETRY) for r in retries), retries
        print(f"paused {PAUSE_S:.0f} s; retries: {retries}; caught up {caught_up:.0f} s after")
    finally:
        pipeline.request_stop()
        runner.join(120)
    assert not runner.is_alive(), "the run did not stop"
    assert outcome == [None], outcome


def test_spark_kafka_source_stops_with_one_sentence_and_exit_4_and_a_restart_loses_nothing(
    spark, cluster_engine, own_broker: Broker, tmp_path: Path
) -> None:
    """The project's command on Spark's kafka source, its broker paused for longer than
    kafka.unavailable_timeout_seconds (15 s here, shorter than one attempt: a restart waits
    30 s for its metadata request): it used to exit 1 with a trace (and, counting each long
    attempt as a new outage, would have retried forever). It stops with exit 4 and one line,
    the sentence naming the broker, commits nothing meanwhile, and once the broker is back a
    restart lands every record once."""
    bootstrap = own_broker.bootstrap_servers
    assert own_broker.process is not None
    pid = own_broker.process.pid
    topic = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topics(bootstrap, [topic], 2)
    cfg = _cluster_config(
        cluster_engine, bootstrap, topic, tmp_path, unavailable_timeout_seconds=15
    )
    conf = cfg.model_dump(mode="json")
    conf["spark"]["conf"].update(connector_conf(cluster_engine["source"], cluster_engine["sink"]))
    config = tmp_path / "outage.yaml"
    config.write_text(yaml.safe_dump(conf), encoding="utf-8")
    produce_events(bootstrap, [topic], 300)
    err = tmp_path / "stderr.log"
    with err.open("w") as stderr:
        run = subprocess.Popen(
            [sys.executable, "-m", "kafka_delta", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            start_new_session=True,  # its Spark JVM in its group: stopped with it on a failure
        )
    try:
        _wait_for("the first 300 records", lambda: _rows(cfg) >= 300 or run.poll() is not None, 180)
        assert run.poll() is None, err.read_text()[-3000:]
        time.sleep(IDLE_S)
        version = DeltaTable(cfg.delta.table).version()
        os.kill(pid, signal.SIGSTOP)
        paused = time.monotonic()
        code = run.wait(180)
        stopped = time.monotonic() - paused
        assert DeltaTable(cfg.delta.table).version() == version  # nothing after the pause
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
        os.kill(pid, signal.SIGCONT)

    lines = err.read_text().splitlines()
    assert code == EXIT_UNAVAILABLE, "\n".join(lines[-40:])
    said = [line for line in lines if line.startswith("error:")]
    assert said == lines[-1:], said
    assert said[0].startswith(f"error: Kafka at {bootstrap} did not answer for "), said
    assert "(kafka.unavailable_timeout_seconds is 15; last: " in said[0], said
    assert any(JVM_RETRY in line for line in lines), "no retry for the Java client's timeout"
    assert stopped < 150, stopped

    produce_events(bootstrap, [topic], 300, first_id=300)
    Pipeline(
        spark,
        cfg.model_copy(
            update={"trigger": cfg.trigger.model_copy(update={"mode": "available_now"})}
        ),
    ).run()
    assert_exactly_once(cfg, 600)
    print(f"exit 4 {stopped:.0f} s after the pause: {said[0]}")
