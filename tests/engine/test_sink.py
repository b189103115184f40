"""The delta-rs sink and offset store, on real Delta tables on disk (replay and upsert, shared
by both sinks, are in test_engine_contract.py)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from kafka_delta.offsets.model import BatchCommit, parse_user_metadata
from kafka_delta.sinks.delta_rs.offset_store import DeltaRsOffsetStore
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
