"""Kafka outages during a run (kafka.unavailable_timeout_seconds, kafka/outage.py): a broker
that stops answering is waited out, nothing is committed meanwhile, and every record lands
exactly once; a broker that stays away ends the run with one sentence naming it (exit 4).

Each test pauses (SIGSTOP) or kills a broker of its own: the session's broker is shared by the
worker's other tests."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from kafka_delta.cli import EXIT_UNAVAILABLE, _failed
from kafka_delta.config import PipelineConfig
from kafka_delta.kafka.admin import KafkaAdmin, KafkaUnavailableError, total_lag
from kafka_delta.pipeline import Pipeline
from kafka_delta.sources.kafka_datasource import OffsetRange, read_range
from kafka_delta_dev.broker import BrokerError, EmbeddedBroker
from kafka_delta_dev.orders import TRANSFORM as ORDERS
from kafka_delta_dev.produce import ensure_topics, produce_events
from support import assert_exactly_once, table_ids

# The pause a run rides out here: longer than a metadata request's 30 s, which the run used to
# give up after. By hand: KAFKA_DELTA_OUTAGE_PAUSE_S=120 (the run then waits as long).
PAUSE_S = float(os.environ.get("KAFKA_DELTA_OUTAGE_PAUSE_S", "45"))


@pytest.fixture
def own_broker() -> Iterator[EmbeddedBroker]:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        pytest.skip("pauses a broker process of its own: needs the embedded broker")
    try:
        broker = EmbeddedBroker().start()
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
    own_broker: EmbeddedBroker, outage: str
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
    spark, own_broker: EmbeddedBroker, tmp_path: Path, caplog, capsys
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
