"""The delta-rs sink and offset store, on real Delta tables on disk (replay and upsert, shared
by both sinks, are in test_engine_contract.py)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from kafka_delta.delta.rs_offset_store import DeltaRsOffsetStore
from kafka_delta.engine import WriteMode
from kafka_delta.offsets.model import BatchCommit, parse_user_metadata
from kafka_delta.sinks.delta_rs.sink import DeltaRsSink, FencingError


def _rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


def test_batch_lands_in_one_commit_with_data_txn_and_end_offsets(tmp_path: Path) -> None:
    sink = DeltaRsSink(str(tmp_path / "t"), "p")
    commit = BatchCommit("p", "p.q1", 0, {"orders": {0: 3, 1: 2}})
    result = sink.commit_batch(_rows(1, 2, 3), commit)

    table = DeltaTable(str(tmp_path / "t"))
    assert (result.written, result.rows, result.delta_version) == (True, 3, table.version())
    assert table.version() == 0  # exactly one commit
    assert table.transaction_version("p.q1") == 0
    # The pipeline's first commit (fence seq 1) and each partition's end offset as txn actions,
    # which Delta checkpoints keep across log cleanup.
    assert table.transaction_version("p:fence") == 1
    assert table.transaction_version("p:offset:orders:0") == 3
    assert table.transaction_version("p:offset:orders:1") == 2
    info = table.history(1)[0]
    assert parse_user_metadata(info["userMetadata"], "p") == commit.with_seq(1)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]


def test_empty_batch_still_commits_its_offsets(tmp_path: Path) -> None:
    # A batch of only transaction markers, or one the transform filters out entirely, must
    # still advance the stored offsets.
    sink = DeltaRsSink(str(tmp_path / "t"), "p")
    sink.commit_batch(_rows(1), BatchCommit("p", "p.q", 0, {"o": {0: 1}}))
    result = sink.commit_batch(_rows(), BatchCommit("p", "p.q", 1, {"o": {0: 3}}))
    assert result.written and result.rows == 0
    stored = DeltaRsOffsetStore(str(tmp_path / "t"), "p").read()
    assert stored is not None and stored.offsets == {"o": {0: 3}}


def test_offset_store_reads_this_pipelines_newest_offsets_past_other_writers(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    sink.commit_batch(_rows(1), BatchCommit("p", "p.q", 0, {"o": {0: 1}}))
    sink.commit_batch(_rows(2), BatchCommit("p", "p.q", 1, {"o": {0: 2}}))
    sink.commit_batch(_rows(3), BatchCommit("other", "other.q", 5, {"o": {0: 50}}))
    write_deltalake(uri, _rows(4), mode="append")  # a writer that tags nothing
    DeltaTable(uri).optimize.compact()
    for _ in range(30):  # more than the first history page
        write_deltalake(uri, _rows(5), mode="append")

    stored = DeltaRsOffsetStore(uri, "p").read()
    assert stored is not None
    assert (stored.offsets, stored.batch_id, stored.delta_version) == ({"o": {0: 2}}, 1, 1)
    assert DeltaRsOffsetStore(uri, "nobody").read() is None
    assert DeltaRsOffsetStore(str(tmp_path / "missing"), "p").read() is None


def test_second_run_of_a_pipeline_cannot_commit_over_the_first(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    run_a, run_b = DeltaRsSink(uri, "p"), DeltaRsSink(uri, "p")
    # Both runs started from an empty table and planned the same records.
    run_a.commit_batch(_rows(1, 2), BatchCommit("p", "p.run-a", 0, {"o": {0: 2}}), start={})
    with pytest.raises(FencingError, match="does not start where the table ends"):
        run_b.commit_batch(_rows(1, 2), BatchCommit("p", "p.run-b", 0, {"o": {0: 2}}), start={})
    # The same holds later on: run B's next batch starts where run A has moved past.
    run_a.commit_batch(_rows(3), BatchCommit("p", "p.run-a", 1, {"o": {0: 3}}), start={"o": {0: 2}})
    with pytest.raises(FencingError, match=r"o\[0\] stored 3, batch starts at 2"):
        run_b.commit_batch(
            _rows(3), BatchCommit("p", "p.run-b", 1, {"o": {0: 3}}), start={"o": {0: 2}}
        )
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]


def test_other_pipelines_and_writers_do_not_fence_each_other(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    orders, refunds = DeltaRsSink(uri, "orders"), DeltaRsSink(uri, "refunds")
    orders.commit_batch(_rows(1), BatchCommit("orders", "orders.q", 0, {"o": {0: 1}}), start={})
    refunds.commit_batch(_rows(10), BatchCommit("refunds", "refunds.q", 0, {"r": {0: 1}}), start={})
    write_deltalake(uri, _rows(100), mode="append")
    orders.commit_batch(
        _rows(2), BatchCommit("orders", "orders.q", 1, {"o": {0: 2}}), start={"o": {0: 1}}
    )
    refunds.commit_batch(
        _rows(11), BatchCommit("refunds", "refunds.q", 1, {"r": {0: 2}}), start={"r": {0: 1}}
    )
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 10, 11, 100]


def test_a_batch_starting_past_a_restored_table_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    sink.commit_batch(_rows(1), BatchCommit("p", "p.q", 0, {"o": {0: 5}}), start={})
    # The checkpoint says batch 1 starts at 9: offsets 5..8 would never reach the table.
    with pytest.raises(FencingError, match=r"o\[0\] stored 5, batch starts at 9"):
        DeltaRsSink(uri, "p").commit_batch(
            _rows(2), BatchCommit("p", "p.q", 1, {"o": {0: 12}}), start={"o": {0: 9}}
        )


def test_a_table_the_sink_creates_writes_a_delta_checkpoint_every_10_commits(
    tmp_path: Path,
) -> None:
    # Every open of the table replays the JSON commits since the last checkpoint: with
    # delta-rs's default of 100 the driver's memory and each open grow batch after batch.
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    for batch in range(12):
        sink.commit_batch(_rows(batch), BatchCommit("p", "p.q", batch, {"o": {0: batch + 1}}))

    table = DeltaTable(uri)
    assert table.metadata().configuration["delta.checkpointInterval"] == "10"
    log = tmp_path / "t" / "_delta_log"
    # The 10th commit (version 9) wrote it.
    assert [p.name for p in log.glob("*.checkpoint.parquet")] == [
        "00000000000000000009.checkpoint.parquet"
    ]
    # A table that already existed keeps its own properties.
    other = str(tmp_path / "existing")
    write_deltalake(other, _rows(0))
    DeltaRsSink(other, "p").commit_batch(_rows(1), BatchCommit("p", "p.q", 0, {"o": {0: 1}}))
    assert "delta.checkpointInterval" not in DeltaTable(other).metadata().configuration


def test_a_batch_commit_leaves_log_cleanup_to_maintenance(tmp_path: Path) -> None:
    """delta-rs cleans up expired log entries after every commit unless told not to, listing
    the whole log each time (a cost that grows with every version); the sink's commits leave it
    to maintenance, whose commits apply the table's retention."""
    uri = str(tmp_path / "t")
    write_deltalake(
        uri,
        _rows(0),
        configuration={
            "delta.checkpointInterval": "3",
            "delta.logRetentionDuration": "interval 0 seconds",
        },
    )
    sink = DeltaRsSink(uri, "p")
    for batch in range(7):
        sink.commit_batch(_rows(batch + 1), BatchCommit("p", "p.q", batch, {"o": {0: batch + 1}}))
    log = Path(uri) / "_delta_log"
    # Checkpoints as the interval says (every 3rd commit), and every commit's file still there.
    assert len(list(log.glob("*.checkpoint.parquet"))) == 2
    assert len(list(log.glob("*.json"))) == 8
    # Maintenance's commit (a compaction) applies the retention: the entries before the newest
    # checkpoint go.
    DeltaTable(uri).optimize.compact()
    assert min(int(p.stem) for p in log.glob("*.json")) >= 5
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == list(range(8))


# -- a promotion of the producers' schema on a table that exists ------------------------------


def _numbers(ids: list[int], n: pa.Array) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "n": n})


def test_a_wider_number_widens_the_column_once_and_a_replay_widens_nothing(
    tmp_path: Path,
) -> None:
    """delta-rs has no type widening: the table is rewritten once with the wider column, in a
    commit of its own before the batch's; the txn actions and the rows before stay, and a
    replay of the batch neither widens again nor writes."""
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    sink.commit_batch(
        _numbers([1, 2], pa.array([1, 2], pa.int32())), BatchCommit("p", "p.q", 0, {"o": {0: 2}})
    )
    wide = _numbers([3], pa.array([2**40], pa.int64()))
    second = BatchCommit("p", "p.q", 1, {"o": {0: 3}})

    result = sink.commit_batch(wide, second, {"o": {0: 2}})

    table = DeltaTable(uri)
    assert result.written and table.version() == 2  # the rewrite, then the batch
    assert table.schema().to_arrow().field("n").type == pa.int64()
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "n": 1},
        {"id": 2, "n": 2},
        {"id": 3, "n": 2**40},
    ]
    assert table.transaction_version("p.q") == 1 and table.transaction_version("p:offset:o:0") == 3
    assert DeltaRsOffsetStore(uri, "p").read().offsets == {"o": {0: 3}}
    replay = DeltaRsSink(uri, "p").commit_batch(wide, second, {"o": {0: 2}})
    assert not replay.written and DeltaTable(uri).version() == 2


def test_a_widening_that_loses_a_commit_race_is_made_again_and_keeps_the_other_writers_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer appends between the snapshot the rewrite read and its commit: the
    rewrite's commit fails (no retry on a stale snapshot), is made again on the newer one, and
    the other writer's row is in the table, widened."""
    import deltalake

    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    sink.commit_batch(
        _numbers([1], pa.array([1], pa.int32())), BatchCommit("p", "p.q", 0, {"o": {0: 1}})
    )
    real, calls = deltalake.write_deltalake, []

    def racing(table, data, **kw):
        calls.append(kw.get("mode"))
        if len(calls) == 1:  # a concurrent writer commits first
            real(uri, _numbers([9], pa.array([9], pa.int32())), mode="append")
        return real(table, data, **kw)

    monkeypatch.setattr(deltalake, "write_deltalake", racing)
    sink.commit_batch(
        _numbers([2], pa.array([2**40], pa.int64())),
        BatchCommit("p", "p.q", 1, {"o": {0: 2}}),
        {"o": {0: 1}},
    )

    table = DeltaTable(uri)
    assert calls == ["overwrite", "overwrite"]
    assert table.schema().to_arrow().field("n").type == pa.int64()
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 9]


def test_an_upsert_widens_the_column_before_its_merge(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p", mode=WriteMode("upsert", keys=("id",)))
    sink.commit_batch(
        _numbers([1, 2], pa.array([1, 2], pa.int32())), BatchCommit("p", "p.q", 0, {"o": {0: 2}})
    )

    sink.commit_batch(
        _numbers([2, 3], pa.array([2**40, 3], pa.int64())),
        BatchCommit("p", "p.q", 1, {"o": {0: 4}}),
        {"o": {0: 2}},
    )

    table = DeltaTable(uri)
    assert table.schema().to_arrow().field("n").type == pa.int64()
    rows = sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "n": 1}, {"id": 2, "n": 2**40}, {"id": 3, "n": 3}]


def test_a_nested_promotion_beside_a_nested_field_added_lands_in_both(tmp_path: Path) -> None:
    """One version promotes r.n (int -> long) and adds r.z: the rewrite widens r.n, then the
    nested field's own commit adds r.z, then the batch."""
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    narrow = pa.struct([("n", pa.int32())])
    first = pa.table({"id": pa.array([1], pa.int64()), "r": pa.array([{"n": 1}], narrow)})
    sink.commit_batch(first, BatchCommit("p", "p.q", 0, {"o": {0: 1}}))
    wide = pa.struct([("n", pa.int64()), ("z", pa.string())])
    second = pa.table(
        {"id": pa.array([2], pa.int64()), "r": pa.array([{"n": 2**40, "z": "z"}], wide)}
    )

    sink.commit_batch(second, BatchCommit("p", "p.q", 1, {"o": {0: 2}}), {"o": {0: 1}})

    table = DeltaTable(uri)
    assert table.schema().to_arrow().field("r").type == wide
    rows = sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [r["r"] for r in rows] == [{"n": 1, "z": None}, {"n": 2**40, "z": "z"}]
