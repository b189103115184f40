"""Avro schema evolution through the whole pipeline (issue: formats): records framed by
confluent-kafka's AvroSerializer against the development registry (which checks Confluent's
compatibility levels), produced to a real broker, run by the embedded engine into a Delta table
on both sinks, read back with delta-rs.

- a field added inside a nested record lands as a new nested field (delta_rs: a schema commit
  of its own before the batch, like a new top-level column);
- a field the writer lacks reads the reader's default (the newest version's), not null;
- the issue's first failures: an Avro ``uuid`` field, and ``["null", record]`` fields null in
  some records (Debezium's ``before``/``after``);
- generated: a random record schema and a chain of 2-4 versions, each a change Confluent's
  BACKWARD/FORWARD/FULL accepts, records of every version in one topic, the pipeline run after
  some versions (so a promotion may meet a table that exists): every value reads back as
  written under the mapping of :mod:`kafka_delta.decoding.avro_types` (a field a version
  lacks: its default, else null), or the record is a dead letter with a reason, never for a
  promotion; every id once.

``KAFKA_DELTA_HYPOTHESIS_EXAMPLES`` sets the number of generated chains (default 3: a pipeline
run costs 10-20 s); ``scripts/formats_fuzz`` runs many.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kafka_delta.config import PipelineConfig
from kafka_delta.decoding.avro_types import avro_to_arrow
from kafka_delta.delta.schema import wider_arrow_type
from kafka_delta.pipeline import Pipeline
from kafka_delta_dev.produce import produce_values
from support import assert_exactly_once, run_until_crash, table_ids
from test_avro_generated import Written, _avro_value, _column_value
from test_avro_generated import avro_types as generated_types

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def avro_values(
    registry_url: str, topic: str, schema: dict[str, Any], records: Iterable[dict[str, Any]]
) -> list[bytes]:
    """Confluent-framed Avro, made by confluent-kafka's own serializer (auto-registering)."""
    serializer = AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(schema))
    context = SerializationContext(topic, MessageField.VALUE)
    return [serializer(r, context) for r in records]


def produce(bootstrap: str, topic: str, values: list[bytes], partitions: int = 2) -> None:
    produce_values(bootstrap, topic, [(i % partitions, v) for i, v in enumerate(values)])


def avro_config(make_config, topic: str, registry_url: str, engine: Any = "embedded"):
    cfg = make_config([topic], engine=engine)
    return cfg.with_overrides(
        decoding={"value": {"format": "avro"}, "schema_registry": {"url": registry_url}}
    )


def rows_by_id(cfg: PipelineConfig) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in DeltaTable(cfg.delta.table).to_pyarrow_table().to_pylist()}


def table_schema(cfg: PipelineConfig) -> pa.Schema:
    return pa.schema(DeltaTable(cfg.delta.table).schema().to_arrow())


def dead_letters(cfg: PipelineConfig) -> list[dict[str, Any]]:
    assert cfg.dead_letter_table is not None
    if DeltaTable.is_deltatable(cfg.dead_letter_table):
        return DeltaTable(cfg.dead_letter_table).to_pyarrow_table().to_pylist()
    return []


ADDRESS_V1 = {
    "type": "record",
    "name": "Customer",
    "namespace": "evolution",
    "fields": [
        {"name": "id", "type": "long"},
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [{"name": "street", "type": "string"}],
            },
        },
        {
            "name": "previous",
            "type": {"type": "array", "items": "Address"},
            "default": [],
        },
    ],
}


def _address_v2() -> dict[str, Any]:
    """v1 with ``zip`` added inside the nested record (BACKWARD: it has a default)."""
    v2 = json.loads(json.dumps(ADDRESS_V1))
    v2["fields"][1]["type"]["fields"].append(
        {"name": "zip", "type": ["null", "string"], "default": None}
    )
    return v2


def test_a_field_added_inside_a_nested_record_lands_as_a_nested_column_exactly_once(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, sink_engine
) -> None:
    """The producers add ``zip`` inside ``address`` (a record used again in an array) while
    the table exists: the table's struct gains the field, the rows written before read null
    in it, the new rows hold their values, and every id lands once."""
    (topic,) = new_topics(1, partitions=2)
    cfg = avro_config(make_config, topic, schema_registry.url, sink_engine)
    v1 = [{"id": i, "address": {"street": f"s{i}"}, "previous": []} for i in range(10)]
    produce(kafka_bootstrap, topic, avro_values(schema_registry.url, topic, ADDRESS_V1, v1))
    Pipeline(spark, cfg).run()

    v2 = [
        {
            "id": i,
            "address": {"street": f"s{i}", "zip": f"z{i}"},
            "previous": [{"street": "old", "zip": None}],
        }
        for i in range(10, 20)
    ]
    produce(kafka_bootstrap, topic, avro_values(schema_registry.url, topic, _address_v2(), v2))
    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 20)
    assert dead_letters(cfg) == []
    rows = rows_by_id(cfg)
    assert rows[3]["address"] == {"street": "s3", "zip": None}
    assert rows[13]["address"] == {"street": "s13", "zip": "z13"}
    assert rows[13]["previous"] == [{"street": "old", "zip": None}]
    schema = table_schema(cfg)
    assert [f.name for f in schema.field("address").type] == ["street", "zip"]


def test_a_crash_between_the_nested_field_commit_and_the_batch_loses_and_doubles_nothing(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, tmp_path
) -> None:
    """delta-rs: the nested field is one commit, the batch the next. A run SIGKILLed between
    them (crash point after_add_columns) leaves the table's struct with the field and no row of
    the batch; the restart finds the field in place and lands the batch once."""
    (topic,) = new_topics(1, partitions=2)
    cfg = avro_config(make_config, topic, schema_registry.url)
    v1 = [{"id": i, "address": {"street": f"s{i}"}, "previous": []} for i in range(10)]
    produce(kafka_bootstrap, topic, avro_values(schema_registry.url, topic, ADDRESS_V1, v1))
    Pipeline(spark, cfg).run()
    v2 = [{"id": i, "address": {"street": "x", "zip": "z"}, "previous": []} for i in range(10, 20)]
    produce(kafka_bootstrap, topic, avro_values(schema_registry.url, topic, _address_v2(), v2))

    run_until_crash(cfg, tmp_path, "after_add_columns")
    assert [f.name for f in table_schema(cfg).field("address").type] == ["street", "zip"]
    assert sorted(table_ids(cfg)) == list(range(10))

    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 20)
    assert rows_by_id(cfg)[15]["address"] == {"street": "x", "zip": "z"}


NUMBERS_V1 = {
    "type": "record",
    "name": "Reading",
    "namespace": "promotion",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "count", "type": "int"},
        {"name": "ratio", "type": "float"},
        {"name": "level", "type": "int"},
        {
            "name": "inner",
            "type": {"type": "record", "name": "In", "fields": [{"name": "n", "type": "int"}]},
        },
    ],
}


def _numbers_v2() -> dict[str, Any]:
    """Avro's promotions, each a BACKWARD change the registry accepts: int -> long,
    float -> double, int -> double, and int -> long inside a record."""
    v2 = json.loads(json.dumps(NUMBERS_V1))
    for f, kind in zip(v2["fields"][1:4], ("long", "double", "double"), strict=True):
        f["type"] = kind
    v2["fields"][4]["type"]["fields"][0]["type"] = "long"
    return v2


def _promoted(ids: range, big: bool) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "count": (2**40 + i) if big else i,
            "ratio": (0.1 + i) if big else 0.5,
            "level": (i + 0.25) if big else i,
            "inner": {"n": (2**33 + i) if big else i},
        }
        for i in ids
    ]


def _promote_after_a_first_run(spark, kafka_bootstrap, topic, cfg, registry_url) -> None:
    produce(
        kafka_bootstrap,
        topic,
        avro_values(registry_url, topic, NUMBERS_V1, _promoted(range(10), big=False)),
    )
    Pipeline(spark, cfg).run()
    assert table_schema(cfg).field("count").type == pa.int32()
    produce(
        kafka_bootstrap,
        topic,
        avro_values(registry_url, topic, _numbers_v2(), _promoted(range(10, 20), big=True)),
    )


def _assert_promoted(cfg: PipelineConfig) -> None:
    assert_exactly_once(cfg, 20)
    schema = table_schema(cfg)
    assert [schema.field(n).type for n in ("count", "ratio", "level")] == [
        pa.int64(),
        pa.float64(),
        pa.float64(),
    ]
    assert schema.field("inner").type.field("n").type == pa.int64()
    rows = rows_by_id(cfg)
    assert (rows[3]["count"], rows[3]["ratio"], rows[3]["level"]) == (3, 0.5, 3.0)
    assert (rows[13]["count"], rows[13]["ratio"], rows[13]["level"]) == (2**40 + 13, 13.1, 13.25)
    assert rows[13]["inner"] == {"n": 2**33 + 13}
    assert dead_letters(cfg) == []


def test_a_promotion_the_registry_accepts_widens_the_existing_column_and_lands_every_value(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, sink_engine
) -> None:
    """A table created by int/float producers; the producers move to long/double (BACKWARD):
    the columns widen (delta_rs: the table rewritten in one commit of its own; delta_spark:
    Delta's type widening) and every value lands, none a dead letter, every id once."""
    (topic,) = new_topics(1, partitions=2)
    cfg = avro_config(make_config, topic, schema_registry.url, sink_engine)
    _promote_after_a_first_run(spark, kafka_bootstrap, topic, cfg, schema_registry.url)

    Pipeline(spark, cfg).run()
    Pipeline(spark, cfg).run()  # nothing new: nothing widened again

    _assert_promoted(cfg)
    if sink_engine["sink"] == "delta_rs":
        rewrites = [
            e
            for e in DeltaTable(cfg.delta.table).history()
            if e.get("operationParameters", {}).get("mode") == "Overwrite"
        ]
        assert len(rewrites) == 1


def test_a_crash_between_the_widening_commit_and_the_batch_loses_and_doubles_nothing(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, tmp_path
) -> None:
    """delta-rs: the rewrite with the wider columns is one commit, the batch the next. A run
    SIGKILLed between them leaves the table wide with the rows before; the restart widens
    nothing again and lands the batch once."""
    (topic,) = new_topics(1, partitions=2)
    cfg = avro_config(make_config, topic, schema_registry.url)
    _promote_after_a_first_run(spark, kafka_bootstrap, topic, cfg, schema_registry.url)

    run_until_crash(cfg, tmp_path, "after_widen_columns")
    assert table_schema(cfg).field("count").type == pa.int64()
    assert sorted(table_ids(cfg)) == list(range(10))
    version = DeltaTable(cfg.delta.table).version()

    Pipeline(spark, cfg).run()

    _assert_promoted(cfg)
    # The batch's own commit (and its dead letters' none) on top: no second rewrite.
    assert DeltaTable(cfg.delta.table).version() == version + 1


def test_a_uuid_field_and_null_before_after_records_land_on_the_delta_rs_sink(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry
) -> None:
    """The issue's two first failures: an Avro ``uuid`` (a string column holding the text),
    and Debezium-like ``before``/``after`` (``["null", record]``, null in some records: a
    create has no ``before``, a delete no ``after``) whose record has required fields."""
    (topic,) = new_topics(1, partitions=2)
    cfg = avro_config(make_config, topic, schema_registry.url)
    row = {
        "type": "record",
        "name": "Value",
        "namespace": "dbserver1.inventory.customers",
        "fields": [
            {"name": "pk", "type": "int"},
            {"name": "email", "type": "string"},
            {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        ],
    }
    envelope = {
        "type": "record",
        "name": "Envelope",
        "namespace": "dbserver1.inventory.customers",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "row_key", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {"name": "op", "type": "string"},
        ],
    }
    keys = [str(uuid.UUID(int=i * 7919 + 1)) for i in range(12)]

    def image(i: int, email: str) -> dict[str, Any]:
        return {"pk": i, "email": email, "ref": keys[i]}

    records = []
    for i in range(12):
        op = "cud"[i % 3]
        records.append(
            {
                "id": i,
                "row_key": keys[i],
                "before": None if op == "c" else image(i, "old@x"),
                "after": None if op == "d" else image(i, "new@x"),
                "op": op,
            }
        )
    produce(kafka_bootstrap, topic, avro_values(schema_registry.url, topic, envelope, records))

    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 12)
    assert dead_letters(cfg) == []
    rows = rows_by_id(cfg)
    for record in records:
        got = rows[record["id"]]
        assert {k: got[k] for k in ("row_key", "before", "after", "op")} == {
            k: record[k] for k in ("row_key", "before", "after", "op")
        }
    assert table_schema(cfg).field("row_key").type in (pa.string(), pa.large_string())


PERSON_V1 = {
    "type": "record",
    "name": "Person",
    "namespace": "evolution",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}


def _person(version: int) -> dict[str, Any]:
    """v2 adds fields with defaults (BACKWARD); v3 changes one default and adds a field with
    none (nullable: a union with null first, default null)."""
    fields = list(PERSON_V1["fields"])
    if version >= 2:
        tier = "gold" if version >= 3 else "basic"
        fields += [
            {"name": "tier", "type": "string", "default": tier},
            {"name": "score", "type": "int", "default": -1},
            {
                "name": "home",
                "type": {
                    "type": "record",
                    "name": "Home",
                    "fields": [{"name": "city", "type": "string"}],
                },
                "default": {"city": "Ghent"},
            },
            {"name": "tags", "type": {"type": "array", "items": "string"}, "default": ["new"]},
        ]
    if version >= 3:
        fields.append({"name": "nick", "type": ["null", "string"], "default": None})
    return {**PERSON_V1, "fields": fields}


def test_a_field_the_writer_lacks_reads_the_newest_versions_default(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry, sink_engine
) -> None:
    """Avro's reader/writer resolution: records of v1 (no ``tier``, ``score``, ``home``,
    ``tags``) read the newest version's defaults ("gold", not v2's "basic"), records of v2 read
    v3's ``nick`` as null (its default), and written values stay as written."""
    (topic,) = new_topics(1, partitions=2)
    cfg = avro_config(make_config, topic, schema_registry.url, sink_engine)
    url = schema_registry.url
    values = avro_values(url, topic, _person(1), [{"id": i, "name": f"p{i}"} for i in range(6)])
    v2 = [
        {"id": i, "name": "x", "tier": "t", "score": i, "home": {"city": "Oslo"}, "tags": []}
        for i in range(6, 10)
    ]
    values += avro_values(url, topic, _person(2), v2)
    v3 = [{**r, "id": r["id"] + 4, "nick": "n"} for r in v2]
    values += avro_values(url, topic, _person(3), v3)
    produce(kafka_bootstrap, topic, values)

    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 14)
    assert dead_letters(cfg) == []
    rows = rows_by_id(cfg)
    defaults = {"tier": "gold", "score": -1, "home": {"city": "Ghent"}, "tags": ["new"]}
    for i in range(6):
        assert rows[i] | defaults == rows[i], rows[i]
        assert rows[i]["nick"] is None and rows[i]["name"] == f"p{i}"
    assert rows[7]["tier"] == "t" and rows[7]["score"] == 7 and rows[7]["nick"] is None
    assert rows[7]["home"] == {"city": "Oslo"} and rows[7]["tags"] == []
    assert rows[11]["nick"] == "n" and rows[11]["score"] == 7


def test_a_record_field_added_without_a_default_reads_null_in_older_records(
    spark, kafka_bootstrap, new_topics, make_config, schema_registry
) -> None:
    """FORWARD compatibility lets a version add a field with no default: records of the
    version before read null in it, also when it is a record with required fields (whose
    column is a struct with non-null fields: a null of it used to fail the read task)."""
    (topic,) = new_topics(1, partitions=1)
    cfg = avro_config(make_config, topic, schema_registry.url)
    client = SchemaRegistryClient({"url": schema_registry.url})
    client.set_compatibility(subject_name=f"{topic}-value", level="FORWARD")
    v2 = {k: v for k, v in _person(2).items()}
    v2["fields"] = [
        {k: v for k, v in f.items() if k != "default"} if f["name"] == "home" else f
        for f in v2["fields"]
    ]
    values = avro_values(
        schema_registry.url, topic, PERSON_V1, [{"id": i, "name": "a"} for i in range(3)]
    )
    values += avro_values(
        schema_registry.url,
        topic,
        v2,
        [{"id": 3, "name": "b", "tier": "t", "score": 1, "home": {"city": "Oslo"}, "tags": []}],
    )
    produce(kafka_bootstrap, topic, values, partitions=1)

    Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 4)
    assert dead_letters(cfg) == []
    rows = rows_by_id(cfg)
    assert [rows[i]["home"] for i in range(4)] == [None, None, None, {"city": "Oslo"}]
    assert rows[0]["tier"] == "basic"


# -- generated: a random schema and a chain of compatible versions, through the pipeline ------

EXAMPLES = int(os.environ.get("KAFKA_DELTA_HYPOTHESIS_EXAMPLES", "3"))
# Where each generated chain is summed up, one JSON line per example (scripts/formats_fuzz).
FUZZ_LOG = os.environ.get("KAFKA_DELTA_FUZZ_LOG")
_serial = itertools.count()

_NUMBERS = {
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(allow_nan=False),
}
_PROMOTIONS = {"int": ["long", "float", "double"], "long": ["float", "double"], "float": ["double"]}
_NARROWINGS = {"long": ["int"], "double": ["float", "long", "int"], "float": ["int", "long"]}
_UNION_VALUES = {
    "boolean": st.booleans(),
    "long": st.integers(-(2**63), 2**63 - 1),
    "double": st.floats(allow_nan=False),
    "bytes": st.binary(max_size=4),
    "string": st.text(max_size=4),
}
# Simple types a field can be added with, and a default of each (the default's JSON, and the
# value the column holds).
_ADDED = ["int", "long", "string", "boolean", "double", "nullable", "array", "enum", "record"]


@dataclass(frozen=True)
class GenField:
    """A field of one version: its Avro type, a strategy of its values (as
    test_avro_generated's: union values :class:`Written`), the column value of a value,
    and its default (``NO_DEFAULT`` when none)."""

    name: str
    kind: str  # num, enum, union, static, added
    avro: Any
    values: Any
    expect: Any
    default: Any = None
    has_default: bool = False

    def declaration(self) -> dict[str, Any]:
        out = {"name": self.name, "type": self.avro}
        if self.has_default:
            out["default"] = self.default
        return out


def _num_field(name: str, kind: str) -> GenField:
    return GenField(name, "num", kind, _NUMBERS[kind], lambda v: v)


def _enum_field(name: str, enum_name: str, symbols: list[str]) -> GenField:
    avro = {"type": "enum", "name": enum_name, "symbols": symbols}
    return GenField(name, "enum", avro, st.sampled_from(symbols), lambda v: v)


def _union_field(name: str, branches: list[str]) -> GenField:
    tagged = st.one_of(
        *[
            _UNION_VALUES[b].map(lambda v, i=i, b=b: Written(i, b, v))
            for i, b in enumerate(branches)
        ]
    )
    return GenField(name, "union", ["null", *branches], st.none() | tagged, lambda v: v, None, True)


@st.composite
def _added_field(draw: Any, name: str, with_default: bool) -> GenField:
    if not with_default:
        t, values, expect = draw(generated_types(1))
        return GenField(name, "added", t, values, expect)
    kind = draw(st.sampled_from(_ADDED))
    if kind in _NUMBERS:
        values = _NUMBERS[kind].filter(lambda v: v == v and abs(v) != float("inf"))
        return GenField(name, "added", kind, values, lambda v: v, draw(values), True)
    if kind == "string":
        return GenField(
            name,
            "added",
            "string",
            st.text(max_size=4),
            lambda v: v,
            draw(st.text(max_size=4)),
            True,
        )
    if kind == "boolean":
        return GenField(
            name, "added", "boolean", st.booleans(), lambda v: v, draw(st.booleans()), True
        )
    if kind == "nullable":
        return GenField(
            name, "added", ["null", "long"], st.none() | _NUMBERS["long"], lambda v: v, None, True
        )
    if kind == "array":
        values = st.lists(st.text(max_size=3), max_size=3)
        return GenField(
            name,
            "added",
            {"type": "array", "items": "string"},
            values,
            lambda v: v,
            draw(values),
            True,
        )
    if kind == "enum":
        symbols = draw(st.lists(st.sampled_from("PQRS"), min_size=1, max_size=3, unique=True))
        avro = {"type": "enum", "name": f"Added{next(_serial)}", "symbols": symbols}
        return GenField(
            name,
            "added",
            avro,
            st.sampled_from(symbols),
            lambda v: v,
            draw(st.sampled_from(symbols)),
            True,
        )
    avro = {
        "type": "record",
        "name": f"AddedRecord{next(_serial)}",
        "fields": [{"name": "x", "type": "string"}, {"name": "y", "type": "int"}],
    }
    values = st.fixed_dictionaries({"x": st.text(max_size=3), "y": _NUMBERS["int"]})
    return GenField(name, "added", avro, values, lambda v: v, draw(values), True)


def _steps(level: str, fields: list[GenField]) -> list[str]:
    """The changes ``level`` accepts that apply to ``fields``; the type changes first (what
    Hypothesis draws most when it draws few examples)."""
    removable = [f for f in fields if f.name != "id"]
    with_default = [f for f in removable if f.has_default]
    steps = []
    if level == "BACKWARD":
        steps += ["promote"] * any(f.kind == "num" and f.avro in _PROMOTIONS for f in removable)
        steps += ["union_widen"] * any(f.kind == "union" and _widenings(f) for f in fields)
        steps += ["enum_add"] * any(f.kind == "enum" and len(f.avro["symbols"]) < 5 for f in fields)
        steps += ["remove"] * bool(removable)
    elif level == "FORWARD":
        steps += ["narrow"] * any(f.kind == "num" and f.avro in _NARROWINGS for f in removable)
        steps += ["enum_remove"] * any(
            f.kind == "enum" and len(f.avro["symbols"]) > 1 for f in fields
        )
        steps += ["remove"] * bool(with_default)
        steps += ["add_without_default"]
    else:  # FULL
        steps += ["remove"] * bool(with_default)
    return [*steps, "add_with_default"]


def _widenings(f: GenField) -> list[str]:
    """Branches a union can gain at its end while the serializer still writes each value in
    the branch it was drawn for (it takes the first branch that accepts a value)."""
    have = f.avro[1:]
    out = [b for b in ("double", "bytes", "string", "boolean") if b not in have]
    if "long" in have:
        out = [b for b in out if b != "boolean"]  # True would go to long
    if "string" in have:
        out = [b for b in out if b != "bytes"]
    return out


@st.composite
def evolution_chains(draw: Any) -> dict[str, Any]:
    """A compatibility level and 2-4 versions of one record schema, each a change that level
    accepts of the one before."""
    # The level and each change by a Random seeded by Hypothesis: uniform, where Hypothesis's
    # own choices lean to the first option when it draws few examples.
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    level = rnd.choice(["BACKWARD", "BACKWARD", "FORWARD", "FULL"])
    serial = next(_serial)
    branches = sorted(
        draw(st.lists(st.sampled_from(["long", "string"]), min_size=1, max_size=2, unique=True)),
        key=["boolean", "long", "double", "string"].index,
    )
    fields = [
        _num_field("id", "long"),
        _num_field("n0", draw(st.sampled_from(sorted(_NUMBERS)))),
        _enum_field(
            "e0",
            f"E{serial}",
            draw(st.lists(st.sampled_from("ABCDE"), min_size=1, max_size=3, unique=True)),
        ),
        _union_field("u0", branches),
    ]
    for i in range(draw(st.integers(0, 2))):
        t, values, expect = draw(generated_types(0))
        fields.append(GenField(f"s{i}", "static", t, values, expect))
    versions, steps = [fields], []
    for _ in range(draw(st.integers(1, 3))):
        current = list(versions[-1])
        step = rnd.choice(_steps(level, current))
        steps.append(step)
        fresh = f"a{len(steps)}"
        if step in ("add_with_default", "add_without_default"):
            current.append(draw(_added_field(fresh, step == "add_with_default")))
        elif step == "remove":
            pool = [f for f in current if f.name != "id" and (level == "BACKWARD" or f.has_default)]
            current.remove(draw(st.sampled_from(pool)))
        elif step in ("promote", "narrow"):
            table = _PROMOTIONS if step == "promote" else _NARROWINGS
            pool = [f for f in current if f.kind == "num" and f.name != "id" and f.avro in table]
            if not pool:  # only id: keep it a long
                current.append(draw(_added_field(fresh, True)))
                steps[-1] = "add_with_default"
            else:
                f = draw(st.sampled_from(pool))
                current[current.index(f)] = _num_field(f.name, draw(st.sampled_from(table[f.avro])))
        elif step in ("enum_add", "enum_remove"):
            f = draw(st.sampled_from([f for f in current if f.kind == "enum"]))
            symbols = list(f.avro["symbols"])
            if step == "enum_add":
                symbols.append(draw(st.sampled_from([s for s in "ABCDE" if s not in symbols])))
            else:
                symbols.remove(draw(st.sampled_from(symbols)))
            current[current.index(f)] = _enum_field(f.name, f.avro["name"], symbols)
        else:  # union_widen
            f = draw(st.sampled_from([f for f in current if f.kind == "union" and _widenings(f)]))
            current[current.index(f)] = _union_field(
                f.name, [*f.avro[1:], draw(st.sampled_from(_widenings(f)))]
            )
        versions.append(current)
    schemas = [
        {
            "type": "record",
            "name": f"Gen{serial}",
            "namespace": "fuzz",
            "fields": [f.declaration() for f in version],
        }
        for version in versions
    ]
    # Named types are defined where first used in a version: a field removed may take the
    # definition with it; such a chain is not valid Avro, drawn again.
    from hypothesis import assume

    for schema in schemas:
        try:
            avro_to_arrow(schema)
            fastavro.parse_schema(json.loads(json.dumps(schema)))
        except Exception:
            assume(False)
    records = []
    for version in versions:
        drawn = draw(
            st.lists(
                st.fixed_dictionaries({f.name: f.values for f in version if f.name != "id"}),
                min_size=1,
                max_size=4,
            )
        )
        records.append(drawn)
    runs = [draw(st.booleans()) for _ in versions[:-1]] + [True]
    return {
        "level": level,
        "versions": versions,
        "schemas": schemas,
        "steps": steps,
        "records": records,
        "runs": runs,
    }


_MUST_BE_DEAD = object()  # a value the table's column cannot hold: its record is a dead letter


def _loose(t: pa.DataType) -> str:
    """A type with nested nullability and field names of lists and maps left out."""
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{_loose(f.type)}" for f in t) + ">"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{_loose(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{_loose(t.key_type)},{_loose(t.item_type)}>"
    if pa.types.is_large_string(t):
        return "string"
    if pa.types.is_large_binary(t):
        return "binary"
    return str(t)


def _same(expected: Any, actual: Any) -> bool:
    """``actual`` (read back with delta-rs) is ``expected`` (the written value under the
    mapping); a number equal as the column's type holds it; union members not set are null."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        return all(_same(expected.get(k), actual.get(k)) for k in set(expected) | set(actual))
    if isinstance(expected, list | tuple) and isinstance(actual, list | tuple):
        return len(expected) == len(actual) and all(
            _same(e, a) for e, a in zip(expected, actual, strict=True)
        )
    numbers = (int, float)
    if (
        isinstance(expected, numbers)
        and isinstance(actual, numbers)
        and not isinstance(expected, bool)
        and not isinstance(actual, bool)
    ):
        if isinstance(expected, float) or isinstance(actual, float):
            return float(expected) == float(actual)
        return expected == actual
    return expected == actual


def _expected(chain: dict[str, Any], j: int, k: int, name: str, record: dict, column: pa.Field):
    """The column value of field ``name`` for a record of version ``j`` read by the reader of
    versions 0..``k`` (the run that took it), in the table's ``column``."""
    mine = {f.name: f for f in chain["versions"][j]}
    if name in mine:
        f = mine[name]
        value = record[name]
        if f.kind != "union" or value is None:
            return _column_value(f.expect(value))
        branch, inner = value.index, value.value
        if is_union_column(column.type):
            return {f"member{branch}": inner}
        return inner if branch == 0 else _MUST_BE_DEAD
    having = [v for v in chain["versions"][: k + 1] if name in {f.name for f in v}]
    f = {f.name: f for f in having[-1]}[name]  # the newest version with the field: its default
    if f.has_default and f.default is not None:
        return _column_value(f.expect(f.default))
    return None


def is_union_column(t: pa.DataType) -> bool:
    return pa.types.is_struct(t) and [f.name for f in t] == [
        f"member{i}" for i in range(t.num_fields)
    ]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    # A pipeline run costs 10-20 s: no shrinking unless asked (the failing chain is printed).
    phases=(
        [Phase.explicit, Phase.generate, Phase.shrink]
        if os.environ.get("KAFKA_DELTA_HYPOTHESIS_SHRINK")
        else [Phase.explicit, Phase.generate]
    ),
    suppress_health_check=list(HealthCheck),
)
@given(chain=evolution_chains())
def test_generated_schema_evolution_lands_every_value_or_a_dead_letter_exactly_once(
    spark,
    kafka_bootstrap,
    new_topics,
    make_config,
    schema_registry,
    sink_engine,
    tmp_path_factory,
    chain,
) -> None:
    """A random record schema and 2-4 versions, each a change the chain's compatibility level
    accepts (the registry checks it: a refused registration fails the test), records of each
    version framed by confluent-kafka's serializer into one topic, the pipeline run after some
    versions and after the last: every record is in the table once, with each value as
    written under the mapping (a field its version lacks: the newest default then, else null),
    or a dead letter with a reason, only where its version's type differs from the table's."""
    (topic,) = new_topics(1, partitions=1)
    where = tmp_path_factory.mktemp("chain")
    cfg = make_config(
        [topic], engine=sink_engine, delta={"table": str(where / "table")}
    ).with_overrides(
        checkpoint=str(where / "checkpoint"),
        decoding={"value": {"format": "avro"}, "schema_registry": {"url": schema_registry.url}},
    )
    client = SchemaRegistryClient({"url": schema_registry.url})
    client.set_compatibility(subject_name=f"{topic}-value", level=chain["level"])
    produced: list[tuple[int, int, dict[str, Any]]] = []  # (id, version, record) by offset
    taken_by: dict[int, int] = {}  # id -> the last version the run that took it could read
    for k, (schema, records, run) in enumerate(
        zip(chain["schemas"], chain["records"], chain["runs"], strict=True)
    ):
        batch = [{"id": len(produced) + i, **r} for i, r in enumerate(records)]
        produced += [(r["id"], k, r) for r in batch]
        values = avro_values(schema_registry.url, topic, schema, map(_avro_value, batch))
        produce(kafka_bootstrap, topic, values, partitions=1)
        if run:
            Pipeline(spark, cfg).run()
            taken_by.update({i: k for i, _, _ in produced if i not in taken_by})

    table = DeltaTable(cfg.delta.table).to_pyarrow_table()
    columns = pa.schema(DeltaTable(cfg.delta.table).schema().to_arrow())
    ids = Counter(table.column("id").to_pylist())
    dead = {d["offset"]: d["error"] for d in dead_letters(cfg)}
    dead_ids = {produced[o][0]: reason for o, reason in dead.items()}
    summary = {
        "sink": sink_engine["sink"],
        "level": chain["level"],
        "steps": chain["steps"],
        "runs": sum(chain["runs"]),
        "records": len(produced),
        "landed": sum(ids.values()),
        "dead_letters": len(dead),
        "reasons": sorted({r.split(": ", 1)[-1][:120] for r in dead.values()})[:3],
    }
    if FUZZ_LOG:
        with open(FUZZ_LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps(summary) + "\n")

    # Exactly once: every record in the table once, or a dead letter, never both.
    assert max(ids.values(), default=1) == 1, summary
    assert set(ids) | set(dead_ids) == {i for i, _, _ in produced}, summary
    assert not set(ids) & set(dead_ids), summary
    rows = {r["id"]: r for r in table.to_pylist()}
    writers = [avro_to_arrow(s) for s in chain["schemas"]]
    for i, j, record in produced:
        k = taken_by[i]
        if i in dead_ids:
            assert dead_ids[i].strip(), (summary, i)
            changed = [
                f.name
                for f in writers[j]
                if f.name in columns.names and _loose(f.type) != _loose(columns.field(f.name).type)
            ]
            assert changed, (
                f"record {i} (version {j}) is a dead letter, but its types are the table's: "
                f"{dead_ids[i]}",
                chain["schemas"][j],
            )
            # A promotion (the writer's type wider than the column's) widens the column, also
            # of a table that existed before it: never a dead letter.
            assert any(
                wider_arrow_type(columns.field(f.name).type, f.type) is None
                for f in writers[j]
                if f.name in changed
            ), (f"record {i} (version {j}) of a promotion is a dead letter: {dead_ids[i]}", summary)
            continue
        names = {f.name for v in chain["versions"][: k + 1] for f in v}
        for name in sorted(names):
            expected = _expected(chain, j, k, name, record, columns.field(name))
            actual = _column_value(rows[i][name])
            assert expected is not _MUST_BE_DEAD, (name, record, columns.field(name), summary)
            assert _same(expected, actual), (name, expected, actual, chain["schemas"][j], summary)
