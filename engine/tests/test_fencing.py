"""The fencing rule (I6) and the one rule of where a partition is first read, as pure functions:
what a batch may start at on a table that stores offsets for some, all or none of its
partitions, whichever source planned it."""

from __future__ import annotations

import pytest

from kafka_delta.offsets.fencing import FencingError, check_contiguous
from kafka_delta.offsets.model import BatchCommit, StoredOffsets, first_offset


def _commit(batch_id: int, end: dict[str, dict[int, int]]) -> BatchCommit:
    return BatchCommit("orders", "orders.q1", batch_id, end)


def _stored(offsets: dict[str, dict[int, int]]) -> StoredOffsets:
    return StoredOffsets(offsets, 3, "orders.q0", 7, seq=4)


def test_spark_kafka_sources_first_batch_at_its_initial_offsets_is_not_fenced() -> None:
    # Spark's kafka source starts batch 0 at the initial offsets it persisted in the checkpoint
    # (sources/0/0): every partition at its earliest offset, here 0 and a retention-trimmed 40.
    start = {"orders": {0: 0, 1: 40}}
    earliest = {"orders": {0: 0, 1: 40}}

    check_contiguous(None, start, _commit(0, {"orders": {0: 10, 1: 50}}), firsts=earliest)


def test_the_embedded_sources_first_batch_starts_empty_and_is_not_fenced() -> None:
    check_contiguous(None, {}, _commit(0, {"orders": {0: 10}}))


def test_a_first_batch_may_start_at_the_configured_latest_or_at_an_offset_of_its_own() -> None:
    # starting_offsets: latest, or a map: the first read may begin that far, skipping by choice.
    at_latest = {"orders": {0: 90}}
    check_contiguous(None, at_latest, _commit(0, {"orders": {0: 95}}), firsts=at_latest)
    check_contiguous(None, {"orders": {0: 7}}, _commit(0, {"orders": {0: 9}}), firsts=at_latest)


def test_a_first_batch_that_skips_records_kafka_holds_is_fenced_in_one_true_sentence() -> None:
    # The table stores nothing, yet the batch starts at 25 where a first read starts at 0:
    # the checkpoint outlived its table.
    with pytest.raises(FencingError) as raised:
        check_contiguous(
            None, {"orders": {0: 25}}, _commit(4, {"orders": {0: 30}}), firsts={"orders": {0: 0}}
        )
    message = str(raised.value)
    assert "orders[0] batch starts at 25, past 0, where a first read of it starts" in message
    assert "the table was deleted or replaced while this checkpoint was in use" in message
    assert "another run" not in message


def test_a_partition_whose_first_read_is_unknown_is_fenced() -> None:
    with pytest.raises(
        FencingError, match=r"orders\[0\] batch starts at 3, where the table stores"
    ):
        check_contiguous(None, {"orders": {0: 3}}, _commit(1, {"orders": {0: 5}}))


def test_once_another_run_committed_a_first_batch_is_fenced_even_at_the_earliest_offset() -> None:
    stored = _stored({"orders": {0: 10, 1: 50}})
    with pytest.raises(FencingError, match="another run of this pipeline is writing") as raised:
        check_contiguous(
            stored,
            {"orders": {0: 0, 1: 40}},
            _commit(0, {"orders": {0: 10, 1: 50}}),
            firsts={"orders": {0: 0, 1: 40}},
        )
    assert "orders[0] stored 10, batch starts at 0" in str(raised.value)
    with pytest.raises(FencingError, match="the table already holds offsets"):
        check_contiguous(stored, {}, _commit(0, {"orders": {0: 10}}))


def test_a_partition_added_to_a_running_pipeline_starts_at_its_earliest_offset() -> None:
    stored = _stored({"orders": {0: 10}})
    start = {"orders": {0: 10, 1: 0}}
    check_contiguous(
        stored, start, _commit(5, {"orders": {0: 12, 1: 3}}), firsts={"orders": {1: 0}}
    )
    with pytest.raises(FencingError, match=r"orders\[1\] batch starts at 2, past 0"):
        check_contiguous(
            stored,
            {"orders": {0: 10, 1: 2}},
            _commit(5, {"orders": {0: 12, 1: 3}}),
            firsts={"orders": {1: 0}},
        )


def test_a_partition_a_restore_took_out_of_the_table_is_fenced_as_the_restore() -> None:
    # This run saw orders[0] stored (so it computed no first read for it); a RESTORE to before
    # the pipeline's first commit leaves the table without it.
    restored = StoredOffsets({}, None, None, None, restore={"version": 4, "to": 0, "at_ms": 1})
    with pytest.raises(FencingError, match="the table was restored to an earlier version"):
        check_contiguous(restored, {"orders": {0: 10}}, _commit(3, {"orders": {0: 12}}))


@pytest.mark.parametrize(
    ("stored", "starting", "expected"),
    [
        ({}, "earliest", 5),
        ({}, "latest", 9),
        ({}, {"t": {0: 7}}, 7),
        ({}, {"t": {0: -1}}, 9),
        ({}, {"t": {1: 7}}, 5),  # a partition the map leaves out: earliest
        ({"t": {0: 6}}, "latest", 6),  # stored wins
        ({"u": {0: 1}}, "latest", 5),  # the pipeline ran before: a new partition at earliest
    ],
)
def test_the_first_read_of_a_partition_follows_one_rule(stored, starting, expected) -> None:
    assert first_offset("t", 0, stored=stored, starting=starting, earliest=5, latest=9) == expected
