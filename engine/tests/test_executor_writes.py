"""The delta-rs sink's data files: written by Spark's tasks (or the driver, for Arrow), committed
by one delta-rs commit on the driver. Real tables on disk; Spark only where it is the point."""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from conftest import skip_without_connectors
from kafka_delta.delta.schema import SchemaMismatchError
from kafka_delta.engine import WriteMode
from kafka_delta.offsets.model import BatchCommit
from kafka_delta.sinks.delta_rs import sink as sink_module
from kafka_delta.sinks.delta_rs.file_writer import (
    FileTarget,
    UnsupportedTableError,
    write_files,
)
from kafka_delta.sinks.delta_rs.sink import DeltaRsSink, FencingError
from support import spark_jobs


def _rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


def _data_files(uri: str) -> set[str]:
    return {p.name for p in Path(uri).glob("*.parquet")}


def _vacuum(uri: str) -> list[str]:
    # full=True: delta-rs's default ("lite") vacuum deletes only files a remove action names;
    # files no commit ever named need the listing of a full one (delta-spark's VACUUM lists).
    return DeltaTable(uri).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True
    )


# -- statistics ------------------------------------------------------------------------------


def test_file_statistics_hold_only_exact_bounds(tmp_path: Path) -> None:
    table = pa.table(
        {
            "i": pa.array([3, None, -7], pa.int64()),
            "f": pa.array([1.5, -2.25, None], pa.float64()),
            "nan": pa.array([1.0, math.nan, 3.0], pa.float64()),
            "inf": pa.array([1.0, math.inf, 3.0], pa.float64()),
            "s": pa.array(["b", "a", None], pa.string()),
            "long_s": pa.array(["a" * 40, "b", "c"], pa.string()),
            "accent": pa.array(["é", "z", "a"], pa.string()),
            "d": pa.array([dt.date(2026, 1, 2), dt.date(2025, 12, 31), None], pa.date32()),
            "ts": pa.array(
                [dt.datetime(2026, 1, 1, 0, 0, 0, 123456)] * 3, pa.timestamp("us", "UTC")
            ),
            "l": pa.array([[1], None, [2]], pa.list_(pa.int64())),
        }
    )
    target = FileTarget(str(tmp_path / "t"), table.schema)
    # Two batches of one file: bounds merge across them.
    (written,) = write_files([table.slice(0, 1), table.slice(1)], target)

    stats = json.loads(written["stats"])
    assert written["num_records"] == stats["numRecords"] == 3
    assert stats["minValues"] == {"i": -7, "f": -2.25, "s": "a", "accent": "a", "d": "2025-12-31"}
    # "é" is the max of "accent", but not ASCII; a 40-char min is not kept; NaN and infinity
    # poison float bounds; timestamps, lists keep none.
    assert stats["maxValues"] == {"i": 3, "f": 1.5, "s": "b", "long_s": "c", "d": "2026-01-02"}
    assert stats["nullCount"] == {
        "i": 1,
        "f": 1,
        "nan": 0,
        "inf": 0,
        "s": 1,
        "long_s": 0,
        "accent": 0,
        "d": 1,
        "ts": 0,
    }
    assert written["path"].startswith("part-00000-") and written["path"].endswith(
        "-c000.snappy.parquet"
    )
    assert written["size"] == (tmp_path / "t" / written["path"]).stat().st_size


def test_statistics_stop_at_the_tables_indexed_column_count(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(
        uri,
        pa.table({"a": pa.array([1], pa.int64()), "b": pa.array([2], pa.int64())}),
        configuration={"delta.dataSkippingNumIndexedCols": "1"},
    )
    DeltaRsSink(uri, "p").commit_batch(
        pa.table({"a": pa.array([5], pa.int64()), "b": pa.array([6], pa.int64())}),
        BatchCommit("p", "p.q", 0, {"o": {0: 1}}),
    )
    newest = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    stats = next(row for row in newest if row.get("min.a") == 5)
    assert stats["max.a"] == 5 and stats.get("max.b") is None


# -- what is refused before anything is written ----------------------------------------------


def test_a_batch_whose_schema_differs_from_the_tables_is_refused_with_one_error(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p", mode=WriteMode(add_columns=False))  # delta.schema_evolution: fail
    sink.commit_batch(_rows(1), BatchCommit("p", "p.q", 0, {"o": {0: 1}}))
    files, version = _data_files(uri), DeltaTable(uri).version()

    bad = pa.table({"id": pa.array(["x"]), "extra": pa.array([1.0])})
    with pytest.raises(SchemaMismatchError) as error:
        sink.commit_batch(bad, BatchCommit("p", "p.q", 1, {"o": {0: 2}}), start={"o": {0: 1}})

    message = str(error.value)
    assert "column 'id' is string in the batch, int64 in the table" in message
    assert "extra column 'extra'" in message and "Nothing was written" in message
    assert _data_files(uri) == files and DeltaTable(uri).version() == version


def test_new_columns_are_added_only_when_the_rest_of_the_batch_fits_the_table(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")  # delta.schema_evolution: add_columns, the default
    sink.commit_batch(_rows(1), BatchCommit("p", "p.q", 0, {"o": {0: 1}}))
    version = DeltaTable(uri).version()

    bad = pa.table({"id": pa.array(["x"]), "extra": pa.array([1.0])})
    with pytest.raises(SchemaMismatchError, match="column 'id' is string in the batch"):
        sink.commit_batch(bad, BatchCommit("p", "p.q", 1, {"o": {0: 2}}), start={"o": {0: 1}})
    # Refused for `id`: the table did not gain `extra` either.
    assert DeltaTable(uri).version() == version
    assert "extra" not in DeltaTable(uri).schema().to_arrow().names

    good = pa.table({"id": pa.array([2], pa.int64()), "extra": pa.array([1.5])})
    sink.commit_batch(good, BatchCommit("p", "p.q", 1, {"o": {0: 2}}), start={"o": {0: 1}})
    # One commit adds the column, the next holds the batch; the first row reads null in it.
    assert DeltaTable(uri).version() == version + 2
    rows = sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [r["extra"] for r in rows] == [None, 1.5]


def test_a_partitioned_table_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    data = pa.table({"id": pa.array([1], pa.int64()), "day": pa.array(["d1"])})
    write_deltalake(uri, data, partition_by=["day"])
    before = sorted(str(p) for p in Path(uri).rglob("*.parquet"))

    with pytest.raises(UnsupportedTableError, match=r"partitioned by \['day'\]"):
        DeltaRsSink(uri, "p").commit_batch(data, BatchCommit("p", "p.q", 0, {"o": {0: 1}}))

    assert sorted(str(p) for p in Path(uri).rglob("*.parquet")) == before
    assert DeltaTable(uri).version() == 0


# -- files no commit names -------------------------------------------------------------------


def test_files_of_a_batch_that_never_committed_are_invisible_and_vacuum_removes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    DeltaRsSink(uri, "p").commit_batch(_rows(1), BatchCommit("p", "p.q", 0, {"o": {0: 1}}))
    committed = _data_files(uri)

    def dies_before_committing(*args, **kwargs):
        raise RuntimeError("the driver died between writing the files and committing them")

    crashed = DeltaRsSink(uri, "p")
    monkeypatch.setattr(crashed, "_commit_files", dies_before_committing)
    with pytest.raises(RuntimeError, match="died"):
        crashed.commit_batch(_rows(2, 3), BatchCommit("p", "p.q", 1, {"o": {0: 3}}), {"o": {0: 1}})
    orphans = _data_files(uri) - committed
    assert len(orphans) == 1  # written, on disk...
    assert DeltaTable(uri).to_pyarrow_table()["id"].to_pylist() == [1]  # ...and invisible

    # The batch re-runs and commits files of its own; the orphan stays out of the table.
    DeltaRsSink(uri, "p").commit_batch(
        _rows(2, 3), BatchCommit("p", "p.q", 1, {"o": {0: 3}}), {"o": {0: 1}}
    )
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]

    removed = _vacuum(uri)

    assert {Path(p).name for p in removed} == orphans
    assert _data_files(uri) & orphans == set()
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]


def test_a_batch_that_loses_the_fencing_check_after_writing_leaves_only_invisible_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    run_a, run_b = DeltaRsSink(uri, "p"), DeltaRsSink(uri, "p")
    run_a.commit_batch(_rows(1), BatchCommit("p", "p.run-a", 0, {"o": {0: 1}}), start={})
    real_commit = run_b._commit_files

    def run_a_commits_first(table, files, properties):
        # Between run B's checks (and file writes) and its commit, run A commits the range.
        run_a.commit_batch(
            _rows(2, 3), BatchCommit("p", "p.run-a", 1, {"o": {0: 3}}), {"o": {0: 1}}
        )
        return real_commit(table, files, properties)

    monkeypatch.setattr(run_b, "_commit_files", run_a_commits_first)
    before = _data_files(uri)
    with pytest.raises(FencingError, match="does not start where the table ends"):
        run_b.commit_batch(
            _rows(2, 3), BatchCommit("p", "p.run-b", 0, {"o": {0: 3}}), start={"o": {0: 1}}
        )

    visible = {Path(p).name for p in DeltaTable(uri).file_uris()}
    orphans = _data_files(uri) - visible
    assert len(orphans) == 1 and orphans <= _data_files(uri) - before
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]
    assert {Path(p).name for p in _vacuum(uri)} == orphans
    assert _data_files(uri) == visible


def test_a_commit_race_lost_to_another_writer_recommits_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    sink.commit_batch(_rows(1), BatchCommit("p", "p.q", 0, {"o": {0: 1}}))
    real_write, writes = sink._write_files, []

    def write_then_another_writer_commits(table, rows):
        files = real_write(table, rows)
        writes.append(files)
        write_deltalake(uri, _rows(100), mode="append")  # e.g. another pipeline's commit
        return files

    monkeypatch.setattr(sink, "_write_files", write_then_another_writer_commits)
    before = _data_files(uri)

    result = sink.commit_batch(
        _rows(2, 3), BatchCommit("p", "p.q", 1, {"o": {0: 3}}), {"o": {0: 1}}
    )

    assert result.written and result.delta_version == 2 and len(writes) == 1
    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3, 100]
    assert _data_files(uri) == {Path(p).name for p in table.file_uris()}  # nothing written twice
    assert len(_data_files(uri) - before) == 2  # this batch's file and the other writer's


def test_files_go_through_delta_rs_object_store_as_for_a_remote_table(tmp_path: Path) -> None:
    # s3://, abfss://, gs:// tables are written through delta-rs's object store with the
    # table's storage options; the same route, on a local table.
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    sink.write_via_delta_rs = True
    sink.commit_batch(_rows(1, 2), BatchCommit("p", "p.q", 0, {"o": {0: 2}}))
    sink.commit_batch(_rows(3), BatchCommit("p", "p.q", 1, {"o": {0: 3}}), start={"o": {0: 2}})
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]


# -- written by Spark's tasks ----------------------------------------------------------------

ALL_TYPES = (
    "b boolean, i8 byte, i16 short, i32 int, i64 long, f32 float, f64 double, "
    "dec decimal(10,2), s string, bin binary, d date, ts timestamp, "
    "arr array<long>, st struct<x: int, y: string>, m map<string, double>"
)


def _all_types_rows() -> list[tuple]:
    return [
        (
            True,
            1,
            2,
            3,
            2**40,
            1.5,
            2.25,
            Decimal("12.34"),
            "héllo",
            b"\x00\x01",
            dt.date(2026, 1, 2),
            dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC),
            [1, 2],
            (7, "seven"),
            {"k": 1.0},
        ),
        (None,) * 15,
    ]


def _write_all_types(spark, uri: str):
    frame = spark.createDataFrame(_all_types_rows(), ALL_TYPES).repartition(2)
    result = DeltaRsSink(uri, "p").commit_batch(frame, BatchCommit("p", "p.q", 0, {"o": {0: 2}}))
    assert result.written and result.rows == 2 and result.delta_version == 0
    return frame


@pytest.mark.spark
def test_rows_written_by_the_tasks_read_back_the_same_through_delta_rs(
    spark, tmp_path: Path
) -> None:
    uri = str(tmp_path / "t")
    frame = _write_all_types(spark, uri)

    table = DeltaTable(uri)
    schema = pa.schema(table.schema().to_arrow())
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
    got = table.to_pyarrow_table().sort_by([("i64", "descending")]).to_pylist()
    expected = frame.toArrow().sort_by([("i64", "descending")]).to_pylist()
    assert got == expected
    files = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert sum(f["num_records"] for f in files) == 2


@pytest.mark.spark
def test_rows_written_by_the_tasks_read_back_the_same_through_delta_spark(
    spark, tmp_path: Path
) -> None:
    skip_without_connectors(spark, {"source": "embedded", "sink": "delta_spark"})
    from chispa import assert_df_equality

    uri = str(tmp_path / "t")
    frame = _write_all_types(spark, uri)

    read = spark.read.format("delta").load(uri)
    # Spark cannot sort rows by a map column (chispa's ignore_row_order sorts): compared apart.
    assert_df_equality(read.drop("m"), frame.drop("m"), ignore_row_order=True, ignore_nullable=True)
    assert sorted(map(str, read.select("i64", "m").collect())) == sorted(
        map(str, frame.select("i64", "m").collect())
    )


@pytest.mark.spark
def test_a_replayed_or_fenced_batch_writes_no_data_file(spark, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    frame = spark.createDataFrame([(i,) for i in range(10)], "id long").repartition(3)
    first = sink.commit_batch(frame, BatchCommit("p", "p.q", 0, {"o": {0: 10}}), start={})
    files = _data_files(uri)
    assert first.written and first.rows == 10 and len(files) == 3  # one file per task

    replay = sink.commit_batch(frame, BatchCommit("p", "p.q", 0, {"o": {0: 10}}), start={})
    assert not replay.written
    with pytest.raises(FencingError):
        DeltaRsSink(uri, "p").commit_batch(
            frame, BatchCommit("p", "p.other", 0, {"o": {0: 10}}), start={}
        )

    assert _data_files(uri) == files
    assert DeltaTable(uri).version() == 0


@pytest.mark.spark
def test_a_spark_batch_of_the_wrong_schema_is_refused_before_any_task_runs(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    DeltaRsSink(uri, "p").commit_batch(_rows(1), BatchCommit("p", "p.q", 0, {"o": {0: 1}}))
    tasks = []
    monkeypatch.setattr(sink_module, "TaskWriter", lambda target, marks=None: tasks.append(target))
    frame = spark.createDataFrame([("x",)], "id string")

    with pytest.raises(SchemaMismatchError, match="column 'id' is string in the batch"):
        DeltaRsSink(uri, "p").commit_batch(
            frame, BatchCommit("p", "p.q", 1, {"o": {0: 2}}), {"o": {0: 1}}
        )

    assert tasks == [] and len(_data_files(uri)) == 1


@pytest.mark.spark
def test_one_spark_job_writes_the_files_and_finds_the_dead_letters(spark, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    bad = F.col("id").isin(3, 8)
    out = spark.range(0, 10, numPartitions=2).select(
        "id",
        F.lit("t").alias("topic"),
        (F.col("id") % 2).cast("int").alias("partition"),
        (F.col("id") + 100).alias("offset"),
        F.when(bad, F.concat(F.lit("bad "), F.col("id").cast("string"))).alias("_error"),
    )
    batch, jobs = spark_jobs(spark, lambda: sink.materialize(out))

    # Kafka is read once: the same job wrote the files and set the dead letters aside.
    assert len(jobs) == 1
    assert sorted(batch.dead.to_pylist(), key=lambda r: r["offset"]) == [
        {"topic": "t", "partition": 1, "offset": 103, "_error": "bad 3"},
        {"topic": "t", "partition": 0, "offset": 108, "_error": "bad 8"},
    ]
    assert _data_files(uri) and not (Path(uri) / "_delta_log").exists()  # staged, invisible

    result = sink.commit_batch(batch.rows, BatchCommit("p", "p.q", 0, {"t": {0: 5, 1: 5}}), {})

    table = DeltaTable(uri)
    assert result.written and result.rows == 8 and table.version() == 0
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2, 4, 5, 6, 7, 9]
    assert "_error" not in table.schema().to_arrow().names
