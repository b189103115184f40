"""The low-latency trigger (``trigger.mode: processing_time``, ``interval_seconds: 0``): the next
batch as soon as the last one ends and records are waiting, a bounded wait when none are, and
exactly once with the group following the table as on any other trigger.

The bounded wait is the embedded source's (kafka_datasource, ``idlePollMs``): with nothing new,
``latestOffset`` holds its answer, looking at the partitions' ends only (ListOffsets), and plans
as soon as one moved; Spark itself asks again ``trigger.idle_poll_seconds`` after an answer of
nothing new (``spark.sql.streaming.pollingDelay``). How fast and how cheap that is, is measured
in the benchmark (row 12), never here."""

from __future__ import annotations

import threading
import time

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from kafka_delta.config import PipelineConfig
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.pipeline import Pipeline
from kafka_delta.runtime.run_loop import POLLING_DELAY
from kafka_delta.sources import kafka_datasource
from kafka_delta.sources.embedded import embedded_source_options
from kafka_delta.sources.kafka_datasource import KafkaStreamReader
from kafka_delta_dev.produce import produce_events
from support import RunInThread, assert_exactly_once, assert_offsets_agree, table_rows
from test_kafka_round_trips import counting

pytestmark = [pytest.mark.broker]

LOW_LATENCY = {"mode": "processing_time", "interval_seconds": 0, "idle_poll_seconds": 0.05}


def test_the_low_latency_setting_is_interval_zero_and_only_it_polls_on_its_own(
    make_config,
) -> None:
    cfg = make_config(["orders"])
    assert cfg.trigger.idle_poll is None  # available_now: Spark's own polling
    low = PipelineConfig.model_validate({**cfg.model_dump(), "trigger": LOW_LATENCY})
    assert low.trigger.low_latency and low.trigger.idle_poll == 0.05
    every_second = cfg.with_overrides(
        **{"trigger.mode": "processing_time", "trigger.interval_seconds": 1}
    )
    assert not every_second.trigger.low_latency and every_second.trigger.idle_poll is None
    options = embedded_source_options(low.kafka, None, 2, idle_poll_s=low.trigger.idle_poll)
    assert options["idlePollMs"] == "50"
    assert "idlePollMs" not in embedded_source_options(cfg.kafka, None, 2)
    with pytest.raises(ValueError, match="interval_seconds"):
        PipelineConfig.model_validate(
            {**cfg.model_dump(), "trigger": {**LOW_LATENCY, "interval_seconds": -1}}
        )


def _idle_reader(bootstrap: str, topic: str) -> KafkaStreamReader:
    return KafkaStreamReader(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "idlePollMs": "20"}
    )


def test_an_idle_source_plans_records_that_arrive_while_it_waits(
    kafka_bootstrap, new_topics, monkeypatch
) -> None:
    # The wait ends as soon as the records are there; its bound is only the test's patience, so
    # a producer slowed by a loaded machine (CI, two cores) still lands inside it.
    monkeypatch.setattr(kafka_datasource, "IDLE_WAIT_S", 60.0)
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], 10)
    reader = _idle_reader(kafka_bootstrap, topic)
    start = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert sum(start[topic].values()) == 10
    # Nothing past `start` when the source is asked: it waits, and the records produced
    # meanwhile are its answer (without the wait it would answer `start`: nothing new).
    later = threading.Timer(0.3, lambda: produce_events(kafka_bootstrap, [topic], 4, first_id=10))
    later.start()
    try:
        end = reader.latestOffset(start, ReadAllAvailable())
    finally:
        later.join()
    # It plans as soon as one partition moved: the four records may reach the two partitions'
    # ends one look apart, so the answer holds some of them or all.
    assert 10 < sum(end[topic].values()) <= 14


def test_an_idle_source_answers_nothing_new_after_its_bounded_wait_asking_only_the_ends(
    kafka_bootstrap, new_topics, monkeypatch
) -> None:
    monkeypatch.setattr(kafka_datasource, "IDLE_WAIT_S", 0.3)
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], 10)
    reader = _idle_reader(kafka_bootstrap, topic)
    reader._admin = KafkaAdmin(reader.options.client_config())
    start = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    client = counting(reader._admin)
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    calls = client.taken()
    # One planning (its metadata request and both offset requests), then the wait's looks:
    # the latest offsets only, never a metadata request or a planning per look.
    assert calls["describe_topics"] == 1, calls
    assert calls["list_offsets"] > 2, calls
    # availableNow never waits: its last batch ends the run.
    reader.prepareForTriggerAvailableNow()
    client.taken()
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    assert client.taken()["list_offsets"] == 2


@pytest.mark.spark
def test_a_low_latency_run_commits_each_wave_exactly_once_and_the_group_follows(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    topics = new_topics(1, partitions=2)
    cfg = make_config(topics)
    cfg = PipelineConfig.model_validate({**cfg.model_dump(), "trigger": LOW_LATENCY})
    pipeline = Pipeline(spark, cfg)
    run = RunInThread(pipeline).start()
    produced = 0
    try:
        for wave in range(3):  # each wave lands on an idle, waiting run
            produce_events(kafka_bootstrap, topics, 50, first_id=produced)
            produced += 50
            run.wait_until(lambda n=produced: table_rows(cfg) >= n, f"wave {wave} not committed")
        # Spark asks again this long after an answer of nothing new (its default: 10 ms).
        assert spark.conf.get(POLLING_DELAY) == "50ms"
    finally:
        run.stop()
        spark.conf.unset(POLLING_DELAY)  # the session is shared with other tests
    assert not run.failures, run.failures
    assert not run.thread.is_alive()
    assert pipeline.summary.batches >= 3
    assert_exactly_once(cfg, produced)
    assert_offsets_agree(cfg)  # the commit-back's newest offsets, flushed at the stop


@pytest.mark.spark
def test_a_batchs_report_runs_while_the_next_batches_commit(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    """The count, the lag, the commit-back hand-off, the progress line and the listeners of a
    committed batch are off its critical path (kafka_delta.progress.reporter): a listener still
    busy with batch 0 holds no later batch back, and the run ends with every batch reported."""
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 300)
    cfg = make_config(topics, max_records_per_trigger=100)

    class SlowListener:
        def __init__(self) -> None:
            self.seen: list[int] = []
            self.later_batches_committed: bool | None = None

        def on_batch(self, progress) -> None:
            if progress.batch_id == 0:
                deadline = time.monotonic() + 60
                while table_rows(cfg) < 300 and time.monotonic() < deadline:
                    time.sleep(0.1)
                self.later_batches_committed = table_rows(cfg) == 300
            self.seen.append(progress.batch_id)

        def on_run_end(self, commit_back) -> None:
            pass

        def close(self) -> None:
            pass

    listener = SlowListener()
    summary = Pipeline(spark, cfg, listeners=[listener]).run()
    assert listener.later_batches_committed is True
    assert listener.seen == [0, 1, 2]  # in order, every one, before run() returned
    assert summary.batches == 3 and summary.rows_written == 300
    assert_exactly_once(cfg, 300)
    assert_offsets_agree(cfg)
