"""Offset bookkeeping: commit metadata, reading back by pipeline tag, admission control."""

from __future__ import annotations

import itertools
import json

import pytest

from kafka_delta.kafka.admin import Watermarks
from kafka_delta.offsets.model import (
    BatchCommit,
    app_id,
    offsets_from_json,
    offsets_to_json,
    parse_user_metadata,
)
from kafka_delta.offsets.stored import newest_stored
from kafka_delta.sources.kafka_datasource import (
    DataLossError,
    KafkaStreamReader,
    cap_offsets,
    group_ranges,
    split_ranges,
)


def test_commit_metadata_round_trips_offsets_and_identity() -> None:
    commit = BatchCommit("orders", app_id("orders", "q1"), 7, {"t": {0: 10, 1: 3}})
    parsed = parse_user_metadata(commit.user_metadata(), "orders")
    assert parsed == commit


def test_newest_stored_skips_other_writers_maintenance_and_other_pipelines() -> None:
    mine_old = BatchCommit("orders", "orders.q1", 1, {"t": {0: 5}}).user_metadata()
    mine_new = BatchCommit("orders", "orders.q1", 2, {"t": {0: 9}}).user_metadata()
    other = BatchCommit("refunds", "refunds.q9", 40, {"t": {0: 99}}).user_metadata()
    history = [  # newest first, as Delta returns it
        {"version": 6, "operation": "VACUUM END"},
        {"version": 5, "operation": "OPTIMIZE"},
        {"version": 4, "operation": "WRITE", "userMetadata": other},
        {"version": 3, "operation": "WRITE", "userMetadata": "a human wrote this"},
        {"version": 2, "operation": "WRITE", "userMetadata": json.dumps({"note": 1})},
        {"version": 1, "operation": "WRITE", "userMetadata": mine_new},
        {"version": 0, "operation": "WRITE", "userMetadata": mine_old},
    ]
    stored = newest_stored(history, "orders")
    assert stored is not None
    assert (stored.delta_version, stored.batch_id, stored.offsets) == (1, 2, {"t": {0: 9}})
    assert newest_stored(history[:1], "orders") is None


def test_app_id_differs_per_checkpoint_so_a_new_checkpoint_is_never_skipped() -> None:
    assert app_id("orders", "query-a") != app_id("orders", "query-b")
    assert app_id("orders", "query-a") == app_id("orders", "query-a")


def test_offsets_json_rejects_malformed_values() -> None:
    assert offsets_from_json(offsets_to_json({"t": {2: 5, 0: 1}})) == {"t": {0: 1, 2: 5}}
    for bad in ({"t": {"0": -1}}, {"t": {"0": "5"}}, {"t": 5}, [1]):
        with pytest.raises(ValueError):
            offsets_from_json(bad)  # type: ignore[arg-type]


def test_read_limit_is_shared_in_proportion_and_never_exceeded() -> None:
    start = {"a": {0: 0, 1: 100}, "b": {0: 0}}
    latest = {"a": {0: 900, 1: 200}, "b": {0: 0}}
    capped = cap_offsets(start, latest, 500)
    taken = {p: capped["a"][p] - start["a"][p] for p in (0, 1)}
    assert sum(taken.values()) == 500
    assert taken[0] == 450 and taken[1] == 50  # 900:100 split of 500
    assert capped["b"] == {0: 0}
    assert cap_offsets(start, latest, 10_000) == latest


def test_read_limit_smaller_than_partition_count_still_makes_progress() -> None:
    start = {"t": {p: 0 for p in range(4)}}
    latest = {"t": {p: 10 for p in range(4)}}
    capped = cap_offsets(start, latest, 3)
    assert sum(capped["t"].values()) == 3


def test_ranges_are_split_so_every_core_gets_work() -> None:
    ranges = split_ranges({"t": {0: 0}}, {"t": {0: 1000}}, min_partitions=4)
    assert len(ranges) >= 4
    assert ranges[0][2] == 0 and ranges[-1][3] == 1000
    assert all(a[3] == b[2] for a, b in itertools.pairwise(ranges))  # contiguous, no overlap
    assert split_ranges({"t": {0: 5}}, {"t": {0: 5}}, 4) == []


def test_a_batch_runs_as_many_read_tasks_as_asked_each_range_read_once() -> None:
    # Every Python task costs Spark a fixed set-up: sixteen partitions on two cores are read by
    # two tasks of about equal size, not by sixteen.
    reader = _reader(readTasks="2")
    start = {"t": {p: 0 for p in range(16)}}
    end = {"t": {p: 100 + 10 * p for p in range(16)}}

    tasks = reader.partitions(offsets_to_json(start), offsets_to_json(end))

    assert len(tasks) == 2
    read = sorted((r.partition, r.start, r.end) for task in tasks for r in task.ranges)
    assert read == [(p, 0, 100 + 10 * p) for p in range(16)]
    loads = [sum(r.end - r.start for r in task.ranges) for task in tasks]
    assert abs(loads[0] - loads[1]) <= 150  # at most one partition's worth apart
    # Fewer ranges than tasks: one range per task, never an empty task.
    assert group_ranges([("t", 0, 0, 5)], 4) == [[("t", 0, 0, 5)]]
    # One large partition and many tasks: split, then one piece per task.
    one = reader.partitions(offsets_to_json({"t": {0: 0}}), offsets_to_json({"t": {0: 1000}}))
    assert [len(task.ranges) for task in one] == [1, 1]


def _reader(**options: str) -> KafkaStreamReader:
    return KafkaStreamReader(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", **options}
    )


def test_positions_below_the_earliest_offset_fail_naming_topic_partition_and_both_offsets() -> None:
    # Retention deleted t[0] up to offset 100 while the table says the pipeline is at 40.
    # (The two brokers available to CI, Tansu and librdkafka's mock, implement neither
    # retention nor DeleteRecords, so this guard is exercised on watermarks directly.)
    marks = Watermarks(earliest={"t": {0: 100, 1: 0}}, latest={"t": {0: 200, 1: 50}})
    with pytest.raises(
        DataLossError, match=r"t\[0\] needs offset 40 but the earliest available is 100"
    ):
        _reader()._guard_data_loss({"t": {0: 40, 1: 10}}, marks)


def test_with_skipping_allowed_lost_positions_are_logged_and_restarted(caplog) -> None:
    marks = Watermarks(earliest={"t": {0: 100, 1: 0}}, latest={"t": {0: 200, 1: 5}})
    reader = _reader(failOnDataLoss="false")
    # The planner says it at INFO (it runs in Spark's planner process); the run's own log
    # says what each batch skipped as a warning (RunPositions.say_skipped, test_real_kafka).
    with caplog.at_level("INFO"):
        adjusted = reader._guard_data_loss({"t": {0: 40, 1: 10}}, marks)
    # Below earliest: skipped ahead when the batch is planned; past latest: from earliest.
    assert adjusted == {"t": {0: 40, 1: 0}}
    assert "t[0] needs offset 40 but the earliest available is 100" in caplog.text
    assert "t[1] needs offset 10 but the latest is 5" in caplog.text


class _Marks:
    """Stands in for the metadata queries: a topic whose partition 2 was just added."""

    def __init__(self, earliest: dict[str, dict[int, int]]) -> None:
        self.earliest = earliest

    def watermarks(self, partitions):
        return Watermarks(earliest=self.earliest, latest=self.earliest)


def test_a_partition_new_to_the_checkpoint_is_read_from_its_earliest_or_stored_offset() -> None:
    # Spark passes the previous batch's end as the start: partitions added since (t[2]; the
    # re-added topic u) are absent from it. Before the fix they started at their own end.
    reader = _reader(subscribe="t,u", storedOffsets=json.dumps({"u": {"0": 30}}))
    reader._admin = _Marks({"t": {0: 0, 1: 0, 2: 5}, "u": {0: 0}})

    planned = reader.partitions(
        {"t": {"0": 10, "1": 10}}, {"t": {"0": 10, "1": 12, "2": 40}, "u": {"0": 50}}
    )

    ranges = sorted((r.topic, r.partition, r.start, r.end) for task in planned for r in task.ranges)
    assert ranges == [("t", 1, 10, 12), ("t", 2, 5, 40), ("u", 0, 30, 50)]


def test_checkpoint_reads_the_initial_offsets_sparks_kafka_source_persisted(tmp_path) -> None:
    # Spark's KafkaSourceInitialOffsetWriter: a zero byte, "v1", then the offsets JSON. They
    # are batch 0's real start when a checkpoint is restarted after its batch 0 failed.
    from kafka_delta.recovery.checkpoint import CheckpointLog

    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_text('\x00v1\n{"o":{"1":7,"0":3}}')
    log = CheckpointLog(None, str(tmp_path))
    assert log.initial_offsets() == {"o": {0: 3, 1: 7}}
    assert CheckpointLog(None, str(tmp_path / "none")).initial_offsets() is None
