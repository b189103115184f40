"""The delta-rs sink and offset store, on real Delta tables on disk."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from {{ cookiecutter.package_name }}.embedded.offset_store import DeltaRsOffsetStore
from {{ cookiecutter.package_name }}.embedded.sink import DeltaRsSink
from {{ cookiecutter.package_name }}.offsets import BatchCommit, parse_user_metadata


def _rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


def test_batch_lands_in_one_commit_with_data_txn_and_end_offsets(tmp_path: Path) -> None:
    sink = DeltaRsSink(str(tmp_path / "t"))
    commit = BatchCommit("p", "p.q1", 0, {"orders": {0: 3, 1: 2}})
    result = sink.commit_batch(_rows(1, 2, 3), commit)

    table = DeltaTable(str(tmp_path / "t"))
    assert (result.written, result.rows, result.delta_version) == (True, 3, table.version())
    assert table.version() == 0  # exactly one commit
    assert table.transaction_version("p.q1") == 0
    info = table.history(1)[0]
    assert parse_user_metadata(info["userMetadata"], "p") == commit
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]


def test_replayed_batch_writes_nothing_and_still_reports_success(tmp_path: Path) -> None:
    sink = DeltaRsSink(str(tmp_path / "t"))
    sink.commit_batch(_rows(1, 2), BatchCommit("p", "p.q1", 0, {"o": {0: 2}}))
    sink.commit_batch(_rows(3), BatchCommit("p", "p.q1", 1, {"o": {0: 3}}))
    version = DeltaTable(str(tmp_path / "t")).version()

    for replay in (0, 1):
        result = sink.commit_batch(_rows(99), BatchCommit("p", "p.q1", replay, {"o": {0: 3}}))
        assert (result.written, result.rows, result.delta_version) == (False, 0, None)

    table = DeltaTable(str(tmp_path / "t"))
    assert table.version() == version
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]


def test_new_checkpoint_app_id_restarting_at_batch_zero_is_written(tmp_path: Path) -> None:
    sink = DeltaRsSink(str(tmp_path / "t"))
    for batch in range(3):
        sink.commit_batch(_rows(batch), BatchCommit("p", "p.old", batch, {"o": {0: batch + 1}}))
    result = sink.commit_batch(_rows(10), BatchCommit("p", "p.new", 0, {"o": {0: 4}}))
    assert result.written
    assert sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table()["id"].to_pylist()) == [
        0,
        1,
        2,
        10,
    ]


def test_empty_batch_still_commits_its_offsets(tmp_path: Path) -> None:
    # A batch of only transaction markers, or one the transform filters out entirely, must
    # still advance the stored offsets.
    sink = DeltaRsSink(str(tmp_path / "t"))
    sink.commit_batch(_rows(1), BatchCommit("p", "p.q", 0, {"o": {0: 1}}))
    result = sink.commit_batch(_rows(), BatchCommit("p", "p.q", 1, {"o": {0: 3}}))
    assert result.written and result.rows == 0
    stored = DeltaRsOffsetStore(str(tmp_path / "t"), "p").read()
    assert stored is not None and stored.offsets == {"o": {0: 3}}


def test_offset_store_reads_this_pipelines_newest_offsets_past_other_writers(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri)
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
