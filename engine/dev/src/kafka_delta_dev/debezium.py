"""Debezium change events for local runs and tests: the envelope a Debezium connector writes for
one table (``before``, ``after``, ``source``, ``op``, ``ts_ms``), keyed by the row's primary
key, with the tombstone that follows each delete, in Avro through a Schema Registry (what
Confluent estates run) or JSON with schemas disabled.

    python -m kafka_delta_dev.debezium --bootstrap-servers 127.0.0.1:9092 --topic customers \\
        --changes 1000 --keys 50 [--format avro --registry-url URL]

:func:`changes` draws a random history of inserts, updates and deletes (re-inserts of deleted
keys too) and :func:`model` says what a table must hold after any prefix of it: the last state
of each key, deleted keys absent. Records of one key go to one partition (``id % partitions``),
as Kafka's default partitioner keeps one key's records together.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from kafka_delta_dev.produce import ensure_topics, producer_conf

SERVER, SCHEMA, TABLE = "dbserver1", "inventory", "customers"
NAMESPACE = f"{SERVER}.{SCHEMA}.{TABLE}"

KEY_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Key",
    "namespace": NAMESPACE,
    "fields": [{"name": "id", "type": "long"}],
}
_VALUE_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Value",
    "namespace": NAMESPACE,
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "email", "type": ["null", "string"], "default": None},
        {"name": "balance", "type": ["null", "double"], "default": None},
    ],
}
# Debezium's envelope for a PostgreSQL table, as its AvroConverter registers it.
ENVELOPE_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Envelope",
    "namespace": NAMESPACE,
    "fields": [
        {"name": "before", "type": ["null", _VALUE_AVRO], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "namespace": "io.debezium.connector.postgresql",
                "fields": [
                    {"name": "version", "type": "string"},
                    {"name": "connector", "type": "string"},
                    {"name": "name", "type": "string"},
                    {"name": "ts_ms", "type": "long"},
                    {"name": "db", "type": "string"},
                    {"name": "schema", "type": "string"},
                    {"name": "table", "type": "string"},
                    {"name": "txId", "type": ["null", "long"], "default": None},
                    {"name": "lsn", "type": ["null", "long"], "default": None},
                ],
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}
# The same events as JSON (JsonConverter, schemas.enable=false), as Spark DDL for a schema file.
ENVELOPE_DDL = (
    "before STRUCT<id: BIGINT, name: STRING, email: STRING, balance: DOUBLE>, "
    "after STRUCT<id: BIGINT, name: STRING, email: STRING, balance: DOUBLE>, "
    "source STRUCT<version: STRING, connector: STRING, name: STRING, ts_ms: BIGINT, db: STRING, "
    "schema: STRING, table: STRING, txId: BIGINT, lsn: BIGINT>, op STRING, ts_ms BIGINT"
)


@dataclass(frozen=True)
class Change:
    """One record of the topic: a change event (``op`` c, u, r, d, or t) or the tombstone
    after a delete (``op`` None, no value)."""

    id: int
    op: str | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    lsn: int

    @property
    def tombstone(self) -> bool:
        return self.op is None

    def envelope(self) -> dict[str, Any]:
        return {
            "before": self.before,
            "after": self.after,
            "source": {
                "version": "2.7.0.Final",
                "connector": "postgresql",
                "name": SERVER,
                "ts_ms": 1_767_225_600_000 + self.lsn,
                "db": "postgres",
                "schema": SCHEMA,
                "table": TABLE,
                "txId": 1000 + self.lsn,
                "lsn": self.lsn,
            },
            "op": self.op,
            "ts_ms": 1_767_225_600_000 + self.lsn,
        }


def _row(key: int, version: int, rng: random.Random) -> dict[str, Any]:
    return {
        "id": key,
        "name": f"customer-{key}-v{version}",
        "email": None if rng.random() < 0.2 else f"c{key}.v{version}@example.com",
        "balance": round(rng.uniform(0, 1000), 2),
    }


def changes(count: int, keys: int, seed: int = 7, snapshot: bool = True) -> list[Change]:
    """A random history of ``count`` change events on ``keys`` rows (plus a tombstone after each
    delete): a snapshot read (``r``) of half the keys first when ``snapshot``, then inserts of
    absent keys, updates and deletes of present ones, re-inserts of deleted ones."""
    rng = random.Random(seed)
    state: dict[int, dict[str, Any]] = {}
    versions: dict[int, int] = {}
    out: list[Change] = []
    lsn = 0

    def emit(key: int, op: str | None, before: Any, after: Any) -> None:
        nonlocal lsn
        lsn += 1
        out.append(Change(key, op, before, after, lsn))

    if snapshot:
        for key in range(0, keys, 2):
            state[key] = _row(key, 0, rng)
            versions[key] = 0
            emit(key, "r", None, state[key])
    while sum(1 for c in out if not c.tombstone) < count:
        key = rng.randrange(keys)
        versions[key] = versions.get(key, -1) + 1
        if key not in state:
            state[key] = _row(key, versions[key], rng)
            emit(key, "c", None, state[key])
        elif rng.random() < 0.25:
            before = state.pop(key)
            emit(key, "d", before, None)
            emit(key, None, None, None)  # the tombstone, for log compaction
        else:
            before, state[key] = state[key], _row(key, versions[key], rng)
            emit(key, "u", before, state[key])
    return out


def model(history: Iterable[Change]) -> dict[int, dict[str, Any]]:
    """The table after ``history``: each key's last row, deleted keys absent."""
    state: dict[int, dict[str, Any]] = {}
    for change in history:
        if change.op in ("c", "u", "r"):
            assert change.after is not None
            state[change.id] = change.after
        elif change.op == "d" or change.tombstone:
            state.pop(change.id, None)
    return state


def json_value(change: Change) -> bytes | None:
    """The event as Debezium's JsonConverter writes it with schemas disabled."""
    if change.tombstone:
        return None
    return json.dumps(change.envelope(), separators=(",", ":")).encode()


def json_key(change: Change) -> bytes:
    return json.dumps({"id": change.id}, separators=(",", ":")).encode()


class AvroEncoder:
    """Key and value in Confluent's Avro framing through ``registry_url``, registered under
    ``<topic>-key`` and ``<topic>-value`` by confluent-kafka's own serializer."""

    def __init__(self, registry_url: str, topic: str) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        client = SchemaRegistryClient({"url": registry_url})
        self._key = AvroSerializer(client, json.dumps(KEY_AVRO))
        self._value = AvroSerializer(client, json.dumps(ENVELOPE_AVRO))
        self._key_context = SerializationContext(topic, MessageField.KEY)
        self._value_context = SerializationContext(topic, MessageField.VALUE)

    def key(self, change: Change) -> bytes:
        return self._key({"id": change.id}, self._key_context)

    def value(self, change: Change) -> bytes | None:
        if change.tombstone:
            return None
        return self._value(change.envelope(), self._value_context)


Record = tuple[int, bytes | None, bytes | None]  # (partition, key, value)


def produce_records(bootstrap: str, topic: str, records: Sequence[Record]) -> list[int]:
    """Produce ``(partition, key, value)`` records in order (a None value is a tombstone) and
    return each record's offset. Each partition's last record is sent on its own after the rest
    (some Kafka-compatible brokers, Tansu 0.6, report the high watermark as the first offset of
    the last record batch + 1; a one-record last batch makes it exact; on Kafka it changes
    nothing)."""
    producer = Producer(producer_conf(bootstrap))
    offsets: list[int] = [-1] * len(records)
    failures: list[str] = []

    def send(i: int) -> None:
        partition, key, value = records[i]

        def delivered(err: Any, msg: Any, i: int = i) -> None:
            if err is not None:
                failures.append(str(err))
            else:
                offsets[i] = msg.offset()

        while True:
            try:
                producer.produce(
                    topic, value=value, key=key, partition=partition, on_delivery=delivered
                )
                producer.poll(0)
                return
            except BufferError:
                producer.poll(0.1)

    tail = set({p: i for i, (p, _, _) in enumerate(records)}.values())
    for i in range(len(records)):
        if i not in tail:
            send(i)
    producer.flush(60)
    for i in sorted(tail):
        send(i)
        producer.flush(60)
    if producer.flush(60) or failures or -1 in offsets:
        raise RuntimeError(f"records to {topic} were not all acknowledged: {failures[:3]}")
    return offsets


def produce_changes(
    bootstrap: str,
    topic: str,
    history: Sequence[Change],
    partitions: int,
    value_format: str = "json",
    registry_url: str | None = None,
) -> list[int]:
    """Produce ``history`` to ``topic`` (key ``id`` % ``partitions`` picks the partition), in
    ``value_format`` json or avro; the offset of each change."""
    if value_format == "avro":
        if not registry_url:
            raise ValueError("avro needs a schema registry: pass registry_url")
        encoder = AvroEncoder(registry_url, topic)
        encode_key, encode_value = encoder.key, encoder.value
    elif value_format == "json":
        encode_key, encode_value = json_key, json_value
    else:
        raise ValueError(f"format {value_format!r} is not json or avro")
    return produce_records(
        bootstrap,
        topic,
        [(c.id % partitions, encode_key(c), encode_value(c)) for c in history],
    )


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--changes", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--format", choices=("json", "avro"), default="json")
    parser.add_argument("--registry-url")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    ensure_topics(args.bootstrap_servers, [args.topic], args.partitions)
    history = changes(args.changes, args.keys, seed=args.seed)
    produce_changes(
        args.bootstrap_servers, args.topic, history, args.partitions, args.format, args.registry_url
    )
    print(
        f"{len(history)} records ({sum(c.tombstone for c in history)} tombstones) to "
        f"{args.topic}; the table ends with {len(model(history))} rows"
    )
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
