"""The delta-rs sink's data files written by Spark's own Parquet writer
(kafka_delta.sinks.delta_rs.jvm_writer), and the sink's one DeltaTable kept across batches.
Real tables on disk, the shared Spark session."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from conftest import skip_without_connectors
from kafka_delta.delta import rs_offset_store as offset_store
from kafka_delta.engine import WriteMode
from kafka_delta.offsets.model import BatchCommit
from kafka_delta.sinks.delta_rs import sink as sink_module
from kafka_delta.sinks.delta_rs.jvm_writer import STAGING_PREFIX
from kafka_delta.sinks.delta_rs.sink import DeltaRsSink, FencingError
from kafka_delta_dev.faults import InjectedCrash, armed
from support import spark_jobs

pytestmark = pytest.mark.spark


def _no_python_writer(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records any use of the pyarrow task writer (mapInArrow): the Spark path must not need it."""
    used: list[object] = []

    def task_writer(*args, **kwargs):
        used.append(args)
        raise AssertionError("the batch went through mapInArrow")

    monkeypatch.setattr(sink_module, "TaskWriter", task_writer)
    return used


def _data_files(uri: str) -> set[str]:
    return {p.name for p in Path(uri).glob("*.parquet")}


def _events(spark, ids: range, bad: tuple[int, ...] = (), wide: dict[int, int] | None = None):
    """Order-like rows with Kafka positions; ``bad`` ids are marked dead letters by the
    transform, ``wide`` puts a value into column n (a long) per id."""
    from pyspark.sql import functions as F

    wide = wide or {}
    rows = [
        (i, f"e{i % 3}", i * 1.5, wide.get(i, i), "t", i % 2, 100 + i, "bad" if i in bad else None)
        for i in ids
    ]
    schema = (
        "id long, event_type string, amount double, n long, topic string, partition int, "
        "offset long, _error string"
    )
    return spark.createDataFrame(rows, schema).repartition(2).withColumn("_error", F.col("_error"))


def _table_columns(frame):
    return frame.drop("_error")


def test_spark_writes_a_new_table_in_one_job_with_dead_letters_set_aside(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    used = _no_python_writer(monkeypatch)
    sink = DeltaRsSink(uri, "p", spark_writes_files=True)
    out = _events(spark, range(10), bad=(3, 8))

    batch, jobs = spark_jobs(spark, lambda: sink.materialize(out))

    assert len(jobs) == 1 and used == []  # one read of Kafka, no crossing into Python
    assert sorted(batch.dead.to_pylist(), key=lambda r: r["offset"]) == [
        {"topic": "t", "partition": 1, "offset": 103, "_error": "bad"},
        {"topic": "t", "partition": 0, "offset": 108, "_error": "bad"},
    ]
    assert _data_files(uri) and not (Path(uri) / "_delta_log").exists()  # staged, invisible
    assert not list(Path(uri).glob(f"{STAGING_PREFIX}*"))  # the staging folder is gone
    result = sink.commit_batch(batch.rows, BatchCommit("p", "p.q", 0, {"t": {0: 5, 1: 5}}), {})

    table = DeltaTable(uri)
    assert result.written and result.rows == 8 and table.version() == 0
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2, 4, 5, 6, 7, 9]
    assert "_error" not in table.schema().to_arrow().names
    assert _data_files(uri) == {Path(p).name for p in table.file_uris()}
    assert table.transaction_version("p.q") == 0


def test_spark_appends_to_an_existing_table_with_its_narrower_column_and_statistics(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    # The table's n is an int; the producers' is a long now (a promotion), and the table keeps
    # its column types (delta.schema_evolution: fail; with add_columns it widens the column).
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("event_type", pa.string()),
            ("amount", pa.float64()),
            ("n", pa.int32()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
        ]
    )
    write_deltalake(uri, schema.empty_table())
    used = _no_python_writer(monkeypatch)
    sink = DeltaRsSink(uri, "p", mode=WriteMode(add_columns=False), spark_writes_files=True)
    out = _events(spark, range(6), bad=(1,), wide={4: 2**40})

    batch = sink.materialize(out)
    result = sink.commit_batch(batch.rows, BatchCommit("p", "p.q", 0, {"t": {0: 3, 1: 3}}), {})

    assert used == [] and result.rows == 4
    dead = sorted(batch.dead.to_pylist(), key=lambda r: r["offset"])
    assert [d["offset"] for d in dead] == [101, 104]
    assert dead[0]["_error"] == "bad"
    assert dead[1]["_error"] == (
        "column 'n': the value 1099511627776 (bigint) does not fit the table's int column "
        "exactly (delta.schema_evolution is fail)"
    )
    table = DeltaTable(uri)
    assert table.schema().to_arrow().field("n").type == pa.int32()
    got = table.to_pyarrow_table().sort_by("id")
    assert got["id"].to_pylist() == [0, 2, 3, 5] and got["n"].to_pylist() == [0, 2, 3, 5]
    # Statistics from the footers: the pyarrow writer's exact bounds (no float bounds: a footer
    # cannot say whether a NaN is there), summed to the table's rows.
    log = sorted((Path(uri) / "_delta_log").glob("*.json"))[-1]
    added = [json.loads(line)["add"] for line in log.read_text().splitlines() if '"add"' in line]
    merged = [json.loads(a["stats"]) for a in added]
    assert sum(s["numRecords"] for s in merged) == 4
    assert min(s["minValues"]["id"] for s in merged) == 0
    assert max(s["maxValues"]["id"] for s in merged) == 5
    assert all("amount" not in s["minValues"] for s in merged)
    assert all(s["nullCount"]["event_type"] == 0 for s in merged)
    assert {s["minValues"]["topic"] for s in merged} == {"t"}


def test_a_crash_after_the_files_then_a_restart_leaves_no_duplicate_and_no_visible_orphan(
    spark, tmp_path: Path
) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p", spark_writes_files=True)
    first = _events(spark, range(4))
    batch = sink.materialize(first)
    sink.commit_batch(batch.rows, BatchCommit("p", "p.q", 0, {"t": {0: 2, 1: 2}}), {})
    committed = _data_files(uri)
    second = _events(spark, range(4, 8))

    crashed = DeltaRsSink(uri, "p", spark_writes_files=True)
    with armed("after_data_files"), pytest.raises(InjectedCrash):
        crashed.materialize(second)
    orphans = _data_files(uri) - committed
    assert orphans  # written, on disk...
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2, 3]  # unseen

    restarted = DeltaRsSink(uri, "p", spark_writes_files=True)
    start = {"t": {0: 2, 1: 2}}
    assert not restarted.check(BatchCommit("p", "p.q", 1, {"t": {0: 4, 1: 4}}), start)
    again = restarted.materialize(second)
    restarted.commit_batch(again.rows, BatchCommit("p", "p.q", 1, {"t": {0: 4, 1: 4}}), start)
    # A replay of the batch writes nothing.
    assert restarted.check(BatchCommit("p", "p.q", 1, {"t": {0: 4, 1: 4}}), start)

    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(8))
    visible = {Path(p).name for p in table.file_uris()}
    assert not visible & orphans
    removed = table.vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True
    )
    assert {Path(p).name for p in removed} == orphans
    assert _data_files(uri) == visible


def test_a_staging_folder_a_crash_left_is_invisible_and_vacuum_removes_it(
    spark, tmp_path: Path
) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p", spark_writes_files=True)
    batch = sink.materialize(_events(spark, range(4)))
    sink.commit_batch(batch.rows, BatchCommit("p", "p.q", 0, {"t": {0: 2, 1: 2}}), {})
    # As a driver killed between Spark's write and the move into the table's folder leaves it.
    staging = Path(uri) / f"{STAGING_PREFIX}crashed"
    staging.mkdir()
    (staging / "part-00000-x-c000.snappy.parquet").write_bytes(
        (Path(uri) / sorted(_data_files(uri))[0]).read_bytes()
    )

    # ... or one killed inside Spark's write: its committer's task folders, with checksums.
    attempt = staging / "_temporary" / "0" / "_temporary" / "attempt_0"
    attempt.mkdir(parents=True)
    (attempt / "part-00001-x-c000.snappy.parquet").write_bytes(b"PAR1")
    (attempt / ".part-00001-x-c000.snappy.parquet.crc").write_bytes(b"crc")

    left = sorted(str(p.relative_to(uri)) for p in staging.rglob("*") if p.is_file())
    assert len(left) == 3
    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2, 3]
    removed = table.vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True
    )
    assert sorted(removed) == left
    assert not [p for p in staging.rglob("*") if p.is_file()]


ALL_TYPES = (
    "b boolean, i8 byte, i16 short, i32 int, i64 long, f32 float, f64 double, "
    "dec decimal(10,2), big decimal(30,4), s string, bin binary, d date, ts timestamp, "
    "ntz timestamp_ntz, arr array<long>, st struct<x: int, y: string, z: struct<q: double>>, "
    "m map<string, double>, deep array<struct<k: string, v: array<int>>>"
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
            Decimal("12345678901234567890.1234"),
            "héllo",
            b"\x00\x01",
            dt.date(1500, 1, 2),  # before the Gregorian switch: never rebased
            dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC),
            dt.datetime(1200, 1, 2, 3, 4, 5, 654321),
            [1, None, 2],
            (7, "seven", (0.5,)),
            {"k": 1.0, "n": None},
            [("a", [1, 2]), ("b", None)],
        ),
        (
            False,
            -1,
            -2,
            -3,
            -(2**40),
            -1.5,
            float("nan"),
            Decimal("-0.01"),
            Decimal("0.0001"),
            "",
            b"",
            dt.date(2026, 12, 31),
            dt.datetime(1900, 1, 1, tzinfo=dt.UTC),
            dt.datetime(2026, 1, 1),
            [],
            None,  # a null parent struct
            {},
            [],
        ),
        (None,) * 18,
    ]


def _write_all_types(spark, uri: str, monkeypatch: pytest.MonkeyPatch):
    used = _no_python_writer(monkeypatch)
    frame = spark.createDataFrame(_all_types_rows(), ALL_TYPES).repartition(2)
    sink = DeltaRsSink(uri, "p", spark_writes_files=True)
    result = sink.commit_batch(frame, BatchCommit("p", "p.q", 0, {"o": {0: 3}}))
    assert result.written and result.rows == 3 and used == []
    return frame


def test_every_type_reads_back_the_same_through_delta_rs(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    frame = _write_all_types(spark, uri, monkeypatch)

    table = DeltaTable(uri)
    schema = pa.schema(table.schema().to_arrow())
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert schema.field("ntz").type == pa.timestamp("us")
    got = table.to_pyarrow_table().sort_by([("i8", "descending")]).to_pylist()
    expected = frame.toArrow().sort_by([("i8", "descending")]).to_pylist()
    assert len(got) == 3
    for mine, theirs in zip(got, expected, strict=True):
        for key, value in theirs.items():
            if isinstance(value, float) and value != value:
                assert mine[key] != mine[key], key  # NaN
            else:
                assert mine[key] == value, key
    # Timestamps as Delta's writers store them: INT64 microseconds, never Spark's INT96.
    import pyarrow.parquet as pq

    footer = pq.read_metadata(table.file_uris()[0]).schema
    for name in ("ts", "ntz"):
        column = footer.column(footer.names.index(name))
        logical = json.loads(column.logical_type.to_json())
        assert column.physical_type == "INT64", name
        assert (logical["Type"], logical["timeUnit"]) == ("Timestamp", "microseconds")
        assert logical["isAdjustedToUTC"] is (name == "ts")
    # Spark's own reader of the same files agrees, too.
    read = spark.read.parquet(*table.file_uris())
    assert sorted(map(str, read.drop("m").collect())) == sorted(map(str, frame.drop("m").collect()))


def test_every_type_reads_back_the_same_through_delta_spark(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_without_connectors(spark, {"source": "embedded", "sink": "delta_spark"})
    uri = str(tmp_path / "t")
    frame = _write_all_types(spark, uri, monkeypatch)
    read = spark.read.format("delta").load(uri)
    assert sorted(map(str, read.drop("m").collect())) == sorted(map(str, frame.drop("m").collect()))


def test_an_object_store_table_keeps_the_pyarrow_writer(spark, tmp_path: Path) -> None:
    from kafka_delta.sinks.delta_rs.file_writer import FileTarget
    from kafka_delta.sinks.delta_rs.jvm_writer import can_write

    frame = spark.createDataFrame([(1,)], "id long")
    schema = pa.schema([("id", pa.int64())])
    for remote in ("s3://bucket/t", "abfss://c@a.dfs.core.windows.net/t", "gs://b/t"):
        assert can_write(FileTarget(remote, schema), frame.schema, None) is None
    assert can_write(FileTarget(str(tmp_path / "t"), schema), frame.schema, None) is not None
    # A local table reached the way remote ones are (tests) keeps it too, and lands.
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p", spark_writes_files=True)
    sink.write_via_delta_rs = True
    tasks = []
    real = sink_module.TaskWriter

    def counting(*args, **kwargs):
        tasks.append(args)
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sink_module, "TaskWriter", counting)
        sink.commit_batch(frame, BatchCommit("p", "p.q", 0, {"o": {0: 1}}))
    assert len(tasks) == 1
    assert DeltaTable(uri).to_pyarrow_table()["id"].to_pylist() == [1]


def test_the_config_chooses_the_writer(spark, tmp_path: Path) -> None:
    from kafka_delta.config import PipelineConfig
    from kafka_delta.engine_factory import build_engine

    default = PipelineConfig.model_validate(
        {
            "pipeline_id": "p",
            "kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["t"], "consumer_group": "g"},
            "delta": {"table": str(tmp_path / "t")},
            "checkpoint": str(tmp_path / "c"),
        }
    )
    assert default.delta.file_writer == "pyarrow"
    assert not build_engine(spark, default).sink.spark_writes_files
    chosen = default.with_overrides(**{"delta.file_writer": "spark"})
    assert build_engine(spark, chosen).sink.spark_writes_files


def test_an_empty_batch_writes_no_file_and_still_commits_its_offsets(spark, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    batch = sink.materialize(_events(spark, range(4)))
    sink.commit_batch(batch.rows, BatchCommit("p", "p.q", 0, {"t": {0: 2, 1: 2}}), {})
    files = _data_files(uri)

    empty = sink.materialize(_events(spark, range(4)).where("id < 0"))
    commit = BatchCommit("p", "p.q", 1, {"t": {0: 3, 1: 2}})
    result = sink.commit_batch(empty.rows, commit, {"t": {0: 2, 1: 2}})

    assert result.written and result.rows == 0 and empty.dead is None
    assert _data_files(uri) == files and not list(Path(uri).glob(f"{STAGING_PREFIX}*"))
    assert DeltaTable(uri).transaction_version("p:offset:t:0") == 3


def _rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


def test_the_sink_reads_its_table_once_and_then_only_the_commits_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    opened = []
    real_open = offset_store.open_table

    def counting_open(*args, **kwargs):
        opened.append(args)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(sink_module, "open_table", counting_open)
    log_reads = []
    real_update = DeltaTable.update_incremental

    def counting_update(table, *args, **kwargs):
        log_reads.append(table.version())
        return real_update(table, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "update_incremental", counting_update)
    sink = DeltaRsSink(uri, "p")
    start: dict = {}
    for batch in range(25):
        end = {"o": {0: batch + 1}}
        assert not sink.check(BatchCommit("p", "p.q", batch, end), start)
        sink.commit_batch(_rows(batch), BatchCommit("p", "p.q", batch, end), start)
        start = end
        write_deltalake(uri, _rows(1000 + batch), mode="append")  # another writer, too

    # Read from scratch while there was no table (the first batch's check and commit), and once
    # it exists (the second batch's check): never again, over 50 more versions.
    assert len(opened) == 3 and sink.opens == 3
    # The commits since were read only when there were some (the other writer's and this
    # sink's own), not at each of a batch's three looks at the table (its check, its files'
    # schema, its commit): on a local disk each read lists the whole log folder.
    assert len(log_reads) <= 2 * 25
    # With no other writer, at most once a batch: after the sink's own previous commit.
    reads = len(log_reads)
    for batch in range(25, 45):
        end = {"o": {0: batch + 1}}
        assert not sink.check(BatchCommit("p", "p.q", batch, end), start)
        assert sink._table() is not None and sink._table() is not None
        sink.commit_batch(_rows(batch), BatchCommit("p", "p.q", batch, end), start)
        start = end
    assert len(log_reads) - reads <= 20
    assert sink.check(BatchCommit("p", "p.q", 44, {"o": {0: 45}}), {"o": {0: 44}})  # a replay
    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == sorted(
        [*range(45), *range(1000, 1025)]
    )


def test_the_kept_table_still_sees_a_restore_a_lost_race_and_a_table_created_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaRsSink(uri, "p")
    sink.commit_batch(_rows(1), BatchCommit("p", "p.q", 0, {"o": {0: 1}}), {})
    sink.commit_batch(_rows(2), BatchCommit("p", "p.q", 1, {"o": {0: 2}}), {"o": {0: 1}})
    sink.commit_batch(_rows(3), BatchCommit("p", "p.q", 2, {"o": {0: 3}}), {"o": {0: 2}})

    # A RESTORE to version 1 undoes batch 2: the batch after it no longer starts where the table
    # ends (the txn of batch 2 stays in the log, as a fresh read of the table also says).
    DeltaTable(uri).restore(1)
    with pytest.raises(FencingError, match=r"o\[0\] stored 2, batch starts at 3"):
        sink.check(BatchCommit("p", "p.q", 3, {"o": {0: 4}}), {"o": {0: 3}})
    assert sink._table().transaction_version("p.q") == DeltaTable(uri).transaction_version("p.q")

    # Another writer commits between this run's checks and its commit: the commit is tried
    # again on the table as it is then (brought up to date, not read afresh), and lands.
    real_commit, raced = sink._commit_files, []

    def another_writer_first(table, files, properties):
        if not raced:
            raced.append(table.version())
            write_deltalake(uri, _rows(100), mode="append")
        return real_commit(table, files, properties)

    monkeypatch.setattr(sink, "_commit_files", another_writer_first)
    opens = sink.opens
    result = sink.commit_batch(_rows(3), BatchCommit("p", "p.q", 3, {"o": {0: 3}}), {"o": {0: 2}})
    assert result.delta_version == raced[0] + 2 and sink.opens == opens
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3, 100]
    monkeypatch.undo()

    # The table deleted and created again by someone else, with fewer versions than before: the
    # sink reads the new table, not the old one's snapshot.
    import shutil

    shutil.rmtree(uri)
    write_deltalake(uri, _rows(100))
    opens = sink.opens
    assert not sink.check(BatchCommit("p", "p.q", 0, {"o": {0: 1}}), {})
    assert sink.opens == opens + 1
    sink.commit_batch(_rows(5), BatchCommit("p", "p.q", 0, {"o": {0: 1}}), {})
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [5, 100]

    # ... and created again with more versions than the sink saw: the same.
    shutil.rmtree(uri)
    for i in range(6):
        write_deltalake(uri, _rows(200 + i), mode="append")
    sink.commit_batch(_rows(6), BatchCommit("p", "p.q2", 0, {"o": {0: 1}}), {})
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [
        6,
        *range(200, 206),
    ]
    # A table deleted under the run: no table, as for a new run.
    shutil.rmtree(uri)
    assert sink._table() is None
