"""Reading the benchmark topic outside Spark (rows 1-3): one confluent-kafka consumer per
process, and the parsing a hand-written ingest would do (pyarrow.json)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

# librdkafka settings every reader in the benchmark shares, the pipeline's included (a fetch at a
# partition's live end waits fetch.wait.max.ms for records: 100 ms, as conf/local.yaml sets,
# against librdkafka's 500 ms).
CLIENT = {"fetch.wait.max.ms": 100}
POLL_TIMEOUT_S = 120.0


def _consumer(bootstrap: str, group: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            # The prefetch setting the embedded source's read tasks use by default: with
            # librdkafka's 1 s default, every ~100k records the fetcher sleeps most of a second
            # after filling its queue, and the "limit" row would measure that sleep.
            "fetch.queue.backoff.ms": 10,
            **CLIENT,
        }
    )


def read_batches(
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    batch_size: int,
    group: str,
    starts: dict[int, int] | None = None,
) -> Iterator[tuple[list[Any], dict[int, int]]]:
    """Read ``[starts, ends)`` of every partition; yield (messages, end offsets so far) every
    ``batch_size`` records. Stops per partition at the first offset >= end - 1 or at EOF."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    starts = starts or {}
    position = {p: starts.get(p, 0) for p in ends}
    pending = {p for p in ends if position[p] < ends[p]}
    if not pending:
        return
    consumer = _consumer(bootstrap, group)
    consumer.assign([TopicPartition(topic, p, position[p]) for p in sorted(pending)])
    batch: list[Any] = []
    deadline = time.monotonic() + POLL_TIMEOUT_S
    try:
        while pending:
            # Never ask for more than remains: consume() waits its whole timeout when fewer
            # messages than asked for arrive.
            remaining = sum(ends[p] - position[p] for p in pending)
            want = max(1, min(10_000, batch_size - len(batch), remaining))
            messages = consumer.consume(num_messages=want, timeout=0.5)
            if not messages:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}: no records for {POLL_TIMEOUT_S:.0f}s: {pending}")
                continue
            deadline = time.monotonic() + POLL_TIMEOUT_S
            for msg in messages:
                p = msg.partition()
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= ends[p]:
                            pending.discard(p)
                        continue
                    raise KafkaException(err)
                if p not in pending or msg.offset() >= ends[p]:
                    continue
                batch.append(msg)
                position[p] = msg.offset() + 1
                if position[p] >= ends[p]:
                    pending.discard(p)
            if len(batch) >= batch_size or (not pending and batch):
                yield batch, dict(position)
                batch = []
    finally:
        consumer.close()


def parse_avro_messages(
    messages: Sequence[Any], topic: str, registry_url: str, schemas: dict[int, Any]
) -> Any:
    """What a hand-written Avro ingest does: the 4-byte schema id after the magic byte, the
    writer schema fetched once per id, fastavro's schemaless reader per record (one stream for
    the batch), Arrow columns built per field; the same columns as :func:`parse_messages`."""
    import io

    import pyarrow as pa
    import pyarrow.compute as pc
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from fastavro import parse_schema, schemaless_reader

    values = [m.value() for m in messages]
    stream = io.BytesIO(b"".join(values))
    records, at = [], 0
    client = None
    for value in values:
        schema_id = int.from_bytes(value[1:5], "big")
        parsed = schemas.get(schema_id)
        if parsed is None:
            client = client or SchemaRegistryClient({"url": registry_url})
            writer = json.loads(client.get_schema(schema_id).schema_str)
            for field in writer["fields"]:  # timestamps as integers, cast per column below
                if isinstance(field["type"], dict) and field["type"].get("logicalType"):
                    field["type"] = field["type"]["type"]
            parsed = schemas[schema_id] = parse_schema(writer)
        stream.seek(at + 5)
        at += len(value)
        records.append(schemaless_reader(stream, parsed, None))
    n = len(messages)
    millis = pa.array([r["event_time"] for r in records], pa.int64())
    return pa.table(
        {
            "id": pa.array([r["id"] for r in records], pa.int64()),
            "event_type": pa.array([r["event_type"] for r in records], pa.string()),
            "amount": pa.array([r["amount"] for r in records], pa.float64()),
            "event_time": pc.multiply(millis, 1000).cast(pa.timestamp("us", tz="UTC")),
            "topic": pa.array([topic] * n, pa.string()),
            "partition": pa.array([m.partition() for m in messages], pa.int32()),
            "offset": pa.array([m.offset() for m in messages], pa.int64()),
            "kafka_timestamp": pa.array(
                [m.timestamp()[1] * 1000 for m in messages], pa.timestamp("us", tz="UTC")
            ),
        }
    )


def parse_messages(messages: Sequence[Any], topic: str) -> Any:
    """What a hand-written ingest does: JSON values parsed by pyarrow.json, plus the Kafka
    coordinates, in the columns of the sample transform (kafka_delta_dev.orders)."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("event_type", pa.string()),
            ("amount", pa.float64()),
            ("event_time", pa.timestamp("us", tz="UTC")),
        ]
    )
    data = pj.read_json(
        pa.BufferReader(b"\n".join(m.value() for m in messages)),
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )
    n = len(messages)
    return (
        data.append_column("topic", pa.array([topic] * n, pa.string()))
        .append_column("partition", pa.array([m.partition() for m in messages], pa.int32()))
        .append_column("offset", pa.array([m.offset() for m in messages], pa.int64()))
        .append_column(
            "kafka_timestamp",
            pa.array([m.timestamp()[1] * 1000 for m in messages], pa.timestamp("us", tz="UTC")),
        )
    )
