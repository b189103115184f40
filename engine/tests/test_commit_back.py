"""The post-commit hook: asynchronous, newest-wins, bounded, never failing the batch."""

from __future__ import annotations

import time

from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.kafka.commit_back import OffsetCommitter
from kafka_delta_dev.children import free_port


def test_committed_offsets_reach_the_consumer_group(kafka_bootstrap, new_topics) -> None:
    (topic,) = new_topics(1, partitions=2)
    committer = OffsetCommitter({"bootstrap.servers": kafka_bootstrap}, "g-commit-back")
    committer.submit(0, {topic: {0: 5, 1: 7}})
    stats = committer.close()
    assert (stats.succeeded, stats.failed, stats.last_committed_batch) == (1, 0, 0)
    committed = KafkaAdmin({"bootstrap.servers": kafka_bootstrap}).committed(
        "g-commit-back", {topic: [0, 1]}
    )
    assert committed == {topic: {0: 5, 1: 7}}


def test_newest_offsets_win_when_commits_queue_up(kafka_bootstrap, new_topics) -> None:
    (topic,) = new_topics(1, partitions=1)
    committer = OffsetCommitter({"bootstrap.servers": kafka_bootstrap}, "g-newest")
    for batch in range(50):
        committer.submit(batch, {topic: {0: batch + 1}})
    stats = committer.close()
    assert stats.last_committed_batch == 49
    assert stats.succeeded + stats.superseded + stats.failed == 50
    assert stats.failed == 0
    committed = KafkaAdmin({"bootstrap.servers": kafka_bootstrap}).committed(
        "g-newest", {topic: [0]}
    )
    assert committed == {topic: {0: 50}}


def test_unreachable_broker_is_counted_never_raised_and_never_blocks_submit() -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    committer = OffsetCommitter({"bootstrap.servers": dead}, "g-dead", timeout_s=1.0)
    started = time.monotonic()
    for batch in range(3):
        committer.submit(batch, {"orders": {0: batch}})
    assert time.monotonic() - started < 0.5  # submit returns at once
    committer.flush(timeout_s=5)
    stats = committer.close()
    assert time.monotonic() - started < 10
    assert stats.succeeded == 0
    assert stats.failed >= 1
    assert stats.last_error
