"""Change data capture (issue: formats, CDC): Debezium change events land raw (``before`` and
``after`` as structs) or unwrapped (``decoding.value.envelope: debezium``), where upsert mode
applies c/u/r as upserts and d as deletes in source order, and tombstones can delete their key
(``delta.tombstones: delete``). Exactly once through a SIGKILL and its restart. Real broker,
the development Schema Registry, real Delta tables, real Spark; events made by
kafka_delta_dev.debezium (Avro by confluent-kafka's own serializer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from conftest import engine_config, skip_without_connectors
from kafka_delta.config import ConfigError, PipelineConfig, load_config
from kafka_delta.contract import OP_COLUMN
from kafka_delta.offsets.model import parse_user_metadata
from kafka_delta.pipeline import Pipeline
from kafka_delta_dev.debezium import (
    ENVELOPE_DDL,
    Change,
    changes,
    json_key,
    json_value,
    model,
    produce_changes,
    produce_records,
)
from support import run_until_crash

pytestmark = [pytest.mark.spark, pytest.mark.broker]

ROW = ("id", "name", "email", "balance")


def _table_rows(cfg: PipelineConfig, version: int | None = None) -> dict[int, dict[str, Any]]:
    table = DeltaTable(cfg.delta.table, version=version)
    return {r["id"]: {k: r[k] for k in ROW} for r in table.to_pyarrow_table().to_pylist()}


def _dead_letters(cfg: PipelineConfig) -> list[dict[str, Any]]:
    assert cfg.dead_letter_table is not None
    rows = DeltaTable(cfg.dead_letter_table).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


def _avro_decoding(registry_url: str) -> dict[str, Any]:
    return {
        "value": {"format": "avro"},
        "key": {"format": "avro"},
        "schema_registry": {"url": registry_url},
    }


def _json_decoding(tmp_path: Path) -> dict[str, Any]:
    value, key = tmp_path / "customers.ddl", tmp_path / "customers_key.ddl"
    value.write_text(ENVELOPE_DDL, encoding="utf-8")
    key.write_text("id BIGINT", encoding="utf-8")
    return {
        "value": {"format": "json", "schema_file": str(value), "envelope": "debezium"},
        "key": {"format": "json", "schema_file": str(key)},
    }


def _upsert(cfg: PipelineConfig, decoding: dict[str, Any], **delta: Any) -> PipelineConfig:
    return cfg.with_overrides(
        decoding=decoding,
        delta={
            **cfg.delta.model_dump(),
            "mode": "upsert",
            "merge_keys": ["id"],
            "tombstones": "delete",
            **delta,
        },
    )


def test_raw_debezium_avro_lands_before_and_after_as_structs(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, sink_engine
) -> None:
    """Without the envelope the event lands as it is: ``before`` and ``after`` are nullable
    records (null in an insert's before and a delete's after), ``source`` a record; a tombstone
    is a dead letter, as any null value."""
    (topic,) = new_topics(1, partitions=2)
    history = changes(40, 8, seed=3)
    produce_changes(kafka_bootstrap, topic, history, 2, "avro", schema_registry.url)
    cfg = make_config([topic], engine=sink_engine, transform=None).with_overrides(
        decoding=_avro_decoding(schema_registry.url)
    )

    Pipeline(spark, cfg).run()

    table = DeltaTable(cfg.delta.table)
    schema = pa.schema(table.schema().to_arrow())
    for name in ("before", "after", "source"):
        assert pa.types.is_struct(schema.field(name).type), schema
    landed = {r["source"]["lsn"]: r for r in table.to_pyarrow_table().to_pylist()}
    events = [c for c in history if not c.tombstone]
    assert sorted(landed) == [c.lsn for c in events]
    for change in events:
        row = landed[change.lsn]
        assert (row["op"], row["before"], row["after"]) == (change.op, change.before, change.after)
        assert row["key"] == {"id": change.id}
    assert {c.op for c in events} >= {"r", "c", "u", "d"}
    tombstones = _dead_letters(cfg)
    assert len(tombstones) == sum(c.tombstone for c in history) > 0
    assert {r["error"] for r in tombstones} == {"value is null"}


def _specials(first_id: int) -> list[Change]:
    """Changes of keys the random history never touches, all in one batch: a key deleted and
    inserted again (the insert must win), one inserted and deleted (absent), one updated
    twice (the last wins)."""
    a, b, c = first_id, first_id + 1, first_id + 2

    def row(key: int, version: int) -> dict[str, Any]:
        return {"id": key, "name": f"special-{key}-v{version}", "email": None, "balance": 1.0}

    return [
        Change(a, "c", None, row(a, 0), 9001),
        Change(b, "c", None, row(b, 0), 9002),
        Change(c, "c", None, row(c, 0), 9003),
        Change(a, "d", row(a, 0), None, 9004),
        Change(a, None, None, None, 9005),
        Change(b, "u", row(b, 0), row(b, 1), 9006),
        Change(a, "c", None, row(a, 1), 9007),
        Change(c, "d", row(c, 0), None, 9008),
        Change(c, None, None, None, 9009),
        Change(b, "u", row(b, 1), row(b, 2), 9010),
    ]


# The embedded engine decodes in its read task; Spark's kafka source (here its stand-in) decodes
# its output through mapInArrow: the same rows either way, and either sink applies them.
CDC_ENGINES = ["embedded", "standin+delta_rs", "embedded+delta_spark"]


@pytest.mark.parametrize("engine_name", CDC_ENGINES)
def test_unwrapped_debezium_upserts_and_deletes_in_source_order_across_batches(
    spark, kafka_bootstrap, new_topics, make_config, engine_name: str, tmp_path
) -> None:
    """JSON events (schemas disabled), unwrapped: each run's table is the model of what was
    read (each key's last state, deleted keys absent), within a batch and across batches; a
    truncate is a dead letter naming itself, and ``_op`` is not a column of the table."""
    engine = engine_config(engine_name)
    skip_without_connectors(spark, engine)
    (topic,) = new_topics(1, partitions=2)
    history = changes(120, 12, seed=5)
    first, second = history[:70], history[70:]
    # Each key's changes share a partition (id % 2), in the order they were made.
    first += _specials(100)
    produce_changes(kafka_bootstrap, topic, first, 2, "json")
    truncate = {"before": None, "after": None, "source": None, "op": "t", "ts_ms": 1}
    produce_records(kafka_bootstrap, topic, [(1, None, json.dumps(truncate).encode())])
    cfg = _upsert(make_config([topic], engine=engine, transform=None), _json_decoding(tmp_path))

    Pipeline(spark, cfg).run()

    expected = model(first)
    assert expected[100]["name"] == "special-100-v1" and 101 in expected and 102 not in expected
    assert _table_rows(cfg) == expected
    assert OP_COLUMN not in DeltaTable(cfg.delta.table).schema().to_arrow().names
    (dead,) = _dead_letters(cfg)
    assert dead["error"].startswith("Debezium truncate (op 't') is not applied")

    # A tombstone alone (a compacted topic's delete, no Debezium event before it) deletes too.
    second += [Change(101, None, None, None, 9100)]
    produce_changes(kafka_bootstrap, topic, second, 2, "json")
    Pipeline(spark, cfg).run()

    assert 101 not in model(first + second)  # it was in the table after the first run
    assert _table_rows(cfg) == model(first + second)
    assert len(_dead_letters(cfg)) == 1


def test_debezium_avro_through_a_kill_lands_exactly_once_and_no_commit_reapplies_an_older_state(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, sink_engine, tmp_path
) -> None:
    """Avro events and keys through the registry, unwrapped, tombstones as deletes, several
    batches. The first run is SIGKILLed right after batch 1's Delta commit (before Spark records
    it); the restart replays batch 1 (which writes nothing) and goes on. The final table is the
    model, and the table as of every commit of the pipeline is the model of exactly the records
    below that commit's stored offsets: no batch applied twice, none out of order."""
    (topic,) = new_topics(1, partitions=3)
    history = changes(360, 30, seed=11)
    offsets = produce_changes(kafka_bootstrap, topic, history, 3, "avro", schema_registry.url)
    cfg = _upsert(
        make_config([topic], engine=sink_engine, transform=None, max_records_per_trigger=90),
        {
            **_avro_decoding(schema_registry.url),
            "value": {"format": "avro", "envelope": "debezium"},
        },
    )
    run_until_crash(cfg, tmp_path, "after_delta_commit", after=1)
    commits_before = _pipeline_commits(cfg)
    assert [c.batch_id for _, c in commits_before] == [0, 1]

    summary = Pipeline(spark, cfg).run()

    print(
        f"{len(history)} records ({sum(c.op == 'd' for c in history)} deletes, "
        f"{sum(c.tombstone for c in history)} tombstones), {summary.batches} batches after the "
        f"kill, {len(model(history))} rows"
    )
    assert {"r", "c", "u", "d"} <= {c.op for c in history}
    assert summary.replayed_batches == 1  # batch 1 again: in the table, so nothing written
    assert _table_rows(cfg) == model(history)
    commits = _pipeline_commits(cfg)
    assert [c.batch_id for _, c in commits] == list(range(len(commits))) and len(commits) >= 4
    partition_of = [c.id % 3 for c in history]
    for version, commit in commits:
        ends = commit.end_offsets[topic]
        read = [c for c, p, o in zip(history, partition_of, offsets, strict=True) if o < ends[p]]
        assert _table_rows(cfg, version) == model(read), f"version {version}"
    assert cfg.dead_letter_table is not None
    assert not Path(cfg.dead_letter_table).exists()  # every record made a row or deleted one


def _pipeline_commits(cfg: PipelineConfig) -> list[tuple[int, Any]]:
    found = []
    for entry in DeltaTable(cfg.delta.table).history():
        commit = parse_user_metadata(entry.get("userMetadata"), cfg.pipeline_id)
        if commit is not None:
            found.append((int(entry["version"]), commit))
    return sorted(found, key=lambda vc: vc[0])


def test_a_decoded_key_fills_the_merge_keys_of_a_tombstone(tmp_path) -> None:
    """Decoding alone (no Spark): a tombstone with ``delta.tombstones: delete`` is a delete row
    whose merge key comes from the key; without a usable key it is a dead letter."""
    from kafka_delta.contract import KAFKA_ARROW_SCHEMA
    from kafka_delta.decoding.decoder import Decoder
    from kafka_delta.decoding.spec import DecodeSpec, FieldSpec

    row = pa.struct([("id", pa.int64()), ("name", pa.string())])
    reader = pa.schema([("before", row), ("after", row), ("op", pa.string())])
    spec = DecodeSpec(
        value=FieldSpec(format="json", framing="none", reader=reader),
        key=FieldSpec(format="json", framing="none", reader=pa.schema([("id", pa.int64())])),
        envelope="debezium",
        tombstone_keys=("id",),
    )
    after = Change(7, "c", None, {"id": 7, "name": "x"}, 1)
    gone = Change(7, "d", {"id": 7, "name": "x"}, None, 2)
    values = [json_value(after), json_value(gone), None, None, b'{"op":"m"}']
    keys = [json_key(after), json_key(gone), b'{"id":7}', None, b'{"id":8}']
    n = len(values)
    kafka = pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(["t"] * n),
            pa.array([0] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.nulls(n, pa.timestamp("us", tz="UTC")),
            pa.array([0] * n, pa.int32()),
            pa.nulls(n, KAFKA_ARROW_SCHEMA.field("headers").type),
        ],
        schema=KAFKA_ARROW_SCHEMA,
    )

    out = Decoder(DecodeSpec.from_json(spec.to_json())).decode(kafka).to_pylist()

    assert [(r["id"], r["name"], r[OP_COLUMN]) for r in out[:3]] == [
        (7, "x", "c"),
        (7, "x", "d"),
        (7, None, "d"),
    ]
    assert [r["_error"] for r in out[:3]] == [None, None, None]
    assert out[3]["_error"].startswith("tombstone without a usable key")
    assert out[4]["_error"] == "Debezium op 'm' is not a row change (c, u, r or d)"


@pytest.mark.parametrize(
    ("change", "sentence"),
    [
        (
            {"delta": {"table": "/t", "tombstones": "delete"}},
            "delta: tombstones: delete needs mode: upsert",
        ),
        (
            {
                "delta": {
                    "table": "/t",
                    "mode": "upsert",
                    "merge_keys": ["id"],
                    "tombstones": "delete",
                }
            },
            "delta.tombstones: delete needs decoding.key decoded",
        ),
        (
            {"decoding": {"value": {"envelope": "debezium"}}},
            "decoding.value: envelope debezium needs the value decoded",
        ),
        (
            {
                "decoding": {
                    "value": {"format": "json", "schema_file": "/v.ddl"},
                    "key": {"format": "json", "schema_file": "/k.ddl", "envelope": "debezium"},
                }
            },
            "decoding: key: an envelope unwraps the value's change events",
        ),
    ],
)
def test_bad_cdc_settings_stop_at_load_with_one_sentence(
    change: dict[str, Any], sentence: str, tmp_path
) -> None:
    data: dict[str, Any] = {
        "pipeline_id": "cdc",
        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topics": ["t"], "consumer_group": "g"},
        "delta": {"table": "/t"},
        "checkpoint": "/c",
        **change,
    }
    path = tmp_path / "conf" / "bad.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert sentence in str(raised.value), str(raised.value)
