"""What a micro-batch asks Kafka, counted on a real broker: the embedded source's planning makes
ONE metadata request per batch (the partitions and the topics' ids in one answer) besides the two
offset requests, and the pipeline's batch function ONE request (the lag's latest offsets), never
the topic ids again. A topic deleted and created again while the pipeline runs is still caught
(I8, I12): by the planning's metadata request, before the next batch is planned.

The counts come from confluent-kafka's own AdminClient, passed through unchanged by a wrapper
that counts the calls, and for the planning from librdkafka's own statistics of the requests it
sent to the broker."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql.streaming.datasource import ReadMaxRows

from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.offsets.topic_identity import TopicRecreatedError
from kafka_delta.pipeline import Pipeline
from kafka_delta.sources.kafka_datasource import KafkaStreamReader
from kafka_delta_dev.produce import produce_events
from support import recreate_topic, table_ids

pytestmark = [pytest.mark.spark, pytest.mark.broker]

# The AdminClient calls that are Kafka round trips: Metadata (list_topics, describe_topics)
# and ListOffsets.
REQUESTS = ("list_topics", "describe_topics", "list_offsets")


class CountingClient:
    """A KafkaAdmin's confluent-kafka AdminClient, every call passed through, its requests
    counted."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name not in REQUESTS:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted

    def taken(self) -> Counter[str]:
        """The calls since the last time, and start counting again."""
        calls, self.calls = self.calls, Counter()
        return calls


class SentRequests:
    """librdkafka's statistics callback (``stats_cb``): the requests a client sent, by Kafka
    API, summed over the brokers it talks to."""

    def __init__(self) -> None:
        self.totals: Counter[str] = Counter()
        self.emitted = 0

    def __call__(self, stats: str) -> None:
        totals: Counter[str] = Counter()
        for broker in json.loads(stats)["brokers"].values():
            totals.update(broker.get("req") or {})
        self.totals, self.emitted = totals, self.emitted + 1

    def settled(self, admin: KafkaAdmin) -> Counter[str]:
        """The totals of a statistics report made after this call (one a second)."""
        seen = self.emitted
        deadline = time.monotonic() + 10
        while self.emitted < seen + 2 and time.monotonic() < deadline:
            admin._admin.poll(0.1)
        assert self.emitted >= seen + 2, "librdkafka emitted no statistics"
        return +self.totals


def counting(admin: KafkaAdmin) -> CountingClient:
    client = CountingClient(admin._admin)
    admin._admin = client
    return client


def test_planning_a_batch_makes_one_metadata_request_and_stops_on_a_recreated_topic(
    kafka_bootstrap, new_topics
) -> None:
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], 40)
    ids = KafkaAdmin({"bootstrap.servers": kafka_bootstrap}).topic_ids([topic])
    # As the pipeline opens it (sources/embedded.py): the ids it found at start.
    reader = KafkaStreamReader(
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "subscribe": topic,
            "topicIds": json.dumps(ids),
        }
    )
    sent = SentRequests()
    config = reader.options.client_config()
    admin = KafkaAdmin({**config, "statistics.interval.ms": 1000, "stats_cb": sent})
    reader._admin = admin
    client = counting(admin)
    start = reader.initialOffset()
    client.taken()
    before = sent.settled(admin)
    for _ in range(3):
        end = reader.latestOffset(start, ReadMaxRows(10))
        reader.partitions(start, end)
        # One metadata request (partitions and topic ids at once), the earliest and the latest
        # offsets; nothing more for the ranges of a batch on known partitions.
        assert client.taken() == {"describe_topics": 1, "list_offsets": 2}
        start = end
    assert sum(end[topic].values()) == 30
    # On the wire, as librdkafka counted what it sent: 3 batches, 3 Metadata requests.
    after = sent.settled(admin)
    assert {api: after[api] - before[api] for api in ("Metadata", "ListOffsets")} == {
        "Metadata": 3,
        "ListOffsets": 6,
    }

    # Deleted and created again, with more records than the stored positions: Kafka's own
    # check (a position past the end) cannot see it; the topic id does.
    recreate_topic(kafka_bootstrap, topic, 2)
    produce_events(kafka_bootstrap, [topic], 100, first_id=1000)
    with pytest.raises(TopicRecreatedError, match="created again while this run read them"):
        reader.latestOffset(start, ReadMaxRows(10))


def test_a_batch_asks_kafka_once_and_a_topic_recreated_mid_run_stops_before_the_next(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], 40)
    cfg = make_config([topic], max_records_per_trigger=10)
    per_batch: list[Counter[str]] = []

    class Counting:
        """A progress listener: called in each batch function, after its lag query."""

        def on_batch(self, progress: Any) -> None:
            per_batch.append(client.taken())

        def on_run_end(self, commit_back: Any) -> None: ...

        def close(self) -> None: ...

    pipeline = Pipeline(spark, cfg, listeners=[Counting()])
    client = counting(pipeline.admin)
    pipeline.run()
    assert sorted(table_ids(cfg)) == list(range(40))
    assert len(per_batch) == 4
    # From the end of one batch function to the end of the next: the lag's latest offsets,
    # and no topic ids (the source's planning checked them).
    for calls in per_batch[1:]:
        assert calls == {"list_offsets": 1}, per_batch

    # Recreated while a run reads it: the run stops before planning the next batch, with
    # nothing of it written.
    produce_events(kafka_bootstrap, [topic], 20, first_id=40)

    class RecreateAfterFirstBatch(Counting):
        def on_batch(self, progress: Any) -> None:
            if not per_batch:
                recreate_topic(kafka_bootstrap, topic, 2)
                produce_events(kafka_bootstrap, [topic], 100, first_id=1000)
            per_batch.append(Counter())

    per_batch.clear()
    running = Pipeline(spark, cfg, listeners=[RecreateAfterFirstBatch()])
    with pytest.raises(Exception, match="created again while this run read them"):
        running.run()
    assert len(per_batch) == 1
    assert sorted(table_ids(cfg)) == list(range(50))
    version = DeltaTable(cfg.delta.table).version()

    # The next start says it too (the table's ids against Kafka's), and reads the new topic
    # from its first record when allowed.
    with pytest.raises(TopicRecreatedError, match="deleted and created again"):
        Pipeline(spark, cfg).run()
    assert DeltaTable(cfg.delta.table).version() == version
    Pipeline(spark, cfg.with_overrides(**{"kafka.fail_on_data_loss": False})).run()
    assert sorted(table_ids(cfg)) == [*range(50), *range(1000, 1100)]


def test_a_topic_deleted_while_a_run_reads_it_stops_planning_with_that_sentence(
    kafka_bootstrap, monkeypatch
) -> None:
    """A topic the run has read that stays missing is not "create it first": the run read it,
    and an operator deleted it. Planning asks again for a while first (a delete and a create
    again are two requests; planning between them saw it missing)."""
    from kafka_delta.sources import kafka_datasource
    from kafka_delta.sources.kafka_datasource import KafkaStreamReader

    monkeypatch.setattr(kafka_datasource, "DELETED_WAIT_S", 0.5)
    topic = f"gone-{uuid.uuid4().hex[:8]}"
    reader = KafkaStreamReader({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic})
    with pytest.raises(ValueError, match="create it first"):  # never read: as before
        reader._partitions()
    reader._topic_ids[topic] = "AAAAAAAAAAAAAAAAAAAAAA"  # read by this run, then deleted
    started = time.monotonic()
    with pytest.raises(ValueError, match=f"topic '{topic}', which this run was reading, was "):
        reader._partitions()
    assert time.monotonic() - started >= 0.5
