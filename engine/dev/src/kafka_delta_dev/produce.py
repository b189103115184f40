"""Sample-event producer and topic set-up for local runs and tests.

    python -m kafka_delta_dev.produce --bootstrap-servers 127.0.0.1:9092 --topics orders \
        --records 10000 --partitions 4 [--format json|avro|protobuf] [--registry-url URL] [--evolve]
    python -m kafka_delta_dev.produce --write-descriptor-set order_event.desc [--schema-version 2]

``--format json`` (the default) writes plain JSON order events. ``avro`` and ``protobuf`` write
them in Confluent's wire format with confluent-kafka's own serializers (``AvroSerializer``,
``ProtobufSerializer``), registering the schema under ``<topic>-value`` (TopicNameStrategy) at
``--registry-url``. ``--evolve`` switches to the second schema version halfway through: the
events from the middle id on carry an added optional field, ``channel``.

The schemas: ``schemas/order_event.avsc`` and ``order_event_v2.avsc`` in the project (the same
as :data:`ORDER_EVENT_AVRO` here); for Protobuf the message classes are built at run time from
a ``FileDescriptorProto`` (:func:`order_event_file_descriptor`; no protoc needed), which
``schemas/order_event.proto`` documents, and ``--write-descriptor-set`` writes as a
``FileDescriptorSet`` for decoders that take one from a file.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

EVENT_TYPES = ("created", "paid", "shipped", "refunded")
CHANNELS = ("web", "app", "store")
FORMATS = ("json", "avro", "protobuf")

_ORDER_EVENT_V1: dict[str, Any] = {
    "type": "record",
    "name": "OrderEvent",
    "namespace": "orders",
    "doc": "One sample order event (kafka_delta_dev/produce.py).",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "event_type", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
_ORDER_EVENT_V2: dict[str, Any] = {
    **_ORDER_EVENT_V1,
    "fields": [
        *_ORDER_EVENT_V1["fields"],
        # optional, default null: BACKWARD compatible, so the registry accepts it as version 2
        {"name": "channel", "type": ["null", "string"], "default": None},
    ],
}
# version -> the Avro schema (schemas/order_event.avsc, schemas/order_event_v2.avsc)
ORDER_EVENT_AVRO: dict[int, dict[str, Any]] = {1: _ORDER_EVENT_V1, 2: _ORDER_EVENT_V2}
PROTO_FILE = "order_event.proto"
PROTO_MESSAGE = "orders.OrderEvent"


def order_event_avro(version: int) -> dict[str, Any]:
    """The Avro schema of the sample event, ``version`` 1 or 2 (a copy: callers may edit it)."""
    if version not in ORDER_EVENT_AVRO:
        raise ValueError(f"schema version {version} does not exist: 1 or 2")
    return copy.deepcopy(ORDER_EVENT_AVRO[version])


def order_event_file_descriptor(version: int) -> Any:
    """The ``FileDescriptorProto`` of ``order_event.proto`` (package ``orders``, message
    ``OrderEvent``), ``version`` 1 or 2: what schemas/order_event.proto says, built in Python
    because there is no protoc here. v2 adds ``optional string channel = 5`` (proto3 explicit
    presence: an unset channel reads as null, not as "")."""
    from google.protobuf import descriptor_pb2

    if version not in ORDER_EVENT_AVRO:
        raise ValueError(f"schema version {version} does not exist: 1 or 2")
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name=PROTO_FILE,
        package="orders",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    message = proto.message_type.add(name="OrderEvent")
    optional = field.LABEL_OPTIONAL
    message.field.add(name="id", number=1, type=field.TYPE_INT64, label=optional)
    message.field.add(name="event_type", number=2, type=field.TYPE_STRING, label=optional)
    message.field.add(name="amount", number=3, type=field.TYPE_DOUBLE, label=optional)
    message.field.add(
        name="event_time",
        number=4,
        type=field.TYPE_MESSAGE,
        type_name=".google.protobuf.Timestamp",
        label=optional,
    )
    if version >= 2:
        message.oneof_decl.add(name="_channel")  # the synthetic oneof of a proto3 optional
        message.field.add(
            name="channel",
            number=5,
            type=field.TYPE_STRING,
            label=optional,
            oneof_index=0,
            proto3_optional=True,
        )
    return proto


@functools.cache
def order_event_message(version: int) -> Any:
    """The generated-style message class ``orders.OrderEvent`` of ``version`` (each version in
    its own descriptor pool: both define the same file and message names)."""
    from google.protobuf import descriptor_pool, message_factory, timestamp_pb2

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(order_event_file_descriptor(version))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(PROTO_MESSAGE))


def order_event_descriptor_set(version: int) -> bytes:
    """A serialized ``FileDescriptorSet`` with order_event.proto and its import
    (google/protobuf/timestamp.proto), as ``protoc --include_imports --descriptor_set_out``
    would write it."""
    from google.protobuf import descriptor_pb2, timestamp_pb2

    files = descriptor_pb2.FileDescriptorSet()
    timestamp = files.file.add()
    timestamp.ParseFromString(timestamp_pb2.DESCRIPTOR.serialized_pb)
    files.file.append(order_event_file_descriptor(version))
    return files.SerializeToString()


def ensure_topics(
    bootstrap: str,
    topics: Iterable[str],
    partitions: int,
    *,
    replication: int = 1,
    config: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Create topics that do not exist yet (existing ones are left as they are), with
    ``replication`` replicas of each partition and the topic ``config`` given
    (``cleanup.policy``, ``max.message.bytes``...); returns once every partition of each has a
    leader in the cluster's metadata. Kafka answers CreateTopics before every broker knows the
    new partitions: a ListOffsets or a produce sent at once can still meet "Unknown topic or
    partition" (Kafka's own test utilities wait the same way)."""
    topics = list(topics)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=10).topics)
    wanted = [
        NewTopic(t, partitions, replication, config=dict(config or {}))
        for t in topics
        if t not in existing
    ]
    for future in admin.create_topics(wanted, request_timeout=10).values() if wanted else []:
        try:
            future.result()
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    _, waiting = _listed(admin, topics, timeout_s, leaders=True)
    if waiting:
        raise RuntimeError(f"topics {waiting} have no leader on {bootstrap} after {timeout_s} s")


def _listed(
    admin: AdminClient, topics: Sequence[str], timeout_s: float, *, leaders: bool
) -> tuple[Any, list[str]]:
    """The cluster's metadata once it lists every topic of ``topics`` with partitions (and,
    with ``leaders``, a leader for each), asked again until ``timeout_s``; and the topics it
    still lacks then (none: all there). A topic just created reaches each broker's metadata a
    moment apart: a broker of several may not list it yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=10)
        waiting = [
            t
            for t in topics
            if t not in metadata.topics
            or not metadata.topics[t].partitions
            or (
                leaders
                and (
                    metadata.topics[t].error is not None
                    or any(p.leader < 0 for p in metadata.topics[t].partitions.values())
                )
            )
        ]
        if not waiting or time.monotonic() > deadline:
            return metadata, waiting
        time.sleep(0.05)


def event_fields(event_id: int, rng: random.Random, *, evolved: bool = False) -> dict[str, Any]:
    """One order event as values (``event_time`` a UTC datetime); ``evolved`` adds the v2
    field ``channel``. Draws one number from ``rng``, as :func:`event` always has."""
    fields: dict[str, Any] = {
        "id": event_id,
        "event_type": EVENT_TYPES[event_id % len(EVENT_TYPES)],
        "amount": round(rng.uniform(1, 500), 2),
        "event_time": datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=event_id),
    }
    if evolved:
        fields["channel"] = CHANNELS[event_id % len(CHANNELS)]
    return fields


def event(event_id: int, rng: random.Random, *, evolved: bool = False) -> bytes:
    """One ~75-byte JSON order event, the shape the sample transform parses."""
    fields = event_fields(event_id, rng, evolved=evolved)
    fields["event_time"] = fields["event_time"].strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps(fields, separators=(",", ":")).encode()


Encoder = Callable[[str, dict[str, Any]], bytes]


def value_encoder(value_format: str, registry_url: str | None, version: int) -> Encoder:
    """``encode(topic, fields) -> bytes`` for ``value_format``: JSON as :func:`event` writes
    it, or Avro/Protobuf through confluent-kafka's serializers (schema ``version``, registered
    on first use under ``<topic>-value`` at ``registry_url``)."""
    if value_format == "json":

        def encode_json(topic: str, fields: dict[str, Any]) -> bytes:
            values = {**fields, "event_time": fields["event_time"].strftime("%Y-%m-%dT%H:%M:%SZ")}
            return json.dumps(values, separators=(",", ":")).encode()

        return encode_json
    if value_format not in FORMATS:
        raise ValueError(f"format {value_format!r} is not one of {', '.join(FORMATS)}")
    if not registry_url:
        raise ValueError(f"--format {value_format} needs a schema registry: pass --registry-url")
    from confluent_kafka.schema_registry import SchemaRegistryClient, topic_subject_name_strategy
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    # TopicNameStrategy named, not left to the client's default (which first asks the
    # registry for the topic's associations): the subject is <topic>-value on every registry.
    conf = {"auto.register.schemas": True, "subject.name.strategy": topic_subject_name_strategy}
    contexts: dict[str, SerializationContext] = {}

    def context(topic: str) -> SerializationContext:
        if topic not in contexts:
            contexts[topic] = SerializationContext(topic, MessageField.VALUE)
        return contexts[topic]

    if value_format == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        serialize = AvroSerializer(client, json.dumps(order_event_avro(version)), conf=conf)
        return lambda topic, fields: serialize(fields, context(topic))

    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    message = order_event_message(version)
    serialize_pb = ProtobufSerializer(message, client, {**conf, "use.deprecated.format": False})

    def encode_protobuf(topic: str, fields: dict[str, Any]) -> bytes:
        record = message(id=fields["id"], event_type=fields["event_type"], amount=fields["amount"])
        record.event_time.FromDatetime(fields["event_time"])
        if fields.get("channel") is not None:
            record.channel = fields["channel"]
        return serialize_pb(record, context(topic))

    return encode_protobuf


def producer_conf(bootstrap: str, transactional_id: str | None = None) -> dict[str, Any]:
    """A producer that writes each record once, in order, or reports its failure.

    Without a transaction it is not idempotent and never retries (``acks=all``): librdkafka
    holds an idempotent producer's first record 0.5-1 s, until its producer id arrives (the
    id's timer retries every 500 ms while no broker connection is up yet, which is always
    the case at its first try), and the tests open hundreds. A record without retries cannot
    be written twice; a failed one reaches its delivery callback, which the callers turn into
    an error. A transaction needs the producer id anyway (``init_transactions``)."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"}
    if transactional_id:
        return {**conf, "enable.idempotence": True, "transactional.id": transactional_id}
    return {**conf, "enable.idempotence": False, "retries": 0}


def _produce(
    producer: Producer, topic: str, partition: int, key: bytes, value: bytes, delivered: Any
) -> None:
    while True:
        try:
            producer.produce(
                topic, value=value, key=key, partition=partition, on_delivery=delivered
            )
            producer.poll(0)
            return
        except BufferError:  # local queue full: let deliveries drain, then retry
            producer.poll(0.1)


class _Ends:
    """Where a transaction's records ended, partition by partition, to wait for its markers.

    Kafka answers a transaction's commit (or abort) once the coordinator has logged it and
    writes the markers to the partitions after that: a record produced right after the
    commit returned may take the offset a test expects the marker at. ``wait(bootstrap)``
    returns once every partition's high watermark is past its marker (or after ``timeout_s``:
    a stand-in broker that writes no markers)."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, int], int] = {}

    def delivered(self, msg: Any) -> None:
        key = (msg.topic(), msg.partition())
        self.last[key] = max(self.last.get(key, -1), msg.offset())

    def wait(self, bootstrap: str, timeout_s: float = 5.0) -> None:
        if not self.last:
            return
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "markers"})
        try:
            deadline = time.monotonic() + timeout_s
            for (topic, partition), last in self.last.items():
                while time.monotonic() < deadline:
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=5
                    )
                    if high >= last + 2:  # the records, then the marker
                        break
                    time.sleep(0.02)
        finally:
            consumer.close()
        self.last.clear()


def produce_values(
    bootstrap: str,
    topic: str,
    values: Sequence[tuple[int, bytes]],
    *,
    transactional_id: str | None = None,
) -> None:
    """Produce ``(partition, value)`` pairs, each once and in order (:func:`producer_conf`),
    or raise; with ``transactional_id``, in one committed transaction (its commit markers
    leave gaps in the partitions' offsets)."""
    producer = Producer(producer_conf(bootstrap, transactional_id))
    failures: list[str] = []
    ends = _Ends()

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            ends.delivered(msg)

    if transactional_id:
        producer.init_transactions(30)
        producer.begin_transaction()
    # Send each partition's last record on its own, after the rest is flushed. Some
    # Kafka-compatible brokers (Tansu 0.6) report the high watermark as the first offset of
    # the partition's last record batch + 1; a one-record final batch makes it exact. On a
    # real Kafka this changes nothing.
    last: dict[int, int] = {p: i for i, (p, _) in enumerate(values)}
    tail = set(last.values())
    for i, (partition, value) in enumerate(values):
        if i not in tail:
            _produce(producer, topic, partition, str(i).encode(), value, delivered)
    producer.flush(60)
    for i in sorted(tail):
        partition, value = values[i]
        _produce(producer, topic, partition, str(i).encode(), value, delivered)
        producer.flush(60)
    if transactional_id:
        producer.commit_transaction(30)
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(
            f"records to {topic} were not all written: {remaining} unacknowledged, "
            f"{len(failures)} failed {failures[:3]}"
        )
    if transactional_id:
        ends.wait(bootstrap)


class Transaction:
    """One transactional producer for tests of what Kafka's transactions do to a reader:
    ``begin()``, ``send(...)`` records, then ``commit()``, ``abort()``, or leave it open (the
    last stable offset stays below the high watermark until it ends). Each ends with a marker
    that takes an offset of its own and holds no record.

    ``abort()`` flushes first: librdkafka 2.16 against Kafka 4.1 fails the abort of a
    transaction whose records are still in flight with ``INVALID_TXN_STATE``. A transaction
    open longer than ``timeout_s`` is aborted by Kafka (and this producer fenced): a test that
    keeps one open across runs sets it long enough."""

    def __init__(self, bootstrap: str, transactional_id: str, timeout_s: float = 60.0) -> None:
        conf = producer_conf(bootstrap, transactional_id)
        self.bootstrap = bootstrap
        self.producer = Producer({**conf, "transaction.timeout.ms": int(timeout_s * 1000)})
        self.producer.init_transactions(30)
        self._failures: list[str] = []
        self._ends = _Ends()

    def begin(self) -> Transaction:
        self.producer.begin_transaction()
        return self

    def send(self, topic: str, partition: int, value: bytes, key: bytes | None = None) -> None:
        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                self._failures.append(str(err))
            else:
                self._ends.delivered(msg)

        _produce(self.producer, topic, partition, key or b"", value, delivered)

    def flush(self) -> None:
        """Every record sent so far written to the log (the transaction still open)."""
        remaining = self.producer.flush(60)
        if remaining or self._failures:
            raise RuntimeError(
                f"transactional records were not all written: {remaining} unacknowledged, "
                f"{len(self._failures)} failed {self._failures[:3]}"
            )

    def commit(self) -> None:
        """Commit, and return once the markers are in the partitions' logs."""
        self.flush()
        self.producer.commit_transaction(30)
        self._ends.wait(self.bootstrap)

    def abort(self) -> None:
        """Abort, and return once the markers are in the partitions' logs."""
        self.flush()
        self.producer.abort_transaction(30)
        self._ends.wait(self.bootstrap)


def produce_events(
    bootstrap: str,
    topics: Sequence[str],
    records: int,
    *,
    first_id: int = 0,
    seed: int = 7,
    value_format: str = "json",
    registry_url: str | None = None,
    evolve: bool = False,
) -> int:
    """Produce ``records`` events with ids ``first_id..first_id+records-1`` round-robin over
    topics and their partitions; returns the number produced.

    ``value_format`` json (the default: plain JSON), avro or protobuf (Confluent framing,
    schemas registered at ``registry_url``). ``evolve``: the first ``records // 2`` events are
    written with schema version 1, the rest with version 2 (the added field ``channel``)."""
    rng = random.Random(seed + first_id)
    encoders: dict[int, Encoder] = {}
    if value_format != "json":
        encoders[1] = value_encoder(value_format, registry_url, 1)
        if evolve:
            encoders[2] = value_encoder(value_format, registry_url, 2)
    metadata, missing = _listed(
        AdminClient({"bootstrap.servers": bootstrap}), topics, 10, leaders=False
    )
    if missing:
        raise ValueError(f"topics {missing} do not exist on {bootstrap}; call ensure_topics first")
    counts = {t: len(metadata.topics[t].partitions) for t in topics}
    per_topic: dict[str, list[tuple[int, bytes]]] = {t: [] for t in topics}
    half = records // 2
    for n in range(records):
        event_id = first_id + n
        topic = topics[n % len(topics)]
        evolved = evolve and n >= half
        if value_format == "json":  # byte for byte what it always wrote (without --evolve)
            value = event(event_id, rng, evolved=evolved)
        else:
            fields = event_fields(event_id, rng, evolved=evolved)
            value = encoders[2 if evolved else 1](topic, fields)
        per_topic[topic].append(((n // len(topics)) % counts[topic], value))
    for topic, values in per_topic.items():
        if values:
            produce_values(bootstrap, topic, values)
    return records


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description="Produce sample order events.")
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--topics", help="comma-separated topic names")
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=4, help="for topics it creates")
    parser.add_argument("--first-id", type=int, default=0)
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="json",
        help="json (plain), or avro / protobuf in Confluent's wire format (needs a registry)",
    )
    parser.add_argument(
        "--registry-url", help="Schema Registry for avro/protobuf (scripts/produce.sh: the local)"
    )
    parser.add_argument(
        "--evolve",
        action="store_true",
        help="halfway through, switch to schema version 2 (adds the optional field channel)",
    )
    parser.add_argument(
        "--write-descriptor-set",
        type=Path,
        metavar="PATH",
        help="write order_event.proto's FileDescriptorSet to PATH and exit (no broker needed)",
    )
    parser.add_argument("--schema-version", type=int, choices=(1, 2), default=2)
    args = parser.parse_args(argv)
    if args.write_descriptor_set is not None:
        args.write_descriptor_set.write_bytes(order_event_descriptor_set(args.schema_version))
        print(f"wrote {args.write_descriptor_set} (order_event.proto v{args.schema_version})")
        return 0
    if not (args.bootstrap_servers and args.topics):
        parser.error("the following arguments are required: --bootstrap-servers, --topics")
    if args.format != "json" and not args.registry_url:
        print(
            f"error: --format {args.format} needs a schema registry: pass --registry-url "
            "(scripts/produce.sh reads the one scripts/broker.sh started)",
            file=sys.stderr,
        )
        return 2
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    ensure_topics(args.bootstrap_servers, topics, args.partitions)
    n = produce_events(
        args.bootstrap_servers,
        topics,
        args.records,
        first_id=args.first_id,
        value_format=args.format,
        registry_url=args.registry_url,
        evolve=args.evolve,
    )
    # the json line unchanged: scripts may read it
    kind = "" if args.format == "json" else f" {args.format}"
    evolved = " (schema v1, then v2 from the middle)" if args.evolve else ""
    print(f"produced {n}{kind} records to {','.join(topics)}{evolved}")
    return 0


def run() -> None:
    """Entry point of ``python -m`` (the producer tool): leaves with its real exit status, never one
    of interpreter teardown (see :mod:`..process_exit`)."""
    from kafka_delta.runtime.process_exit import run_and_exit

    run_and_exit(_cli)


if __name__ == "__main__":
    run()
