"""The checkpoint's offset log as a real Spark writes it, in both of its formats: v1 (one offset
line per source) and v2 (Spark 4.2's ``spark.sql.streaming.offsetLog.formatVersion=2``, one
``sourceId:offset`` line per source). The offsets read back are the ones Spark planned."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kafka_delta.recovery.checkpoint import CheckpointLog, CheckpointMismatchError

pytestmark = pytest.mark.spark

FORMAT_VERSION = "spark.sql.streaming.offsetLog.formatVersion"


@contextmanager
def _session_conf(spark, key: str, value: str) -> Iterator[None]:
    """``key`` set to ``value`` for the block only: the session is shared by the whole suite."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def _run_batches(spark, checkpoint: Path, runs: int) -> list[tuple[int, str]]:
    """``runs`` availableNow runs of a rate source on one checkpoint (one batch each); the
    ``(batch id, end offset JSON)`` pairs Spark reported planning."""
    planned: list[tuple[int, str]] = []
    for _ in range(runs):
        stream = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
        query = (
            stream.writeStream.foreachBatch(lambda df, batch_id: None)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
        finally:
            query.stop()
        assert query.exception() is None, query.exception()
        planned += [(p.batchId, p.sources[0].endOffset) for p in query.recentProgress]
    return planned


@pytest.mark.parametrize("format_version", ["1", "2"])
def test_reads_the_offsets_spark_planned_in_either_offset_log_format(
    spark, tmp_path: Path, format_version: str
) -> None:
    checkpoint = tmp_path / "checkpoint"
    with _session_conf(spark, FORMAT_VERSION, format_version):
        planned = _run_batches(spark, checkpoint, runs=2)

    assert [batch for batch, _ in planned] == [0, 1]
    first_line = (checkpoint / "offsets" / "1").read_text().splitlines()[0]
    assert first_line == f"v{format_version}"  # Spark really wrote that format
    log = CheckpointLog(None, str(checkpoint))
    for batch, end in planned:
        assert json.loads(log.source_offset_json(batch)) == json.loads(end), batch

    # end_offsets on the same Spark-written entry, its source offset swapped for a Kafka one
    # (a v2 line keeps its "sourceId:" prefix).
    entry = checkpoint / "offsets" / "1"
    lines = entry.read_text().splitlines()
    prefix = lines[2][: lines[2].index(":") + 1] if format_version == "2" else ""
    entry.write_text("\n".join([*lines[:2], prefix + '{"orders":{"1":7,"0":12}}']))
    assert log.end_offsets(1) == {"orders": {0: 12, 1: 7}}


def test_an_unknown_offset_log_version_stops_with_the_version_named(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text('v3\n{"batchWatermarkMs":0}\n0:{"o":{"0":1}}')

    with pytest.raises(CheckpointMismatchError, match="'v3'"):
        CheckpointLog(None, str(tmp_path)).end_offsets(3)


@pytest.mark.parametrize(
    "sources",
    [
        ['0:{"o":{"0":1}}', '1:{"p":{"0":2}}'],  # two sources
        ["0:-"],  # no offset for the source
        [],  # no source line at all
    ],
)
def test_a_v2_entry_without_exactly_one_source_offset_is_refused(
    tmp_path: Path, sources: list[str]
) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("\n".join(["v2", "{}", *sources]))

    with pytest.raises(CheckpointMismatchError):
        CheckpointLog(None, str(tmp_path)).end_offsets(0)
