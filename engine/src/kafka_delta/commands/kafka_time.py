"""Offsets for a point in time, for ``offsets reset --to-datetime``.

Kafka answers "the first offset whose record timestamp is >= T" itself (ListOffsets by
timestamp, what ``kafka-consumer-groups --to-datetime`` uses). A reset is an audited, durable
move, so the answer is checked against the records around it before it is used: the record at
the answer must be at or after T, the one before it earlier than T. A broker whose answer fails
that check (the embedded Tansu 0.6 answers 0 for every timestamp) is not trusted: the offset is
then found by a binary search over the records' own timestamps, and a warning says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition

from kafka_delta.config import PipelineConfig
from kafka_delta.kafka.admin import KafkaAdmin, Watermarks
from kafka_delta.kafka.clients import about_its_group_only
from kafka_delta.offsets.model import Offsets

log = logging.getLogger(__name__)

_FETCH_TIMEOUT_S = 10.0


class _Reader:
    """Reads single records by position (assign + consume; never joins or commits a group)."""

    def __init__(self, config: PipelineConfig) -> None:
        self._consumer = Consumer(
            {
                **config.kafka.client_config(),
                "group.id": f"{config.kafka.consumer_group}.offsets-reset-probe",
                "enable.auto.commit": "false",
                "enable.partition.eof": "true",
            }
        )

    def first_at(self, topic: str, partition: int, offset: int, end: int) -> tuple[int, int] | None:
        """(offset, timestamp ms) of the first record at or after ``offset`` and before
        ``end``; None when there is none (transaction markers hold offsets but no record)."""
        if offset >= end:
            return None
        self._consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + _FETCH_TIMEOUT_S
        while time.monotonic() < deadline:
            message = self._consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:  # nothing further
                    return None
                if about_its_group_only(message.error()):
                    continue
                raise RuntimeError(f"reading {topic}[{partition}]: {message.error()}")
            if message.offset() >= end:
                return None
            return message.offset(), message.timestamp()[1]
        raise RuntimeError(
            f"no record of {topic}[{partition}] at or after offset {offset} within "
            f"{_FETCH_TIMEOUT_S:.0f}s, though Kafka's latest offset is {end}"
        )

    def close(self) -> None:
        self._consumer.close()


def _consistent(reader: _Reader, t: str, p: int, answer: int, lo: int, hi: int, when: int) -> bool:
    if answer < hi:
        at = reader.first_at(t, p, answer, hi)
        if at is None or at[1] < when:
            return False
    if answer > lo:
        # The last record before the answer must be older than `when`.
        before = reader.first_at(t, p, answer - 1, answer)
        if before is not None and before[1] >= when:
            return False
    return True


def _search(reader: _Reader, t: str, p: int, lo: int, hi: int, when: int) -> int:
    """The first position in [lo, hi] from which the first record read is at or after
    ``when`` (hi: none is), assuming timestamps grow with offsets."""
    while lo < hi:
        mid = (lo + hi) // 2
        at = reader.first_at(t, p, mid, hi)
        if at is None or at[1] >= when:
            hi = mid
        else:
            lo = at[0] + 1
    return lo


def offsets_for_time(
    config: PipelineConfig,
    admin: KafkaAdmin,
    partitions: Mapping[str, list[int]],
    marks: Watermarks,
    when_ms: int,
) -> Offsets:
    answers = admin.for_timestamp(partitions, when_ms)
    reader = _Reader(config)
    result: Offsets = {}
    try:
        for t, parts in partitions.items():
            for p in parts:
                lo, hi = marks.earliest[t][p], marks.latest[t][p]
                answer = answers[t][p]
                answer = hi if answer < 0 else min(max(answer, lo), hi)
                if not _consistent(reader, t, p, answer, lo, hi, when_ms):
                    found = _search(reader, t, p, lo, hi, when_ms)
                    log.warning(
                        "Kafka answered offset %d for %s[%d] at that time, which its records "
                        "contradict; using %d, found from the records' timestamps",
                        answer,
                        t,
                        p,
                        found,
                    )
                    answer = found
                result.setdefault(t, {})[p] = answer
    finally:
        reader.close()
    return result
