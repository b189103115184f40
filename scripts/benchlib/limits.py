"""Workers of the limit rows (1-3), each run in its own process by :mod:`.procs`: raw consume,
raw Delta write, and the hand-written single-process ingest the pipeline is compared with.

Each returns a JSON-able dict: ``rows``, ``batches`` as ``[commit time, rows]`` pairs, and the
times its clock needs (see :func:`.rows.steady`)."""

from __future__ import annotations

import json
import multiprocessing
import time
from typing import Any

from .kafka_io import parse_avro_messages, parse_messages, read_batches


def _consume_partitions(args: tuple[str, str, dict[int, int]]) -> tuple[float, float, float, int]:
    """(consumer created, first records in, last record in, records) of one process."""
    bootstrap, topic, ends = args
    created, first, count = time.time(), 0.0, 0
    for messages, _ in read_batches(bootstrap, topic, ends, 10_000, "bench-raw-consume"):
        first = first or time.time()
        for msg in messages:
            msg.value()
        count += len(messages)
    return created, first, time.time(), count


def work_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """Row 1: one process per core, partitions dealt round-robin, values touched, nothing kept.

    The clock runs from the creation of the consumers to the last record, every record counted:
    librdkafka prefetches in the background, so a clock started at the first records returned
    would leave out the fetching it is meant to measure."""
    ends = {int(p): o for p, o in spec["ends"].items()}
    parts = sorted(ends)
    procs = max(1, min(spec["processes"], len(parts)))
    shares = [{p: ends[p] for p in parts[i::procs]} for i in range(procs)]
    # fork before any Kafka client exists in this process (librdkafka threads do not fork).
    context = multiprocessing.get_context("fork")
    with context.Pool(procs) as pool:
        results = pool.map(
            _consume_partitions, [(spec["bootstrap"], spec["topic"], s) for s in shares]
        )
    first_reads = [r[1] for r in results if r[1]]
    return {
        "rows": sum(r[3] for r in results),
        "clock_start": min(r[0] for r in results),
        "first_records": min(first_reads) if first_reads else time.time(),
        "end": max(r[2] for r in results),
        "batches": [],
    }


def work_write(spec: dict[str, Any]) -> dict[str, Any]:
    """Row 2: the rows are read and parsed first (untimed), then appended in batch-size commits."""
    from deltalake import write_deltalake

    ends = {int(p): o for p, o in spec["ends"].items()}
    prepared = [
        parse_messages(messages, spec["topic"])
        for messages, _ in read_batches(
            spec["bootstrap"], spec["topic"], ends, spec["batch_size"], "bench-raw-write"
        )
    ]
    begin = time.time()
    batches = []
    for data in prepared:
        write_deltalake(spec["table"], data, mode="append")
        batches.append((time.time(), data.num_rows))
    return {
        "rows": sum(b[1] for b in batches),
        "begin": begin,
        "batches": batches,
        "note": "rows pre-parsed, prep untimed",
    }


def work_simple(spec: dict[str, Any]) -> dict[str, Any]:
    """Row 3: the ingest a user might hand-write in one process (JSON parsed by pyarrow.json)."""
    return _ingest(spec, parse_messages, "bench-simple-ingest")


def work_simple_avro(spec: dict[str, Any]) -> dict[str, Any]:
    """Row 9: row 3 on Confluent-framed Avro: fastavro's schemaless reader with the writer
    schema fetched once per schema id from the registry, Arrow columns built per field."""
    schemas: dict[int, Any] = {}

    def parse(messages: Any, topic: str) -> Any:
        return parse_avro_messages(messages, topic, spec["registry_url"], schemas)

    return _ingest(spec, parse, "bench-simple-avro-ingest")


def _ingest(spec: dict[str, Any], parse: Any, app_id: str) -> dict[str, Any]:
    """A hand-written single-process ingest, with the same exactly-once commit as the
    pipeline: resume from the offsets in the newest commit, and write each batch in one commit
    holding a txn (app id, version) and its end offsets in userMetadata."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import TableNotFoundError

    topic, table_uri = spec["topic"], spec["table"]
    ends = {int(p): o for p, o in spec["ends"].items()}
    try:
        table = DeltaTable(table_uri)
        version = table.transaction_version(app_id)
        meta = json.loads(table.history(1)[0].get("userMetadata") or "{}")
        starts = {int(p): o for p, o in meta.get("offsets", {}).get(topic, {}).items()}
    except TableNotFoundError:
        version, starts = None, {}
    next_version = -1 if version is None else version
    batches = []
    for messages, position in read_batches(
        spec["bootstrap"], topic, ends, spec["batch_size"], "bench-simple", starts
    ):
        data = parse(messages, topic)
        next_version += 1
        metadata = json.dumps({"offsets": {topic: {str(p): o for p, o in position.items()}}})
        write_deltalake(
            table_uri,
            data,
            mode="append",
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id, next_version)],
                custom_metadata={"userMetadata": metadata},
            ),
        )
        batches.append((time.time(), data.num_rows))
    return {"rows": sum(b[1] for b in batches), "batches": batches, "note": "1 process"}
