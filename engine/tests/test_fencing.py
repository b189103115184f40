"""The fencing rule (I6) and the one rule of where a partition is first read, as pure functions:
what a batch may start at on a table that stores offsets for some, all or none of its
partitions, whichever source planned it. Then two runs creating one table at once on delta-spark,
real tables: a lost creation race is a fence like any lost race."""

from __future__ import annotations

from pathlib import Path

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

    check_contiguous(None, start, _commit(0, {"orders": {0: 10, 1: 50}}), first_reads=earliest)


def test_the_embedded_sources_first_batch_starts_empty_and_is_not_fenced() -> None:
    check_contiguous(None, {}, _commit(0, {"orders": {0: 10}}))


def test_a_first_batch_may_start_at_the_configured_latest_or_at_an_offset_of_its_own() -> None:
    # starting_offsets: latest, or a map: the first read may begin that far, skipping by choice.
    at_latest = {"orders": {0: 90}}
    check_contiguous(None, at_latest, _commit(0, {"orders": {0: 95}}), first_reads=at_latest)
    check_contiguous(
        None, {"orders": {0: 7}}, _commit(0, {"orders": {0: 9}}), first_reads=at_latest
    )


def test_a_first_batch_that_skips_records_kafka_holds_is_fenced_in_one_true_sentence() -> None:
    # The table stores nothing, yet the batch starts at 25 where a first read starts at 0:
    # the checkpoint outlived its table.
    with pytest.raises(FencingError) as raised:
        check_contiguous(
            None,
            {"orders": {0: 25}},
            _commit(4, {"orders": {0: 30}}),
            first_reads={"orders": {0: 0}},
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
            first_reads={"orders": {0: 0, 1: 40}},
        )
    assert "orders[0] stored 10, batch starts at 0" in str(raised.value)
    with pytest.raises(FencingError, match="the table already holds offsets"):
        check_contiguous(stored, {}, _commit(0, {"orders": {0: 10}}))


def test_a_partition_added_to_a_running_pipeline_starts_at_its_earliest_offset() -> None:
    stored = _stored({"orders": {0: 10}})
    start = {"orders": {0: 10, 1: 0}}
    check_contiguous(
        stored, start, _commit(5, {"orders": {0: 12, 1: 3}}), first_reads={"orders": {1: 0}}
    )
    with pytest.raises(FencingError, match=r"orders\[1\] batch starts at 2, past 0"):
        check_contiguous(
            stored,
            {"orders": {0: 10, 1: 2}},
            _commit(5, {"orders": {0: 12, 1: 3}}),
            first_reads={"orders": {1: 0}},
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


# -- a lost creation race is a fence (delta-spark; real tables, two writers at once) -----------


def _race_to_create(spark, location: str, checkpoints: Path) -> list[tuple[str, str]]:
    """Two runs of one pipeline (two checkpoints) commit their first batch to ``location`` at
    once, released together: how each ended (``written``, or the exception's name and text)."""
    import threading

    from kafka_delta.sinks.delta_spark.sink import DeltaSparkSink

    barrier = threading.Barrier(2)
    ends: list[tuple[str, str]] = []

    def one(n: int) -> None:
        sink = DeltaSparkSink(spark, location, "orders", checkpoint=str(checkpoints / f"c{n}"))
        rows = spark.createDataFrame([(n,)], "id long")
        commit = BatchCommit("orders", f"orders.q{n}", 0, {"orders": {0: 1}})
        barrier.wait()
        try:
            result = sink.commit_batch(rows, commit, start={})
            ends.append(("written", f"q{n}") if result.written else ("replayed", f"q{n}"))
        except Exception as exc:
            ends.append((type(exc).__name__, str(exc)))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return sorted(ends)


@pytest.mark.spark
@pytest.mark.parametrize("by", ["path", "name"])
def test_two_runs_creating_one_table_at_once_commit_once_and_the_loser_is_fenced(
    spark, tmp_path: Path, by: str
) -> None:
    """delta-spark refuses the second of two first commits to an empty location
    (``DELTA_PROTOCOL_CHANGED``: "multiple writers are writing to an empty directory"), and by
    name the catalog's or Delta's refusal of the second ``CREATE TABLE`` (the name taken; the
    location not empty: ``DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION``). Found by the
    operations harness on two tables (a deleted table, then a race that created the dead-letter
    table): the loser died with Delta's raw error, a stuck state. Each is a lost race: the loser
    goes on to its append (by name) or reads the table back (by path), and is fenced with a
    sentence naming the winner's commit; the table holds the winner's row once. Threads
    released together, so a round may not overlap; the rules give the same ends then (the loser
    finds the winner's offsets), and the rounds overlapped every time here (without the sink's
    lost-race judgement eight of eight rounds by path ended in the raw error; without the
    by-name creation's, twelve of twelve ended raw or fenced by a commit it never saw)."""
    from conftest import skip_without_connectors

    skip_without_connectors(spark, {"source": "embedded", "sink": "delta_spark"})
    schema = f"kd_{tmp_path.name[-12:].replace('-', '_')}"
    if by == "name":
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS {schema} LOCATION '{tmp_path / 'warehouse'}'")
    for n in range(3):
        location = str(tmp_path / f"t{n}") if by == "path" else f"{schema}.t{n}"
        (fenced, why), (written, winner) = _race_to_create(spark, location, tmp_path / f"r{n}")
        assert written == "written" and fenced == "FencingError", (fenced, why[:2000])
        assert f"(batch 0 of orders.{winner})" in why, why  # the winner's commit, named
        frame = spark.table(location) if by == "name" else spark.read.format("delta").load(location)
        assert [r.id for r in frame.collect()] == [int(winner[1:])]
