"""Sample-event producer and topic set-up for local runs and tests.

    python -m <pkg>.devtools.produce --bootstrap-servers 127.0.0.1:9092 --topics orders \
        --records 10000 --partitions 4
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

EVENT_TYPES = ("created", "paid", "shipped", "refunded")


def ensure_topics(bootstrap: str, topics: Iterable[str], partitions: int) -> None:
    """Create topics that do not exist yet (existing ones are left as they are)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=10).topics)
    wanted = [NewTopic(t, partitions, 1) for t in topics if t not in existing]
    if not wanted:
        return
    for future in admin.create_topics(wanted, request_timeout=10).values():
        try:
            future.result()
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


def event(event_id: int, rng: random.Random) -> bytes:
    """One ~75-byte JSON order event, the shape the sample transform parses."""
    when = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=event_id)
    return json.dumps(
        {
            "id": event_id,
            "event_type": EVENT_TYPES[event_id % len(EVENT_TYPES)],
            "amount": round(rng.uniform(1, 500), 2),
            "event_time": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        separators=(",", ":"),
    ).encode()


def _produce(producer: Producer, topic: str, partition: int, key: bytes, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, partition=partition)
            producer.poll(0)
            return
        except BufferError:  # local queue full: let deliveries drain, then retry
            producer.poll(0.1)


def produce_values(
    bootstrap: str,
    topic: str,
    values: Sequence[tuple[int, bytes]],
    *,
    transactional_id: str | None = None,
) -> None:
    """Produce ``(partition, value)`` pairs; with ``transactional_id``, in one committed
    transaction (its commit markers leave gaps in the partitions' offsets)."""
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    if transactional_id:
        conf["transactional.id"] = transactional_id
    producer = Producer(conf)
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
            _produce(producer, topic, partition, str(i).encode(), value)
    producer.flush(60)
    for i in sorted(tail):
        partition, value = values[i]
        _produce(producer, topic, partition, str(i).encode(), value)
        producer.flush(60)
    if transactional_id:
        producer.commit_transaction(30)
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} records to {topic} were not acknowledged")


def produce_events(
    bootstrap: str,
    topics: Sequence[str],
    records: int,
    *,
    first_id: int = 0,
    seed: int = 7,
) -> int:
    """Produce ``records`` events with ids ``first_id..first_id+records-1`` round-robin over
    topics and their partitions; returns the number produced."""
    rng = random.Random(seed + first_id)
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    counts = {t: len(metadata.topics[t].partitions) if t in metadata.topics else 0 for t in topics}
    missing = [t for t, n in counts.items() if n == 0]
    if missing:
        raise ValueError(f"topics {missing} do not exist on {bootstrap}; call ensure_topics first")
    per_topic: dict[str, list[tuple[int, bytes]]] = {t: [] for t in topics}
    for n in range(records):
        event_id = first_id + n
        topic = topics[n % len(topics)]
        per_topic[topic].append(((n // len(topics)) % counts[topic], event(event_id, rng)))
    for topic, values in per_topic.items():
        if values:
            produce_values(bootstrap, topic, values)
    return records


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Produce sample JSON order events.")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topics", required=True, help="comma-separated topic names")
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=4, help="for topics it creates")
    parser.add_argument("--first-id", type=int, default=0)
    args = parser.parse_args(argv)
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    ensure_topics(args.bootstrap_servers, topics, args.partitions)
    n = produce_events(
        args.bootstrap_servers,
        topics,
        args.records,
        first_id=args.first_id,
    )
    print(f"produced {n} records to {','.join(topics)}")
    return 0


def run() -> None:
    """Entry point of ``python -m`` (the producer tool): leaves with its real exit status, never one
    of interpreter teardown (see :mod:`..process_exit`)."""
    from ..process_exit import run_and_exit

    run_and_exit(_cli)


if __name__ == "__main__":
    run()
