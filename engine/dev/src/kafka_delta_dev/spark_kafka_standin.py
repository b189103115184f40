"""A stand-in for Spark's built-in ``kafka`` source, for testing the cluster engine's driver logic
where the connector's jars cannot be had (they come only from Maven).

Name it in a config as ``engine: {source: "kafka_delta_dev.spark_kafka_standin:SparkKafkaStandIn",
sink: ...}``. It is :class:`kafka_delta.sources.spark_kafka.SparkKafkaSource` (the same options,
the same ``startingOffsets`` for a new checkpoint, the same decoding through ``mapInArrow``),
with one step replaced: instead of Spark's JVM ``kafka`` format, the stream is read by a Spark 4
Python data source that plans micro-batches as Spark's ``KafkaMicroBatchStream``
(spark-sql-kafka-0-10, Spark 4) does. Reproduced, from Spark's sources:

- **initial offsets** (``initialOffset``): read from ``<checkpoint>/sources/0/0`` when the
  checkpoint has them, else resolved from ``startingOffsets`` (``earliest``, ``latest``, or JSON
  naming every assigned partition, ``-2``/``-1`` resolved) and written there first, as
  ``KafkaSourceInitialOffsetWriter`` writes them: a zero byte, ``v1`` and a newline, then the
  offsets' JSON; batch 0 starts there, also when it is planned again after a crash;
- **the offsets JSON**: ``{"topic":{"partition":offset}}``, next offset to read, in the offset log;
- **latest offsets** (``latestOffset``): every partition the subscription now has; under
  ``Trigger.AvailableNow`` fetched once, at the first plan, and never beyond (Spark's
  ``allDataForTriggerAvailableNow``); a latest offset below the one known is fetched again
  (``fetchOffset.numRetries`` times, ``fetchOffset.retryIntervalMs`` apart) and then taken;
- **``maxOffsetsPerTrigger``** (``rateLimit``): the limit shared in proportion to what each
  partition has, a share below one record rounded up, others down, never past the latest; a
  partition new to the plan counted from its earliest offset;
- **the ranges of a batch** (``getOffsetRangesFromResolvedOffsets``): a partition new to the
  plan starts at its earliest offset (data loss reported when that is not 0); a partition gone
  since the last plan, or one whose offset went backwards, is data loss; ranges split to about
  ``minPartitions`` tasks (``KafkaOffsetRangeCalculator``);
- **data loss**: with ``failOnDataLoss`` true the query fails with Spark's message; false skips
  (logged), and a range starting below the earliest offset reads from the earliest;
- **the columns**: key, value, topic, partition, offset, timestamp, timestampType, headers
  (``includeHeaders``), read under ``kafka.isolation.level`` (the engine passes read_committed).

What it cannot prove: the JVM Kafka client itself (its fetching, consumer pool and ``kafka.*``
settings other than the isolation level), Spark's Kafka metrics, ``minOffsetsPerTrigger`` and
timestamp-based starting offsets (the engine uses neither), and checkpoints on object storage
(the stand-in writes ``sources/0/0`` on a local file system only).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from kafka_delta.contract import KAFKA_SCHEMA
from kafka_delta.runtime.graceful_stop import ignore_stop_signals_in_spark_helper, in_spark_planner
from kafka_delta.sources.spark_kafka import SparkKafkaSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from kafka_delta.config import PipelineConfig
    from kafka_delta.decoding.spec import DecodeSpec

log = logging.getLogger(__name__)

NAME = "kafka_standin"
# The one option Spark's own source does not take: where its checkpoint is (Spark hands its
# source the checkpoint's metadata path itself; a Python data source is not told).
CHECKPOINT_OPTION = "standin.checkpointLocation"
INITIAL_OFFSETS_VERSION = 1
EARLIEST, LATEST = -2, -1
# KafkaSourceProvider.INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_TRUE
_FAIL_ON_DATA_LOSS = (
    "Some data may have been lost because they are not available in Kafka any more; either the "
    "data was aged out by Kafka or the topic may have been deleted before all the data in the "
    "topic was processed. If you want your streaming query to continue on such cases, set the "
    'source option "failOnDataLoss" to "false".'
)

TP = tuple[str, int]
PartitionOffsets = dict[TP, int]


class IllegalStateException(RuntimeError):
    """What Spark's kafka source throws on data loss with ``failOnDataLoss`` true."""


class SparkKafkaStandIn(SparkKafkaSource):
    """:class:`~kafka_delta.sources.spark_kafka.SparkKafkaSource` reading through the stand-in
    (see the module docstring); built by the engine from ``engine.source`` with the config."""

    def __init__(self, config: PipelineConfig) -> None:
        super().__init__(config.kafka)
        self.checkpoint = config.checkpoint

    def worker_modules(self, decode: DecodeSpec | None = None) -> tuple[str, ...]:
        return ("confluent_kafka", __name__, *super().worker_modules(decode))

    def read_stream(self, spark: SparkSession, options: dict[str, str]) -> DataFrame:
        spark.dataSource.register(SparkKafkaStandInSource)
        with_checkpoint = {**options, CHECKPOINT_OPTION: self.checkpoint}
        return spark.readStream.format(NAME).options(**with_checkpoint).load()


class SparkKafkaStandInSource(DataSource):
    """``spark.readStream.format("kafka_standin")``: Spark's kafka source's options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return KAFKA_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return StandInStreamReader(self.options)


class OffsetRange(InputPartition):
    """One Spark task: offsets [start, end) of one topic-partition (``KafkaOffsetRange``)."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    @property
    def size(self) -> int:
        return self.end - self.start


def rate_limit(limit: int, start: PartitionOffsets, until: PartitionOffsets, earliest) -> dict:
    """Spark's ``KafkaMicroBatchStream.rateLimit``: ``limit`` records shared across partitions
    in proportion to what each has; ``earliest(partitions)`` gives where the partitions new to
    the plan begin (asked only when there are some)."""
    new = [tp for tp in until if tp not in start]
    begins = {**(earliest(new) if new else {}), **start}
    sizes = {
        tp: end - begins[tp] for tp, end in until.items() if tp in begins and end - begins[tp] > 0
    }
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(until)
    limited = {}
    for tp, end in until.items():
        if tp not in sizes:
            limited[tp] = end
            continue
        prorate = limit * (sizes[tp] / total)
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        limited[tp] = min(end, begins[tp] + share)
    return limited


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Spark's ``KafkaOffsetRangeCalculator.getRanges``: empty ranges dropped; with fewer ranges
    than ``min_partitions``, the large ones split so that about that many tasks run."""
    ranges = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)

    def parts(size: int, of: int, count: int) -> int:
        return max(round(size / of * count), 1)

    unsplit = [r for r in ranges if parts(r.size, total, min_partitions) == 1]
    split_total = total - sum(r.size for r in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    out = []
    for r in ranges:
        count = 1 if r in unsplit else parts(r.size, split_total, split_min)
        remaining, begin = r.size, r.start
        for part in range(count):
            this = remaining // (count - part)
            remaining -= this
            end = min(begin + this, r.end)
            out.append(OffsetRange(r.topic, r.partition, begin, end))
            begin = end
    return [r for r in out if r.size > 0]


def _to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = int(offset)
    return nested


def _from_json(data: Mapping[str, Mapping[str, int]]) -> PartitionOffsets:
    return {(t, int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}


class StandInStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch planning of Spark's ``KafkaMicroBatchStream`` (see the module docstring)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        if in_spark_planner():
            # Spark's own source plans in the JVM, out of reach of a process-group signal: so
            # does this one (see kafka_delta.runtime.graceful_stop).
            ignore_stop_signals_in_spark_helper()
        # Spark's options are case-insensitive (they reach a Python source in lower case).
        options = {key.lower(): value for key, value in options.items()}
        self.options = options
        self.topics = [t.strip() for t in options["subscribe"].split(",") if t.strip()]
        self.fail_on_data_loss = options.get("failondataloss", "true").lower() == "true"
        limit = options.get("maxoffsetspertrigger")
        self.max_offsets = int(limit) if limit else None
        min_partitions = options.get("minpartitions")
        self.min_partitions = int(min_partitions) if min_partitions else None
        self.retries = int(options.get("fetchoffset.numretries", "3"))
        self.retry_interval_s = int(options.get("fetchoffset.retryintervalms", "1000")) / 1000
        self.client = {
            "bootstrap.servers": options["kafka.bootstrap.servers"],
            "isolation.level": options.get("kafka.isolation.level", "read_uncommitted"),
        }
        self.metadata_path = Path(options[CHECKPOINT_OPTION.lower()]) / "sources" / "0"
        self.available_now = False
        self.prefetched: PartitionOffsets | None = None
        self._client: Any = None

    # -- Kafka (the driver's KafkaOffsetReaderAdmin) ------------------------------------------

    def _admin(self) -> Any:
        """One admin client for the reader's life: its futures resolve only while it lives."""
        if self._client is None:
            from confluent_kafka.admin import AdminClient

            self._client = AdminClient({"bootstrap.servers": self.client["bootstrap.servers"]})
        return self._client

    def assigned(self) -> list[TP]:
        """The subscription's partitions now (a topic that does not exist has none)."""
        metadata = self._admin().list_topics(timeout=30)
        return sorted(
            (topic, partition)
            for topic in self.topics
            if topic in metadata.topics and metadata.topics[topic].error is None
            for partition in metadata.topics[topic].partitions
        )

    def _list_offsets(self, partitions: list[TP], latest: bool) -> PartitionOffsets:
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        if not partitions:
            return {}
        spec = OffsetSpec.latest() if latest else OffsetSpec.earliest()
        isolation = (
            IsolationLevel.READ_COMMITTED
            if self.client["isolation.level"] == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )
        futures = self._admin().list_offsets(
            {TopicPartition(t, p): spec for t, p in partitions},
            isolation_level=isolation,
            request_timeout=30,
        )
        return {(tp.topic, tp.partition): f.result(60).offset for tp, f in futures.items()}

    def earliest(self, partitions: list[TP]) -> PartitionOffsets:
        return self._list_offsets(partitions, latest=False)

    def latest(self, known: PartitionOffsets | None = None) -> PartitionOffsets:
        """``fetchLatestOffsets``: a latest offset below a known one is fetched again."""
        for attempt in range(1, self.retries + 1):
            offsets = self._list_offsets(self.assigned(), latest=True)
            wrong = [
                (tp, k, offsets[tp]) for tp, k in (known or {}).items() if offsets.get(tp, k) < k
            ]
            if not wrong or attempt == self.retries:
                return offsets
            log.warning("incorrect latest offsets %s: fetching again", wrong)
            time.sleep(self.retry_interval_s)
        return offsets

    # -- planning ---------------------------------------------------------------------------

    def _report_data_loss(self, message: str) -> None:
        if self.fail_on_data_loss:
            raise IllegalStateException(f"{message}. {_FAIL_ON_DATA_LOSS}")
        log.warning("%s. Some data may have been lost (failOnDataLoss is false)", message)

    def initialOffset(self) -> dict[str, Any]:
        stored = self.metadata_path / "0"
        if stored.is_file():
            text = stored.read_bytes().decode("utf-8").lstrip("\x00")
            version, _, body = text.partition("\n")
            if version != f"v{INITIAL_OFFSETS_VERSION}":
                raise IllegalStateException(f"{stored}: unsupported log version {version!r}")
            return json.loads(body)
        partitions = self.assigned()
        starting = self.options.get("startingoffsets", "latest").strip()
        if starting == "earliest":
            offsets = self.earliest(partitions)
        elif starting == "latest":
            offsets = self.latest()
        else:
            specific = _from_json(json.loads(starting))
            if set(specific) != set(partitions):
                raise AssertionError(
                    "If startingOffsets contains specific offsets, you must specify all "
                    "TopicPartitions.\nUse -1 for latest, -2 for earliest, if you don't care.\n"
                    f"Specified: {sorted(specific)} Assigned: {partitions}"
                )
            earliest = self.earliest([tp for tp, o in specific.items() if o == EARLIEST])
            latest = self._list_offsets([tp for tp, o in specific.items() if o == LATEST], True)
            offsets = {**specific, **earliest, **latest}
        initial = _to_json(offsets)
        # HDFSMetadataLog writes a batch's file whole: a temporary file, renamed into place.
        self.metadata_path.mkdir(parents=True, exist_ok=True)
        partial = self.metadata_path / f".0.{os.getpid()}.tmp"
        body = json.dumps(initial, separators=(",", ":"))
        partial.write_bytes(b"\x00" + f"v{INITIAL_OFFSETS_VERSION}\n{body}".encode())
        os.replace(partial, stored)
        log.info("Initial offsets: %s", initial)
        return initial

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_offsets) if self.max_offsets else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = _from_json(start)
        if self.available_now:
            if self.prefetched is None:
                self.prefetched = self.latest(begin)
            latest = self.prefetched
        else:
            latest = self.latest(begin)
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(limit.max_rows, begin, latest, self.earliest)
        return _to_json(latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, until = _from_json(start), _from_json(end)
        new = [tp for tp in until if tp not in begin]
        first_reads = self.earliest(new)
        for tp, offset in sorted(first_reads.items()):
            if offset != 0:
                self._report_data_loss(
                    f"Added partition {tp[0]}-{tp[1]} starts from {offset} instead of 0. Some "
                    "data may have been missed"
                )
        gone = sorted(tp for tp in begin if tp not in until)
        if gone:
            names = ", ".join(f"{t}-{p}" for t, p in gone)
            self._report_data_loss(f"Set({names}) are gone. Some data may have been missed.")
        ranges = []
        for tp, end_offset in sorted(until.items()):
            first = begin.get(tp, first_reads.get(tp))
            if first is None:
                continue
            if end_offset < first:
                self._report_data_loss(
                    f"Partition {tp[0]}-{tp[1]}'s offset was changed from {first} to "
                    f"{end_offset}, some data may have been missed"
                )
            ranges.append(OffsetRange(tp[0], tp[1], first, end_offset))
        if not self.fail_on_data_loss:
            # Spark's consumer skips offsets Kafka no longer has: read from the earliest.
            lows = self.earliest([(r.topic, r.partition) for r in ranges])
            ranges = [
                OffsetRange(r.topic, r.partition, max(r.start, lows[(r.topic, r.partition)]), r.end)
                for r in ranges
            ]
        return split_ranges(ranges, self.min_partitions)

    # -- reading (executors) -------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from kafka_delta.sources.kafka_datasource import OffsetRange as Range
        from kafka_delta.sources.kafka_datasource import read_range

        assert isinstance(partition, OffsetRange)
        client = tuple(sorted(self.client.items()))
        yield from read_range(
            Range(
                partition.topic,
                partition.partition,
                partition.start,
                partition.end,
                client,
                120_000,
            )
        )

    def commit(self, end: dict[str, Any]) -> None:
        pass  # Spark's kafka source commits nothing to Kafka either

    def stop(self) -> None:
        self._client = None
