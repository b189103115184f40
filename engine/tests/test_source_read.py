"""The read task's record handling without a broker: Arrow columns, range cut, errors."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kafka_delta.contract import KAFKA_ARROW_SCHEMA as ARROW_SCHEMA
from kafka_delta.sources.kafka_datasource import (
    DataLossError,
    OffsetRange,
    _records_before_end,
    consumer_config,
    to_record_batch,
)

CREATE_TIME, LOG_APPEND_TIME, NOT_AVAILABLE = 1, 2, 0


class FakeMessage:
    """The part of confluent_kafka.Message a read task uses."""

    def __init__(
        self,
        offset: int,
        value: bytes | None = b"v",
        key: bytes | None = None,
        timestamp: tuple[int, int] = (CREATE_TIME, 1_700_000_000_123),
        headers: list[tuple[str, bytes | None]] | None = None,
        error: KafkaError | None = None,
    ) -> None:
        self._offset, self._value, self._key = offset, value, key
        self._timestamp, self._headers, self._error = timestamp, headers, error

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def error(self) -> KafkaError | None:
        return self._error


def eof(offset: int) -> FakeMessage:
    return FakeMessage(offset, value=None, error=KafkaError(KafkaError._PARTITION_EOF))


def task(start: int, end: int) -> OffsetRange:
    return OffsetRange("t", 3, start, end, (("bootstrap.servers", "127.0.0.1:1"),), 1000)


def test_batch_has_sparks_kafka_columns_with_timestamps_in_microseconds() -> None:
    batch = to_record_batch(
        "orders",
        3,
        [
            FakeMessage(10, b'{"id":1}', key=b"k", timestamp=(CREATE_TIME, 1_700_000_000_123)),
            FakeMessage(12, None, timestamp=(LOG_APPEND_TIME, 5)),
        ],
    )
    assert batch.schema.equals(ARROW_SCHEMA)
    assert batch.to_pydict() == {
        "key": [b"k", None],
        "value": [b'{"id":1}', None],
        "topic": ["orders", "orders"],
        "partition": [3, 3],
        "offset": [10, 12],
        "timestamp": [
            datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC),
            datetime(1970, 1, 1, 0, 0, 0, 5000, tzinfo=UTC),
        ],
        "timestampType": [0, 1],
        "headers": [None, None],
    }


def test_missing_timestamps_are_null_and_headers_are_kept_when_some_record_has_them() -> None:
    batch = to_record_batch(
        "t",
        0,
        [
            FakeMessage(0, timestamp=(NOT_AVAILABLE, 0)),
            FakeMessage(1, timestamp=(CREATE_TIME, -1), headers=[("h", b"x"), ("n", None)]),
            FakeMessage(2, headers=[]),
        ],
    )
    data = batch.to_pydict()
    assert data["timestamp"][:2] == [None, None]
    assert data["timestampType"] == [None, 0, 0]
    with_headers = [{"key": "h", "value": b"x"}, {"key": "n", "value": None}]
    assert data["headers"] == [None, with_headers, None]


def test_empty_batch_keeps_the_schema() -> None:
    batch = to_record_batch("t", 0, [])
    assert batch.num_rows == 0 and batch.schema.equals(ARROW_SCHEMA)


def test_range_is_cut_at_its_end_even_across_offset_gaps() -> None:
    messages: list[Any] = [FakeMessage(o) for o in (5, 7, 9, 12, 13)]
    kept, position = _records_before_end(task(5, 10), messages, 5)
    assert [m.offset() for m in kept] == [5, 7, 9]
    assert position == 12  # the first offset past the range stops the read

    kept, position = _records_before_end(task(5, 20), messages, 5)
    assert len(kept) == 5 and position == 14


def test_end_of_partition_moves_the_position_without_a_record() -> None:
    # A transaction marker at offset 9: the broker's end (10) is reached without a record at 9.
    messages: list[Any] = [FakeMessage(7), FakeMessage(8), eof(10)]
    kept, position = _records_before_end(task(7, 10), messages, 7)
    assert [m.offset() for m in kept] == [7, 8] and position == 10


def test_record_past_the_end_wins_over_later_events() -> None:
    messages: list[Any] = [FakeMessage(4), FakeMessage(6), eof(7)]
    kept, position = _records_before_end(task(4, 5), messages, 4)
    assert [m.offset() for m in kept] == [4] and position == 6


def test_out_of_range_is_data_loss_and_other_errors_raise() -> None:
    reset = FakeMessage(0, error=KafkaError(KafkaError._AUTO_OFFSET_RESET, "gone"))
    with pytest.raises(DataLossError, match=r"t\[3\]: offset 2 is out of range"):
        _records_before_end(task(2, 9), [reset], 2)
    broken = FakeMessage(0, error=KafkaError(KafkaError._TRANSPORT))
    with pytest.raises(KafkaException):
        _records_before_end(task(2, 9), [FakeMessage(2), broken], 2)


def test_consumer_config_tunes_prefetch_but_the_users_settings_and_safety_rules_win() -> None:
    conf = consumer_config({"bootstrap.servers": "b:9092"}, 5_000)
    assert conf["fetch.queue.backoff.ms"] == "10"
    assert conf["queued.min.messages"] == "5000"
    assert consumer_config({}, 10_000_000)["queued.min.messages"] == "100000"

    user = consumer_config(
        {"fetch.queue.backoff.ms": "500", "auto.offset.reset": "earliest", "group.id": "g"}, 10
    )
    assert user["fetch.queue.backoff.ms"] == "500"
    assert user["group.id"] == "g"
    assert user["auto.offset.reset"] == "error"
    assert user["enable.auto.commit"] == "false"
