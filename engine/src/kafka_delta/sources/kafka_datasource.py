"""Kafka source for Spark 4 as a Python data source (``DataSourceStreamReader``) on confluent-kafka.

Planning (``initialOffset``/``latestOffset``/``partitions``) runs in one long-lived Python
process next to the driver; ``read`` runs in executor Python workers. Offsets are Kafka's
"next offset to read", per topic-partition, in the JSON shape of :mod:`..offsets`.

Output columns match Spark's built-in ``kafka`` source: key, value, topic, partition, offset,
timestamp, timestampType, headers.

Options (all strings, as Spark passes them):

``kafka.bootstrap.servers`` (required), ``subscribe`` (comma-separated topics, required),
``startingOffsets`` (``earliest`` | ``latest`` | JSON ``{"topic": {"partition": offset}}`` with
-2 for earliest and -1 for latest, as Spark's kafka source takes it; default earliest),
``storedOffsets`` (JSON offsets that win over startingOffsets, e.g. read back from the Delta
table),
``maxRecordsPerTrigger``, ``readTasks`` (how many read tasks a micro-batch runs: offset
ranges are split or grouped to this many; the driver passes Spark's default parallelism),
``failOnDataLoss`` (default true), ``pollTimeoutMs`` (default 120000),
``kafkaConfig`` (JSON object of extra librdkafka settings), ``decodeSpec`` (a
:class:`..decoding.spec.DecodeSpec` as JSON: the read task decodes the records into typed
columns, and the source's schema is the decoder's output instead of the Kafka columns), and
``topicIds`` (JSON ``{"topic": "<Kafka topic id>"}``: the ids the pipeline found when it
started), and ``idlePollMs`` (the low-latency trigger, ``trigger.interval_seconds: 0``: see
below).

Kafka round trips of planning one micro-batch (``latestOffset``): ONE metadata request, which
answers both the subscription's partitions (partitions added are read) and the topics' ids,
then the earliest and latest offsets, two ListOffsets requests sent together. A topic whose id
is not the one in ``topicIds`` (or the one the planner saw first) was deleted and created again
while the pipeline read it: planning stops the query with
:class:`~kafka_delta.offsets.topic_identity.TopicRecreatedError` before the batch is planned
(I12), so the pipeline's batch function asks Kafka for no topic ids of its own.

The low-latency trigger's bounded wait (``idlePollMs``): Spark starts the next batch as soon as
the last one ends, and asks the source again whenever it found nothing new. Each of those asks
is a full planning (the metadata request, both ListOffsets, a round trip from the JVM to this
process): at Spark's own pace (every 10 ms) that cost an idle run 15-20% of a core. So when no
partition has records past the batch's start, ``latestOffset`` waits for some, up to
:data:`IDLE_WAIT_S`, looking at the partitions' latest offsets every ``idlePollMs`` (one
ListOffsets request), and plans as soon as one moved: records arriving at an idle pipeline
start a batch within ``idlePollMs``. The wait is bounded so that Spark's loop (its progress
reports, a stop) is never held longer.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

import kafka_delta.crash_points as crash_points
from kafka_delta.contract import KAFKA_ARROW_SCHEMA, KAFKA_SCHEMA
from kafka_delta.kafka.admin import (
    KafkaAdmin,
    KafkaUnavailableError,
    TopicMissingError,
    Topics,
    Watermarks,
)
from kafka_delta.kafka.clients import about_its_group_only, consumer_settings
from kafka_delta.kafka.refusals import KafkaRefusedError, topic_not_authorized
from kafka_delta.offsets.model import (
    Offsets,
    StartingOffsets,
    first_offset,
    offsets_from_json,
    offsets_to_json,
    same_topic_id,
    starting_offsets_from_option,
)
from kafka_delta.offsets.topic_identity import recreated_while_running
from kafka_delta.runtime.graceful_stop import ignore_stop_signals_in_spark_helper, in_spark_planner

log = logging.getLogger(__name__)

SOURCE_NAME = "kafka_embedded"

_ROWS_PER_ARROW_BATCH = 50_000
# The low-latency trigger: how long latestOffset holds an answer of "nothing new" (see above).
IDLE_WAIT_S = 1.0


# How long a topic this run has read may be missing before the query stops: a delete and a
# create again are two requests, and planning may fall between them.
DELETED_WAIT_S = 10.0


class DataLossError(RuntimeError):
    """Offsets the pipeline needs are no longer in Kafka (retention, deletion, truncation)."""


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: StartingOffsets
    stored_offsets: Offsets
    max_records_per_trigger: int | None
    read_tasks: int
    fail_on_data_loss: bool
    poll_timeout_ms: int
    kafka_config: dict[str, str]
    decode_spec: str | None = None
    topic_ids: tuple[tuple[str, str], ...] = ()
    idle_poll_ms: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        def get(name: str, default: str | None = None) -> str | None:
            value = options.get(name)
            return default if value is None or value == "" else value

        servers = get("kafka.bootstrap.servers")
        if not servers:
            raise ValueError(f"{SOURCE_NAME}: option 'kafka.bootstrap.servers' is required")
        topics = tuple(t.strip() for t in (get("subscribe") or "").split(",") if t.strip())
        if not topics:
            raise ValueError(f"{SOURCE_NAME}: option 'subscribe' needs at least one topic")
        try:
            starting = starting_offsets_from_option(get("startingOffsets", "earliest") or "")
        except ValueError as exc:
            raise ValueError(f"{SOURCE_NAME}: {exc}") from None
        max_records = get("maxRecordsPerTrigger")
        return cls(
            bootstrap_servers=servers,
            topics=topics,
            starting_offsets=starting,
            stored_offsets=offsets_from_json(json.loads(get("storedOffsets", "{}") or "{}")),
            max_records_per_trigger=int(max_records) if max_records else None,
            read_tasks=max(1, int(get("readTasks", "1") or "1")),
            fail_on_data_loss=(get("failOnDataLoss", "true") or "").lower() == "true",
            poll_timeout_ms=int(get("pollTimeoutMs", "120000") or "120000"),
            kafka_config={str(k): str(v) for k, v in json.loads(get("kafkaConfig", "{}")).items()},
            decode_spec=get("decodeSpec"),
            topic_ids=tuple(
                sorted((str(t), str(i)) for t, i in json.loads(get("topicIds", "{}")).items())
            ),
            idle_poll_ms=int(get("idlePollMs") or 0) or None,
        )

    def client_config(self) -> dict[str, str]:
        return {**self.kafka_config, "bootstrap.servers": self.bootstrap_servers}


class OffsetRange(InputPartition):
    """Offsets [start, end) of one topic-partition, read by one consumer."""

    def __init__(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        client_config: tuple[tuple[str, str], ...],
        poll_timeout_ms: int,
    ) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.client_config = client_config
        self.poll_timeout_ms = poll_timeout_ms


def _flatten(offsets: Offsets) -> dict[tuple[str, int], int]:
    return {(t, p): o for t, parts in offsets.items() for p, o in parts.items()}


def _nest(flat: Mapping[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (t, p), o in sorted(flat.items()):
        out.setdefault(t, {})[p] = o
    return out


def cap_offsets(start: Offsets, latest: Offsets, max_records: int) -> Offsets:
    """End offsets reading at most ``max_records`` past ``start``, shared across partitions in
    proportion to what each has available (the rule of Spark's Kafka source), never starving a
    partition that has data while the cap allows one record for it."""
    s, hi = _flatten(start), _flatten(latest)
    avail = {tp: max(0, hi[tp] - s.get(tp, hi[tp])) for tp in hi}
    total = sum(avail.values())
    if total <= max_records:
        return latest
    take = {tp: (n * max_records) // total for tp, n in avail.items()}
    leftover = max_records - sum(take.values())
    # Hand out what integer division left, largest remainders first.
    by_remainder = sorted(avail, key=lambda tp: (-((avail[tp] * max_records) % total), tp))
    for tp in by_remainder:
        if leftover <= 0:
            break
        if take[tp] < avail[tp]:
            take[tp] += 1
            leftover -= 1
    return _nest({tp: s.get(tp, hi[tp]) + take[tp] for tp in hi})


class ReadTask(InputPartition):
    """One Spark task: the offset ranges it reads, one after another."""

    def __init__(self, ranges: Sequence[OffsetRange]) -> None:
        super().__init__(tuple(r.value for r in ranges))
        self.ranges = tuple(ranges)


def group_ranges(
    ranges: Sequence[tuple[str, int, int, int]], tasks: int
) -> list[list[tuple[str, int, int, int]]]:
    """``ranges`` packed into at most ``tasks`` groups of about equal record counts (largest
    first, each to the lightest group), each group's ranges in topic-partition order.

    Each Python task costs Spark 4.2 a fixed ~60 ms of a core besides its reading (an empty
    ``mapInArrow`` task, measured in local mode), so a batch runs as many tasks as there are
    cores rather than one per topic-partition.
    """
    groups: list[list[tuple[str, int, int, int]]] = [[] for _ in range(min(tasks, len(ranges)))]
    loads = [0] * len(groups)
    for r in sorted(ranges, key=lambda r: (r[2] - r[3], r[0], r[1], r[2])):
        lightest = loads.index(min(loads))
        groups[lightest].append(r)
        loads[lightest] += r[3] - r[2]
    return [sorted(g) for g in groups if g]


def split_ranges(
    start: Offsets, end: Offsets, min_partitions: int
) -> list[tuple[str, int, int, int]]:
    """[start, end) per topic-partition, split so that at least ``min_partitions`` tasks exist
    when there is enough data (large ranges are cut first), so every core has work."""
    ranges = [
        (t, p, start.get(t, {}).get(p, e), e)
        for t, parts in sorted(end.items())
        for p, e in sorted(parts.items())
        if e > start.get(t, {}).get(p, e)
    ]
    total = sum(e - s for _, _, s, e in ranges)
    if not ranges or len(ranges) >= min_partitions or total == 0:
        return ranges
    out = []
    for t, p, s, e in ranges:
        pieces = max(1, math.ceil((e - s) * min_partitions / total))
        step = math.ceil((e - s) / pieces)
        out.extend((t, p, lo, min(e, lo + step)) for lo in range(s, e, step))
    return out


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges in the planning process; reads them in executors."""

    def __init__(self, options: Mapping[str, str]) -> None:
        if in_spark_planner():
            # Ctrl-C or a process-group SIGTERM reaches this process too, and it would die
            # under the batch the driver is finishing ("Python worker exited unexpectedly").
            # The driver stops the query; Spark then ends this process.
            ignore_stop_signals_in_spark_helper()
        self.options = SourceOptions.parse(options)
        self._admin: KafkaAdmin | None = None
        self._target: Offsets | None = None
        self._latest: Offsets | None = None
        # Kafka's id of each subscribed topic: the pipeline's at start, else the first seen.
        self._topic_ids: dict[str, str] = dict(self.options.topic_ids)

    @property
    def admin(self) -> KafkaAdmin:
        if self._admin is None:
            self._admin = KafkaAdmin(self.options.client_config())
        return self._admin

    # -- planning ---------------------------------------------------------------------------

    def _partitions(self) -> dict[str, list[int]]:
        """The subscription's partitions; the same metadata request answers the topics' ids,
        and a topic known by another id than before stops the query (see the module's
        docstring). Brokers that report no topic ids are compared on nothing."""
        found = self._describe()
        changed = sorted(
            t
            for t, i in found.ids.items()
            if t in self._topic_ids and not same_topic_id(self._topic_ids[t], i)
        )
        if changed:
            raise recreated_while_running(changed)
        self._topic_ids.update(found.ids)
        return found.partitions

    def _describe(self) -> Topics:
        """The subscription's metadata. A topic this run has read that is not there is being
        deleted, maybe to be created again (an operator's delete and create are two requests):
        it is asked for again for up to :data:`DELETED_WAIT_S`, so that a topic created again
        is told by its new id (stopping the query with that sentence); one still missing stops
        the query saying it was deleted while the run read it."""
        deadline = time.monotonic() + DELETED_WAIT_S
        while True:
            try:
                return self.admin.describe(self.options.topics)
            except TopicMissingError as exc:
                if exc.topic not in self._topic_ids:
                    raise
                if time.monotonic() >= deadline:
                    raise TopicMissingError(
                        exc.topic,
                        f"topic {exc.topic!r}, which this run was reading, was deleted from "
                        f"{self.options.bootstrap_servers} while the run read it: create it "
                        "again (the next run then says what the table holds against it) or "
                        "take it out of kafka.topics",
                    ) from None
                time.sleep(0.2)

    def _first_offset(self, topic: str, partition: int, earliest: Offsets) -> int:
        """Where a partition new to the checkpoint starts (a topic added to the subscription,
        partitions added to a topic, a topic re-added): at the offset the table stores for it,
        else at its earliest offset, as Spark's kafka source starts new partitions. Never at
        its latest: records produced before the pipeline noticed the partition would be lost."""
        at = earliest[topic][partition]
        stored = self.options.stored_offsets
        return first_offset(
            topic, partition, stored=stored, starting="earliest", earliest=at, latest=at
        )

    def initialOffset(self) -> dict[str, Any]:
        partitions = self._partitions()
        marks = self.admin.watermarks(partitions)
        # The table's offsets; a partition it does not store starts at its earliest offset once
        # the pipeline stored any, else where startingOffsets puts it (the pipeline's first run).
        start = {
            t: {
                p: first_offset(
                    t,
                    p,
                    stored=self.options.stored_offsets,
                    starting=self.options.starting_offsets,
                    earliest=marks.earliest[t][p],
                    latest=marks.latest[t][p],
                )
                for p in parts
            }
            for t, parts in partitions.items()
        }
        return offsets_to_json(self._guard_data_loss(start, marks))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        partitions = self._partitions()
        self._target = self.admin.latest(partitions)
        log.info("availableNow target offsets: %s", offsets_to_json(self._target))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        planned = self._plan(start, limit)
        if self.options.idle_poll_ms is None or self._target is not None or planned != start:
            return planned
        # Nothing new (the low-latency trigger): wait for records before answering.
        deadline = time.monotonic() + IDLE_WAIT_S
        watched = {t: [int(p) for p in parts] for t, parts in start.items()}
        while time.monotonic() < deadline:
            time.sleep(self.options.idle_poll_ms / 1000)
            latest = self.admin.latest(watched)
            if any(
                o > int(start[t][str(p)]) for t, parts in latest.items() for p, o in parts.items()
            ):
                return self._plan(start, limit)
        return planned

    def _plan(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end offsets of the next batch from ``start``, as Spark's ``latestOffset`` asks."""
        begin = offsets_from_json(start)
        partitions = self._partitions()
        marks = self.admin.watermarks(partitions)
        self._latest = marks.latest
        # Partitions new to the checkpoint start at their stored offset, else their earliest.
        begin = {
            t: {
                p: begin[t][p]
                if p in begin.get(t, {})
                else self._first_offset(t, p, marks.earliest)
                for p in parts
            }
            for t, parts in partitions.items()
        }
        guarded = self._guard_data_loss(begin, marks)
        # A partition restarted at its earliest offset (topic recreated) ends this batch
        # there, so the next batch reads the new topic from its beginning.
        restarted = {
            (t, p): o for t, parts in guarded.items() for p, o in parts.items() if o != begin[t][p]
        }
        begin = guarded
        latest = marks.latest
        if self._target is not None:
            # availableNow: never past the offsets seen when the run started.
            latest = {
                t: {
                    p: min(o, self._target.get(t, {}).get(p, begin[t][p])) for p, o in parts.items()
                }
                for t, parts in latest.items()
            }
        # Never move backwards (a stale watermark, or a broker that under-reports it).
        latest = {
            t: {p: max(o, begin[t][p]) for p, o in parts.items()} for t, parts in latest.items()
        }
        if isinstance(limit, ReadMaxRows):
            latest = cap_offsets(begin, latest, limit.max_rows)
        for (t, p), o in restarted.items():
            latest[t][p] = o
        return offsets_to_json(latest)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return offsets_to_json(self._latest) if self._latest is not None else None

    def _guard_data_loss(self, positions: Offsets, marks: Watermarks) -> Offsets:
        """Positions the pipeline needs that Kafka no longer has (I5): below the earliest
        available offset (retention, deleted records) or past the latest (the topic was
        deleted and recreated). Fails unless fail_on_data_loss is off; then a position past
        the latest restarts at the earliest offset, and one below the earliest is skipped
        ahead when the batch is planned. Either way, what is skipped is logged."""
        lost = []
        adjusted = {t: dict(parts) for t, parts in positions.items()}
        for t, parts in positions.items():
            for p, o in parts.items():
                lo = marks.earliest.get(t, {}).get(p)
                hi = marks.latest.get(t, {}).get(p)
                if lo is not None and o < lo:
                    lost.append(
                        f"{t}[{p}] needs offset {o} but the earliest available is {lo} "
                        f"({lo - o} records deleted before they were read)"
                    )
                elif hi is not None and o > hi:
                    lost.append(
                        f"{t}[{p}] needs offset {o} but the latest is {hi} (the topic was "
                        "deleted and recreated, or truncated)"
                    )
                    adjusted[t][p] = lo if lo is not None else 0
        if not lost:
            return positions
        detail = "; ".join(lost)
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"Kafka no longer has records the pipeline has not read: {detail}. Nothing was "
                "written. To skip them, set kafka.fail_on_data_loss: false and restart."
            )
        # The run's log says it, batch by batch (run_positions.say_skipped); this process's
        # log is Spark's planner's.
        log.info("fail_on_data_loss is off; skipping records no longer in Kafka: %s", detail)
        return adjusted

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, stop = offsets_from_json(start), offsets_from_json(end)
        # Spark passes the previous batch's end as the start: a partition latestOffset added
        # to this batch (new to the checkpoint) is absent from it and starts by the same rule.
        new = {
            t: [p for p in parts if p not in begin.get(t, {})]
            for t, parts in stop.items()
            if any(p not in begin.get(t, {}) for p in parts)
        }
        if new:
            earliest = self.admin.watermarks(new).earliest
            for t, parts in new.items():
                for p in parts:
                    begin.setdefault(t, {})[p] = self._first_offset(t, p, earliest)
        if not self.options.fail_on_data_loss:
            # Skip ahead over deleted records instead of failing in the read task.
            earliest = self.admin.earliest({t: sorted(parts) for t, parts in stop.items()})
            begin = {
                t: {p: max(o, earliest.get(t, {}).get(p, o)) for p, o in parts.items()}
                for t, parts in begin.items()
            }
        conf = tuple(sorted(self.options.client_config().items()))
        tasks, timeout = self.options.read_tasks, self.options.poll_timeout_ms
        return [
            ReadTask([OffsetRange(t, p, s, e, conf, timeout) for t, p, s, e in group])
            for group in group_ranges(split_ranges(begin, stop, tasks), tasks)
        ]

    # -- reading (executors) ----------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ReadTask)
        if self.options.decode_spec is None:
            for offsets in partition.ranges:
                yield from read_range(offsets)
            return
        # Decoded here, in the read task: Spark receives typed columns, never the raw bytes.
        from kafka_delta.decoding.decoder import decoder_for

        decoder = decoder_for(self.options.decode_spec)
        for offsets in partition.ranges:
            for batch in read_range(offsets):
                yield decoder.decode(batch)

    def commit(self, end: dict[str, Any]) -> None:
        # Deliberately empty: Spark calls this in the planning process after its commit log is
        # written, and not for the last batch of a run. The consumer-group commit happens in
        # the batch function right after the Delta commit (see commit_back.py).
        pass

    def stop(self) -> None:
        self._admin = None


def consumer_config(client_config: Mapping[str, str], records: int) -> dict[str, str]:
    """librdkafka settings of a read task's consumer that will read ``records`` records.

    Two prefetch defaults are tuned for bounded reads (the user's client settings win):

    - ``fetch.queue.backoff.ms``: once ``queued.min.messages`` are prefetched, librdkafka
      waits this long before fetching again. Its default (1 s) stalled every task reading
      more than ~100k records for most of a second; 10 ms keeps the fetcher just ahead of
      the reader with the same bounded queue (2.5x faster reads of 250k-record ranges).
    - ``queued.min.messages``: no more than the task's range (at most librdkafka's default
      100k), so a task does not fetch and parse up to 100k records past its end.
    """
    conf = {
        "fetch.queue.backoff.ms": "10",
        "queued.min.messages": str(max(1, min(100_000, records))),
    }
    conf.update(client_config)
    conf.update(
        {
            # Never part of a group: offsets come from the plan, and the group is written
            # only by the commit-back hook.
            "group.id": conf.get("group.id", "kafka-delta-embedded-reader"),
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "false",
            "enable.partition.eof": "true",
            # Out-of-range must surface as an error, never as a silent reset.
            "auto.offset.reset": "error",
        }
    )
    return conf


def _consumer(task: OffsetRange) -> Any:
    """A consumer for one read task, closed when the task ends.

    Consumers are deliberately not kept across tasks: a consumer that outlives a topic's
    deletion and re-creation crashed its Python worker (librdkafka 2.16 on Tansu 0.6, seen in
    the data-loss test); a new consumer per task costs a few milliseconds.
    """
    from confluent_kafka import Consumer

    conf = consumer_config(dict(task.client_config), task.end - task.start)
    return Consumer(consumer_settings(conf))


def to_record_batch(topic: str, partition: int, messages: Sequence[Any]) -> pa.RecordBatch:
    """The records of one topic-partition as one Arrow batch of :data:`KAFKA_ARROW_SCHEMA`.

    Column by column rather than row by row: one list comprehension per message accessor and
    Arrow conversions of whole lists cost a fraction of eight ``append`` calls per record, and
    this runs for every record the pipeline reads. topic and partition are the same for the
    whole batch, so they are repeated scalars; headers are built only when a record has some.
    """
    # Imported here: only read tasks need it, and it costs every planning process ~30 ms.
    import pyarrow.compute as pc

    n = len(messages)
    stamps = [m.timestamp() for m in messages]  # (type, milliseconds) pairs
    # Two comprehensions, not zip(*stamps): unpacking 50k arguments is ~40x slower.
    types = pa.array([t for t, _ in stamps], pa.int32())
    millis = pa.array([ms for _, ms in stamps], pa.int64())
    # Kafka's timestamp type 0 is "not available" (null in Spark); Spark numbers the others
    # from 0 (CreateTime) where librdkafka starts at 1. A negative timestamp means "none" too.
    has_type = pc.not_equal(types, 0)
    has_time = pc.and_(has_type, pc.greater_equal(millis, 0))
    micros = pc.multiply(millis, 1000)
    if not pc.all(has_time).as_py():
        micros = pc.if_else(has_time, micros, pa.scalar(None, pa.int64()))
    ts_type = pc.max_element_wise(pc.subtract(types, 1), 0)
    if not pc.all(has_type).as_py():
        ts_type = pc.if_else(has_type, ts_type, pa.scalar(None, pa.int32()))
    headers = [m.headers() for m in messages]
    header_type = KAFKA_ARROW_SCHEMA.field("headers").type
    arrays = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array([m.offset() for m in messages], pa.int64()),
        micros.cast(KAFKA_ARROW_SCHEMA.field("timestamp").type),
        ts_type,
        pa.array(
            [[{"key": k, "value": v} for k, v in h] if h else None for h in headers],
            header_type,
        )
        if any(headers)
        else pa.nulls(n, header_type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=KAFKA_ARROW_SCHEMA)


def _records_before_end(
    task: OffsetRange, messages: list[Any], position: int
) -> tuple[list[Any], int]:
    """(the records of ``messages`` inside the task's range, the position after them).

    The position moves to the first offset at or past ``end`` (the read stops there), or to
    the end of the partition the broker reports, or past the last record kept.
    """
    from confluent_kafka import KafkaError, KafkaException

    # "is not None" per message, never list.count(None): KafkaError raises on == None.
    if not [m for m in messages if m.error() is not None]:
        # The common case, no error in the chunk: cut it with a binary search, since Kafka
        # delivers one partition's records in offset order.
        offsets = [m.offset() for m in messages]
        if offsets[-1] < task.end:
            return messages, offsets[-1] + 1
        cut = bisect.bisect_left(offsets, task.end)
        return messages[:cut], offsets[cut]
    # Rare (mostly the end-of-partition event after a range's last record): one by one.
    kept = []
    for msg in messages:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                position = max(position, msg.offset())
                continue
            if err.code() == KafkaError._AUTO_OFFSET_RESET:
                raise DataLossError(
                    f"{task.topic}[{task.partition}]: offset {position} is out of "
                    f"range ({err.str()}); the records were deleted from Kafka"
                )
            if about_its_group_only(err):
                continue
            if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                conf = dict(task.client_config)
                raise KafkaRefusedError(
                    topic_not_authorized(conf.get("bootstrap.servers", "?"), conf, task.topic)
                )
            raise KafkaException(err)
        offset = msg.offset()
        if offset >= task.end:
            return kept, offset
        kept.append(msg)
        position = offset + 1
    return kept, position


def _stalled(task: OffsetRange, position: int, end_seen: int | None) -> Exception:
    """Why a read got no record for ``poll_timeout_ms``. The broker said where the partition
    ends (an end-of-partition event) below the range's end: the plan is wrong. Else the broker
    did not deliver at all: Kafka is unavailable, which a run waits out
    (``kafka.unavailable_timeout_seconds``) by running the batch again from its plan."""
    if end_seen is not None and end_seen < task.end:
        return TimeoutError(
            f"{task.topic}[{task.partition}]: no records between offsets {position} and "
            f"{task.end} within {task.poll_timeout_ms} ms, although the plan said they exist "
            f"(the broker says the partition ends at {end_seen})"
        )
    servers = dict(task.client_config).get("bootstrap.servers", "?")
    return KafkaUnavailableError(
        f"Kafka at {servers} delivered no records of {task.topic}[{task.partition}] from "
        f"offset {position} (the batch reads to {task.end}) within "
        f"{task.poll_timeout_ms / 1000:g} s"
    )


def read_range(task: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Yield records with offsets in [start, end) of one partition as Arrow batches.

    The stop condition never assumes offsets are dense: transaction markers and compaction
    leave gaps, so reading stops at the first record at or past ``end - 1``, or when the
    broker reports the end of the partition at or past ``end``.

    A broker that goes away mid-read (a restart, a pause) is waited for up to
    ``poll_timeout_ms`` without a record; then :class:`KafkaUnavailableError` fails the task,
    and the run runs the batch again from its plan once Kafka answers (nothing of it was
    committed).
    """
    from confluent_kafka import KafkaError, TopicPartition

    if task.end <= task.start:
        return
    consumer = _consumer(task)
    consumer.assign([TopicPartition(task.topic, task.partition, task.start)])
    pending: list[Any] = []
    deadline = time.monotonic() + task.poll_timeout_ms / 1000
    position = task.start
    end_seen: int | None = None
    try:
        while position < task.end:
            # Ask for no more than the range holds: consume() waits out its whole timeout
            # whenever fewer messages than asked for are available.
            wanted = max(1, min(10_000, task.end - position))
            messages = consumer.consume(num_messages=wanted, timeout=0.5)
            if not messages:
                if time.monotonic() > deadline:
                    raise _stalled(task, position, end_seen)
                continue
            # Where the broker last said the partition ends, as of the latest answer.
            ends = [
                m.offset()
                for m in messages
                if m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF
            ]
            if ends or any(m.error() is None for m in messages):
                end_seen = ends[-1] if ends else None
            deadline = time.monotonic() + task.poll_timeout_ms / 1000
            crash_points.reached("mid_read")
            kept, position = _records_before_end(task, messages, position)
            pending.extend(kept)
            if len(pending) >= _ROWS_PER_ARROW_BATCH:
                yield to_record_batch(task.topic, task.partition, pending)
                pending = []
        if pending:
            yield to_record_batch(task.topic, task.partition, pending)
    finally:
        consumer.close()


class KafkaDataSource(DataSource):
    """``spark.readStream.format("kafka_embedded")`` once registered with
    ``spark.dataSource.register(KafkaDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str | StructType:
        spec = self.options.get("decodeSpec")
        if not spec:
            return KAFKA_SCHEMA
        from kafka_delta.decoding.dataframe import spark_schema
        from kafka_delta.decoding.spec import DecodeSpec

        return spark_schema(DecodeSpec.from_json(spec))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)
