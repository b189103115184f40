"""Decoding end to end (issue: formats): Avro and Protobuf behind the local Schema Registry,
JSON against the project's schema file, on a real broker, real Delta tables and a real Spark
session. The decoder's own cases (every format, framing and reason) are in test_decoding.py;
the registry's API in test_registry.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from kafka_delta.config import PipelineConfig
from kafka_delta.pipeline import Pipeline
from kafka_delta_dev.produce import order_event_avro, produce_values
from support import PROJECT, assert_exactly_once, run_until_crash, table_ids

pytestmark = [pytest.mark.spark, pytest.mark.broker]


# The sample event's schema (schemas/order_event.avsc), and v2: a producer added `channel`.
ORDER_V1 = order_event_avro(1)
ORDER_V2 = order_event_avro(2)
START = datetime(2026, 1, 1, tzinfo=UTC)


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": i,
        "event_type": ("created", "paid")[i % 2],
        "amount": float(i) + 0.5,
        "event_time": START + timedelta(seconds=i),
        **extra,
    }


def produce(bootstrap: str, topic: str, values: Iterable[bytes | None], partitions: int) -> int:
    """``values`` round-robin over the partitions (the devtools producer: exact watermarks)."""
    pairs = [(i % partitions, v) for i, v in enumerate(values)]
    produce_values(bootstrap, topic, pairs)  # type: ignore[arg-type]
    return len(pairs)


def avro_values(
    registry_url: str,
    topic: str,
    schema: dict[str, Any],
    records: Iterable[dict[str, Any]],
    **conf: Any,
) -> list[bytes]:
    """Confluent-framed Avro, made by confluent-kafka's own serializer (auto-registering)."""
    serializer = AvroSerializer(
        SchemaRegistryClient({"url": registry_url}), json.dumps(schema), conf=conf or None
    )
    context = SerializationContext(topic, MessageField.VALUE)
    return [serializer(r, context) for r in records]


def decoding(fmt: str, registry_url: str | None = None, **value: Any) -> dict[str, Any]:
    section: dict[str, Any] = {"value": {"format": fmt, **value}}
    if registry_url:
        section["schema_registry"] = {"url": registry_url}
    return section


def with_decoding(cfg: PipelineConfig, section: dict[str, Any]) -> PipelineConfig:
    return cfg.with_overrides(decoding=section)


def rows_by_id(table: str) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in DeltaTable(table).to_pyarrow_table().to_pylist()}


def dead_letters(cfg: PipelineConfig) -> list[dict[str, Any]]:
    assert cfg.dead_letter_table is not None
    return sorted(
        DeltaTable(cfg.dead_letter_table).to_pyarrow_table().to_pylist(),
        key=lambda r: (r["partition"], r["offset"]),
    )


def test_avro_of_two_schema_versions_lands_once_and_the_table_gains_the_new_column(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, sink_engine
) -> None:
    (topic,) = new_topics(1, partitions=2)
    cfg = with_decoding(
        make_config([topic], engine=sink_engine), decoding("avro", schema_registry.url)
    )
    produce(
        kafka_bootstrap,
        topic,
        avro_values(schema_registry.url, topic, ORDER_V1, map(order, range(30))),
        2,
    )
    Pipeline(spark, cfg).run()
    assert "channel" not in DeltaTable(cfg.delta.table).schema().to_arrow().names

    # The producers move to v2 (an optional field added) while the table exists.
    v2 = [order(i, channel="web") for i in range(30, 50)]
    produce(kafka_bootstrap, topic, avro_values(schema_registry.url, topic, ORDER_V2, v2), 2)
    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 50)
    rows = rows_by_id(cfg.delta.table)
    assert {rows[i]["channel"] for i in range(30)} == {None}
    assert {rows[i]["channel"] for i in range(30, 50)} == {"web"}
    assert rows[7]["amount"] == 7.5 and rows[7]["event_type"] == "paid"
    assert rows[7]["event_time"] == START + timedelta(seconds=7)


def test_value_fields_named_like_kafkas_columns_land_as_value_columns_beside_them(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry
) -> None:
    """A producer's `timestamp` (the commonest field name there is), `key`, `topic`, `partition`
    and `offset` land as `value_timestamp`, ... beside Kafka's own columns, exactly once."""
    (topic,) = new_topics(1, partitions=2)
    schema = {
        "type": "record",
        "name": "Reading",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "key", "type": "string"},
            {"name": "topic", "type": "string"},
            {"name": "partition", "type": "int"},
            {"name": "offset", "type": "long"},
        ],
    }
    records = [
        {
            "id": i,
            "timestamp": START + timedelta(minutes=i),
            "key": f"sensor-{i}",
            "topic": "temperature",
            "partition": -i,
            "offset": 1000 + i,
        }
        for i in range(12)
    ]
    # No transform: every column lands as the decoder names it.
    cfg = with_decoding(make_config([topic], transform=None), decoding("avro", schema_registry.url))
    produce(kafka_bootstrap, topic, avro_values(schema_registry.url, topic, schema, records), 2)

    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 12)
    rows = rows_by_id(cfg.delta.table)
    assert rows[5]["value_timestamp"] == START + timedelta(minutes=5)
    assert (rows[5]["value_key"], rows[5]["value_topic"]) == ("sensor-5", "temperature")
    assert (rows[5]["value_partition"], rows[5]["value_offset"]) == (-5, 1005)
    # Kafka's own columns are Kafka's: where the record is, and when the broker took it.
    assert rows[5]["topic"] == topic and rows[5]["partition"] in (0, 1)
    assert sorted(r["offset"] for r in rows.values() if r["partition"] == 0) == list(range(6))
    assert all(r["timestamp"] > START + timedelta(days=1) for r in rows.values())


CASES_V1 = {
    "type": "record",
    "name": "Cased",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "Id", "type": "string"},
        {"name": "Offset", "type": "long"},
        {"name": "KEY", "type": "string"},
        {"name": "Timestamp", "type": "long"},
        {
            "name": "r",
            "type": {
                "type": "record",
                "name": "Inner",
                "fields": [{"name": "a", "type": "long"}, {"name": "A", "type": "string"}],
            },
        },
    ],
}


def test_value_fields_that_differ_only_in_case_land_under_the_documented_rename_exactly_once(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, sink_engine
) -> None:
    """Avro tells `id` from `Id` and `Offset` from Kafka's `offset`; Delta does not (a raw
    "Duplicate field name (case-insensitive)" on every restart before). Each field whose name
    is taken without case lands as `value_<name>`, nested ones too; a later version's new
    field of the same name gets its own column and the earlier ones keep theirs."""
    (topic,) = new_topics(1, partitions=2)
    cfg = with_decoding(
        make_config([topic], engine=sink_engine, transform=None),
        decoding("avro", schema_registry.url),
    )

    def record(i: int, **extra: Any) -> dict[str, Any]:
        r = {"id": i, "Id": f"I{i}", "Offset": 100 + i, "KEY": f"k{i}", "Timestamp": -i}
        return {**r, "r": {"a": i, "A": f"a{i}"}, **extra}

    values = avro_values(schema_registry.url, topic, CASES_V1, map(record, range(6)))
    produce(kafka_bootstrap, topic, values, 2)
    Pipeline(spark, cfg).run()

    v2 = json.loads(json.dumps(CASES_V1))
    v2["fields"].append({"name": "iD", "type": ["null", "string"], "default": None})
    later = [record(i, iD=f"d{i}") for i in range(6, 10)]
    produce(kafka_bootstrap, topic, avro_values(schema_registry.url, topic, v2, later), 2)
    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 10)
    rows = rows_by_id(cfg.delta.table)
    assert (rows[3]["value_Id"], rows[3]["value_Offset"], rows[3]["value_KEY"]) == ("I3", 103, "k3")
    assert rows[3]["value_Timestamp"] == -3 and rows[3]["r"] == {"a": 3, "value_A": "a3"}
    assert rows[3]["value_value_iD"] is None and rows[8]["value_value_iD"] == "d8"
    assert rows[8]["value_Id"] == "I8" and rows[8]["offset"] < 10
    assert cfg.dead_letter_table is not None
    assert not DeltaTable.is_deltatable(cfg.dead_letter_table)


def test_json_fields_that_differ_only_in_case_land_under_the_documented_rename(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path: Path
) -> None:
    (topic,) = new_topics(1, partitions=2)
    schema = tmp_path / "cased.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "ID": {"type": "string"},
                    "Partition": {"type": "integer"},
                    "r": {
                        "type": "object",
                        "properties": {"b": {"type": "integer"}, "B": {"type": "integer"}},
                    },
                },
            }
        )
    )
    cfg = with_decoding(
        make_config([topic], transform=None), decoding("json", schema_file=str(schema))
    )
    values = [
        json.dumps({"id": i, "ID": f"x{i}", "Partition": -i, "r": {"b": i, "B": 2 * i}}).encode()
        for i in range(8)
    ]
    produce(kafka_bootstrap, topic, values, 2)
    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 8)
    rows = rows_by_id(cfg.delta.table)
    assert (rows[5]["value_ID"], rows[5]["value_Partition"], rows[5]["partition"]) == ("x5", -5, 1)
    assert rows[5]["r"] == {"b": 5, "value_B": 10}


def test_a_writer_schema_the_reader_lacks_restarts_the_query_with_its_fields_exactly_once(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry
) -> None:
    """v2 is registered under the record's name (RecordNameStrategy), not the topic's subject:
    the reader schema made at start lacks `channel`, the read task finds it in the records,
    and the run restarts its query with it; the failed batch committed nothing."""
    from confluent_kafka.schema_registry import record_subject_name_strategy

    (topic,) = new_topics(1, partitions=2)
    cfg = with_decoding(
        make_config([topic]),
        decoding("avro", schema_registry.url, subject_name_strategy="record_name"),
    )
    values = avro_values(schema_registry.url, topic, ORDER_V1, map(order, range(20)))
    values += avro_values(
        schema_registry.url,
        topic,
        ORDER_V2,
        [order(i, channel="app") for i in range(20, 35)],
        **{"subject.name.strategy": record_subject_name_strategy},
    )
    produce(kafka_bootstrap, topic, values, 2)

    summary = Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 35)
    assert summary.rows_written == 35
    rows = rows_by_id(cfg.delta.table)
    assert {rows[i]["channel"] for i in range(20)} == {None}
    assert {rows[i]["channel"] for i in range(20, 35)} == {"app"}


def test_protobuf_from_the_registry_lands_typed(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry
) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    from kafka_delta_dev.produce import order_event_message

    (topic,) = new_topics(1, partitions=2)
    message = order_event_message(1)
    serializer = ProtobufSerializer(
        message,
        SchemaRegistryClient({"url": schema_registry.url}),
        {"use.deprecated.format": False},
    )
    context = SerializationContext(topic, MessageField.VALUE)
    values = []
    for i in range(25):
        m = message(id=i, event_type="created", amount=i * 2.0)
        m.event_time.FromDatetime(START + timedelta(seconds=i))
        values.append(serializer(m, context))
    produce(kafka_bootstrap, topic, values, 2)
    cfg = with_decoding(make_config([topic]), decoding("protobuf", schema_registry.url))

    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 25)
    rows = rows_by_id(cfg.delta.table)
    assert rows[3]["amount"] == 6.0 and rows[3]["event_type"] == "created"
    assert rows[3]["event_time"] == START + timedelta(seconds=3)


def test_records_that_cannot_be_decoded_are_dead_letters_with_their_reason_and_bytes(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry
) -> None:
    (topic,) = new_topics(1, partitions=1)
    good = avro_values(schema_registry.url, topic, ORDER_V1, map(order, range(10)))
    bad = {
        "wrong magic": b'{"id": 1}',
        "unknown id": b"\x00\x00\x00\x27\x0f" + good[0][5:],  # schema id 9999
        "truncated": good[1][:-4],
        "null": None,
    }
    produce(kafka_bootstrap, topic, [*good[:5], *bad.values(), *good[5:]], 1)
    cfg = with_decoding(make_config([topic]), decoding("avro", schema_registry.url))

    Pipeline(spark, cfg).run()

    assert sorted(table_ids(cfg)) == list(range(10))
    letters = dead_letters(cfg)
    assert [r["offset"] for r in letters] == [5, 6, 7, 8]
    assert [r["value"] for r in letters] == list(bad.values())
    errors = [r["error"] for r in letters]
    assert "magic" in errors[0] and "0x7b" in errors[0].lower(), errors[0]
    assert "9999" in errors[1], errors[1]
    assert errors[2], errors[2]
    assert "null" in errors[3], errors[3]


def test_json_is_decoded_against_the_projects_schema_file_and_bad_lines_are_dead_letters(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    (topic,) = new_topics(1, partitions=1)
    good = [json.dumps({**order(i), "event_time": f"2026-01-01T00:00:{i:02d}Z"}) for i in range(8)]
    bad = [b"{not json", b'{"id": "seven"}', b'{"event_type": "paid"}']
    values = [g.encode() for g in good[:4]] + bad + [g.encode() for g in good[4:]]
    produce(kafka_bootstrap, topic, values, 1)
    cfg = with_decoding(
        make_config([topic]),
        decoding("json", schema_file=str(PROJECT / "schemas" / "order_event.ddl")),
    )

    Pipeline(spark, cfg).run()

    assert sorted(table_ids(cfg)) == list(range(8))
    letters = dead_letters(cfg)
    assert [r["offset"] for r in letters] == [4, 5, 6]
    assert [r["value"] for r in letters] == bad
    assert "id" in letters[2]["error"], letters[2]["error"]
    assert rows_by_id(cfg.delta.table)[5]["event_time"] == START + timedelta(seconds=5)


def test_registry_down_commits_nothing_and_the_run_completes_exactly_once_when_it_is_back(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, caplog
) -> None:
    (topic,) = new_topics(1, partitions=2)
    produce(
        kafka_bootstrap,
        topic,
        avro_values(schema_registry.url, topic, ORDER_V1, map(order, range(40))),
        2,
    )
    cfg = with_decoding(make_config([topic]), decoding("avro", schema_registry.url))
    schema_registry.stop()
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            Pipeline(spark, cfg).run()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    caplog.set_level("WARNING")
    runner = threading.Thread(target=run)
    runner.start()
    try:
        time.sleep(6)
        assert not Path(cfg.delta.table, "_delta_log").exists()  # nothing committed
        assert runner.is_alive()
    finally:
        schema_registry.start()
    runner.join(240)
    assert outcome == [None]
    assert_exactly_once(cfg, 40)
    assert any("retrying in" in r.getMessage() for r in caplog.records)


def test_a_pipeline_started_before_any_producer_registered_a_schema_waits_for_the_first(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, caplog
) -> None:
    """Deployed before its producers: the run waits (as for a registry outage) instead of
    stopping, and reads the records once the first producer registered its schema."""
    (topic,) = new_topics(1, partitions=2)
    cfg = with_decoding(make_config([topic]), decoding("avro", schema_registry.url))
    producer = threading.Timer(
        2.0,
        lambda: produce(
            kafka_bootstrap,
            topic,
            avro_values(schema_registry.url, topic, ORDER_V1, map(order, range(40))),
            2,
        ),
    )
    producer.start()
    try:
        Pipeline(spark, cfg).run()
    finally:
        producer.join()
    assert f"has no schema under {topic}-value yet: waiting" in caplog.text
    Pipeline(spark, cfg).run()  # what the first run's target left for the next
    assert_exactly_once(cfg, 40)


def test_an_incompatible_change_makes_dead_letters_naming_the_field_and_both_types(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry
) -> None:
    """A version no rule covers (double -> string, registered under compatibility NONE): its
    records are dead letters with the schema id and the reason; the good records of the same
    batch land, and the run goes on (it used to stop, writing nothing)."""
    (topic,) = new_topics(1, partitions=1)
    cfg = with_decoding(make_config([topic]), decoding("avro", schema_registry.url))
    produce(
        kafka_bootstrap,
        topic,
        avro_values(schema_registry.url, topic, ORDER_V1, map(order, range(5))),
        1,
    )
    Pipeline(spark, cfg).run()

    client = SchemaRegistryClient({"url": schema_registry.url})
    client.set_compatibility(subject_name=f"{topic}-value", level="NONE")
    amount_as_text = {
        **ORDER_V1,
        "fields": [
            {"name": f["name"], "type": "string"} if f["name"] == "amount" else f
            for f in ORDER_V1["fields"]
        ],
    }
    texts = [{**order(i), "amount": "lots"} for i in range(5, 8)]
    values = avro_values(schema_registry.url, topic, amount_as_text, texts)
    values += avro_values(schema_registry.url, topic, ORDER_V1, map(order, range(8, 12)))
    produce(kafka_bootstrap, topic, values, 1)

    Pipeline(spark, cfg).run()

    assert sorted(rows_by_id(cfg.delta.table)) == [0, 1, 2, 3, 4, 8, 9, 10, 11]
    dead = dead_letters(cfg)
    assert [d["offset"] for d in dead] == [5, 6, 7]
    error = dead[0]["error"]
    assert "schema id" in error and "'amount'" in error, error
    assert "double" in error and "string" in error, error


def test_a_record_of_another_subjects_schema_is_a_dead_letter_and_widens_nothing(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry
) -> None:
    """TopicNameStrategy (the default): a record framed with a schema registered under another
    subject is a dead letter naming its schema id and subject; the batch's good records land
    and the table gains none of that schema's fields."""
    topic, other = new_topics(2, partitions=1)
    cfg = with_decoding(make_config([topic]), decoding("avro", schema_registry.url))
    stranger = {
        "type": "record",
        "name": "Stranger",
        "fields": [{"name": "who", "type": "string"}, {"name": "n", "type": "long"}],
    }
    values = avro_values(schema_registry.url, topic, ORDER_V1, map(order, range(10)))
    values += avro_values(schema_registry.url, other, stranger, [{"who": "x", "n": 1}] * 2)
    values += avro_values(schema_registry.url, topic, ORDER_V1, map(order, range(10, 20)))
    produce(kafka_bootstrap, topic, values, 1)

    Pipeline(spark, cfg).run()

    assert sorted(rows_by_id(cfg.delta.table)) == list(range(20))
    assert "who" not in DeltaTable(cfg.delta.table).schema().to_arrow().names
    dead = dead_letters(cfg)
    assert [d["offset"] for d in dead] == [10, 11]
    error = dead[0]["error"]
    assert f"registered under {other}-value, not {topic}-value" in error, error
    assert "schema id" in error, error


@pytest.mark.parametrize("by_udf", [True, False], ids=["arrow_udf", "map_in_arrow"])
def test_the_cluster_engine_decodes_spark_kafka_columns_with_the_same_decoder(
    spark, schema_registry, by_udf
) -> None:
    """Spark's kafka source is not available here: its DataFrame's shape is built by hand and
    decoded the cluster engine's ways (an Arrow UDF of the record's bytes, Kafka's columns
    staying in the JVM; ``mapInArrow`` of every column where Spark has no Arrow UDFs), against
    the read task's output, column for column: Avro framed in the value, one record's schema id
    in a header, a record that is garbage, a null value, keys and headers kept."""
    import pyarrow as pa
    from confluent_kafka.schema_registry import header_schema_id_serializer

    from kafka_delta.config import DecodingConfig
    from kafka_delta.contract import KAFKA_ARROW_SCHEMA as ARROW_SCHEMA
    from kafka_delta.decoding.dataframe import decode_frame
    from kafka_delta.decoding.decoder import decoder_for
    from kafka_delta.decoding.resolve import decode_spec

    topic = f"cluster-{time.monotonic_ns()}"
    values: list[bytes | None] = avro_values(
        schema_registry.url, topic, ORDER_V1, map(order, range(6))
    )
    headers: list[tuple[str, bytes]] = []
    serializer = AvroSerializer(
        SchemaRegistryClient({"url": schema_registry.url}),
        json.dumps(ORDER_V1),
        conf={"schema.id.serializer": header_schema_id_serializer},
    )
    values.append(serializer(order(6), SerializationContext(topic, MessageField.VALUE, headers)))
    values += [b"\x01garbage", None]
    n = len(values)
    header_rows = [None] * n
    header_rows[6] = [{"key": k, "value": v} for k, v in headers]
    kafka = pa.RecordBatch.from_arrays(
        [
            pa.array([f"k{i}".encode() for i in range(n)]),
            pa.array(values, pa.binary()),
            pa.array([topic] * n),
            pa.array([0] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([START] * n, pa.timestamp("us", tz="UTC")),
            pa.array([0] * n, pa.int32()),
            pa.array(header_rows, ARROW_SCHEMA.field("headers").type),
        ],
        schema=ARROW_SCHEMA,
    )
    section = DecodingConfig.model_validate(decoding("avro", schema_registry.url))
    spec = decode_spec(spark, section, (topic,))
    assert spec.reads_headers
    frame = spark.createDataFrame(kafka.to_pandas(), schema=ARROW_SCHEMA_DDL)

    decoded = decode_frame(frame, spec, by_udf=by_udf).toArrow()

    expected = pa.Table.from_batches([decoder_for(spec.to_json()).decode(kafka)])
    assert decoded.schema.names == expected.schema.names
    assert decoded.sort_by("offset").to_pylist() == expected.to_pylist()
    errors = decoded.sort_by("offset").column("_error").to_pylist()
    assert errors[:7] == [None] * 7 and all(errors[7:]), errors
    if by_udf:  # this Spark has Arrow UDFs: the engine's own call takes them
        plan = decode_frame(frame, spec)._jdf.queryExecution().executedPlan().toString()
        assert "ArrowEvalPython" in plan and "MapInArrow" not in plan, plan


ARROW_SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int, headers array<struct<key: string, value: binary>>"
)


def test_a_crash_between_the_add_columns_commit_and_the_batch_loses_and_doubles_nothing(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, tmp_path
) -> None:
    """delta-rs: the new column is one commit, the batch the next. A run SIGKILLed between
    them (crash point after_add_columns) leaves the column and no row of the batch; the
    restart finds the column in place and lands the batch once."""
    (topic,) = new_topics(1, partitions=2)
    cfg = with_decoding(make_config([topic]), decoding("avro", schema_registry.url))
    v1 = avro_values(schema_registry.url, topic, ORDER_V1, map(order, range(10)))
    produce(kafka_bootstrap, topic, v1, 2)
    Pipeline(spark, cfg).run()
    v2 = [order(i, channel="web") for i in range(10, 20)]
    produce(kafka_bootstrap, topic, avro_values(schema_registry.url, topic, ORDER_V2, v2), 2)

    run_until_crash(cfg, tmp_path, "after_add_columns")
    table = DeltaTable(cfg.delta.table)
    assert "channel" in table.schema().to_arrow().names
    assert sorted(table_ids(cfg)) == list(range(10))

    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 20)
    rows = rows_by_id(cfg.delta.table)
    assert {rows[i]["channel"] for i in range(10, 20)} == {"web"}
