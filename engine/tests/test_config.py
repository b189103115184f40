"""Config: validated at start-up, with messages that name the bad key (on the generated
project's own conf/local.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kafka_delta.cli import main
from kafka_delta.config import ConfigError, load_config
from support import PROJECT


def _write(tmp_path: Path, data: dict) -> Path:
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    path = conf / "test.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _base() -> dict:
    return yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text())


def test_shipped_local_config_is_valid_and_resolves_paths_against_the_project_root() -> None:
    cfg = load_config(PROJECT / "conf" / "local.yaml")
    assert cfg.kafka.topics
    assert Path(cfg.delta.table).is_absolute()
    assert Path(cfg.delta.table).is_relative_to(PROJECT)
    assert Path(cfg.checkpoint).is_relative_to(PROJECT)
    # Metrics are off unless asked for; the progress file and the textfile live under data/.
    assert cfg.metrics.exporter == "none"
    assert cfg.metrics.host == "127.0.0.1"
    assert cfg.progress.path and Path(cfg.progress.path).is_relative_to(PROJECT / "data")
    assert cfg.metrics.textfile and Path(cfg.metrics.textfile).is_relative_to(PROJECT / "data")
    # The dead-letter table too: a run (or `offsets show`) from another folder finds it.
    assert cfg.dead_letter_table is not None
    assert Path(cfg.dead_letter_table).is_relative_to(PROJECT)
    # JSON decoded in the read task against the project's schema file, found from anywhere.
    assert cfg.decoding.value.format == "json"
    assert cfg.decoding.value.schema_file == str(PROJECT / "schemas" / "order_event.ddl")
    assert Path(cfg.decoding.value.schema_file).is_file()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["kafka"].update(topics=[]), "kafka.topics: lists no topic: name at least one"),
        (lambda d: d["kafka"].update(topics=["bad topic!"]), "not a valid Kafka topic name"),
        (lambda d: d["kafka"].update(topics=["a", "a"]), "more than once"),
        (lambda d: d["kafka"].pop("bootstrap_servers"), "kafka.bootstrap_servers: is required"),
        (lambda d: d["kafka"].update(max_records_per_trigger=0), "kafka.max_records_per_trigger"),
        (lambda d: d["kafka"].update(starting_offsets="middle"), "kafka.starting_offsets"),
        (
            lambda d: d["kafka"].update(starting_offsets={"elsewhere": {0: 5}}),
            "starting_offsets names topic(s) ['elsewhere'] that kafka.topics does not list",
        ),
        (
            lambda d: d["kafka"].update(starting_offsets={d["kafka"]["topics"][0]: {0: -3}}),
            "-2 (earliest) / -1 (latest)",
        ),
        (lambda d: d["kafka"].update(client={"group.id": "x"}), "manages itself"),
        (
            lambda d: d["kafka"].update(unavailable_timeout_seconds=-1),
            "kafka.unavailable_timeout_seconds",
        ),
        (lambda d: d["trigger"].update(mode="sometimes"), "trigger.mode"),
        (lambda d: d.update(pipeline_id="has space"), "pipeline_id"),
        (lambda d: d["delta"].update(tabel="typo"), "delta.tabel: unknown key"),
        (lambda d: d.update(engine="cluster-of-dreams"), "engine"),
        (lambda d: d.update(engine={"source": "embedded", "sink": "hive"}), "engine.sink"),
        (
            lambda d: d.update(engine={"source": "kafka-ish", "sink": "delta_rs"}),
            "is not a source: embedded, spark_kafka, or module:Class",
        ),
        (lambda d: d["delta"].update(mode="upsert"), "needs merge_keys"),
        (lambda d: d["delta"].update(merge_keys=["id"]), "only apply to mode: upsert"),
        (lambda d: d["delta"].update(schema_evolution="sometimes"), "delta.schema_evolution"),
        (
            lambda d: d.update(decoding={"value": {"format": "avro"}}),
            "framing confluent (the schema id in each record) needs schema_registry.url",
        ),
        (
            lambda d: d.update(decoding={"value": {"format": "avro", "schema_file": "e.ddl"}}),
            "is not a avro schema: expected a file ending in .avsc",
        ),
        (
            lambda d: d.update(decoding={"value": {"format": "protobuf", "schema_file": "e.desc"}}),
            "needs message",
        ),
        (
            lambda d: d.update(decoding={"value": {"format": "json", "framing": "none"}}),
            "with framing none needs schema_file",
        ),
        (
            lambda d: d.update(decoding={"value": {"format": "raw", "schema_file": "e.ddl"}}),
            "format raw takes no schema_file",
        ),
        (
            lambda d: d.update(decoding={"key": {"format": "avro", "schema_file": "k.avsc"}}),
            "decoding the key needs the value decoded too",
        ),
        (
            lambda d: d.update(
                decoding={
                    "value": {"format": "avro"},
                    "schema_registry": {"url": "http://127.0.0.1:1", "auth": "basic"},
                }
            ),
            "auth basic needs user_env and password_env",
        ),
        (lambda d: d["kafka"].update(jvm_client={"kafka.security.protocol": "SSL"}), "prefix"),
        (lambda d: d["metrics"].update(exporter="prometheus"), "metrics.exporter"),
        (lambda d: d["metrics"].update(exporter=False), "metrics.exporter"),  # YAML's `off`
        (lambda d: d["metrics"].update(port=0), "metrics.port"),
        (lambda d: d["metrics"].update(port=65536), "metrics.port"),
        (lambda d: d["metrics"].update(exporter="textfile", textfile="m.txt"), "end in .prom"),
        (lambda d: d["metrics"].update(exporter="textfile", textfile=None), "needs textfile"),
        (lambda d: d["metrics"].update(prot=9464), "metrics.prot: unknown key"),
        (lambda d: d["progress"].update(path=""), "progress.path"),
    ],
)
def test_invalid_config_names_the_bad_key(tmp_path: Path, mutate, message: str) -> None:
    data = _base()
    mutate(data)
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, data))
    assert message in str(err.value)
    assert "test.yaml" in str(err.value)


def test_unreadable_or_non_yaml_config_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kafka: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_overrides_replace_servers_table_and_checkpoint_without_editing_files(
    tmp_path: Path,
) -> None:
    cfg = load_config(PROJECT / "conf" / "local.yaml").with_overrides(
        **{
            "kafka.bootstrap_servers": "broker-1:9093",
            "delta.table": str(tmp_path / "t"),
            "checkpoint": str(tmp_path / "c"),
        }
    )
    assert cfg.kafka.bootstrap_servers == "broker-1:9093"
    assert cfg.delta.table == str(tmp_path / "t")
    assert cfg.checkpoint == str(tmp_path / "c")
    assert cfg.kafka.client_config()["bootstrap.servers"] == "broker-1:9093"


def test_main_rejects_bad_config_before_any_work_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _base()
    data["kafka"]["topics"] = ["ok", "not ok"]
    code = main(["--config", str(_write(tmp_path, data))])
    assert code == 2
    err = capsys.readouterr().err
    assert "kafka.topics" in err and "not ok" in err
    assert not (tmp_path / "data").exists()


def test_engine_presets_and_mixes_name_a_source_and_a_sink(tmp_path: Path) -> None:
    data = _base()
    for engine, expected in [
        ("embedded", ("embedded", "delta_rs")),
        ("cluster", ("spark_kafka", "delta_spark")),
        ({"source": "embedded", "sink": "delta_spark"}, ("embedded", "delta_spark")),
    ]:
        data["engine"] = engine
        cfg = load_config(_write(tmp_path, data))
        assert (cfg.engine.source, cfg.engine.sink) == expected


def test_environment_references_fill_secrets_and_a_missing_one_names_its_key(
    tmp_path: Path,
) -> None:
    data = _base()
    data["kafka"]["client"] = {"sasl.password": "${KAFKA_PASSWORD}", "sasl.username": "svc"}
    path = _write(tmp_path, data)

    cfg = load_config(path, environ={"KAFKA_PASSWORD": "s3cr$t"})
    assert cfg.kafka.client_config()["sasl.password"] == "s3cr$t"

    with pytest.raises(ConfigError, match=r"kafka\.client\.sasl\.password.*KAFKA_PASSWORD"):
        load_config(path, environ={})


@pytest.mark.parametrize(
    ("mutate", "line"),
    [
        (
            lambda d: d["kafka"].update(max_record_per_trigger=10),
            "kafka.max_record_per_trigger: unknown key; did you mean max_records_per_trigger?",
        ),
        (
            lambda d: d["dead_letters"].update(tabel="dl"),
            "dead_letters.tabel: unknown key; did you mean table?",
        ),
        (
            lambda d: d.update(
                delta={},
                tables={"orders": {"path": "data/t", "mode": "upsert", "merge_key": ["id"]}},
            ),
            "tables.orders.merge_key: unknown key; did you mean merge_keys?",
        ),
        (
            lambda d: d["kafka"].update(starting_offsets="earliestt"),
            "kafka.starting_offsets: must be 'earliest' or 'latest' (or a mapping), not "
            "'earliestt'; did you mean 'earliest'?",
        ),
        (
            lambda d: d["trigger"].update(mode="sometimes"),
            "trigger.mode: must be 'available_now' or 'processing_time', not 'sometimes'",
        ),
    ],
)
def test_a_misspelled_key_or_value_is_answered_with_the_right_name_or_the_allowed_values(
    tmp_path: Path, mutate, line: str
) -> None:
    data = _base()
    mutate(data)
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, data))
    lines = str(err.value).splitlines()
    assert f"  {line}" in lines, lines
    assert len(lines) == 2, lines  # the file, then the one problem: no pydantic union paths
    assert "literal[" not in str(err.value) and "dict[" not in str(err.value)


@pytest.mark.parametrize(
    ("places", "inner", "outer"),
    [
        ({"table": "x/table", "checkpoint": "x/table/_checkpoint"}, "checkpoint", "delta.table"),
        ({"table": "x/table/", "checkpoint": "x/table"}, "checkpoint", "delta.table"),
        (
            {"table": "x/checkpoint/table", "checkpoint": "x/checkpoint"},
            "delta.table",
            "checkpoint",
        ),
        (
            {"table": "x/table", "dead": "x/checkpoint/dl", "checkpoint": "x/checkpoint"},
            "dead_letters.table",
            "checkpoint",
        ),
        (
            {"table": "x/table", "dead": "x/table/dead_letters", "checkpoint": "x/checkpoint"},
            "dead_letters.table",
            "delta.table",
        ),
        (
            {"tables": ["x/a", "x/b"], "checkpoint": "x/b/checkpoint"},
            "checkpoint",
            "tables.b.table",
        ),
        (
            {"tables": ["x/a", "x/a/b"], "checkpoint": "x/checkpoint"},
            "tables.b.table",
            "tables.a.table",
        ),
    ],
)
def test_a_table_inside_the_checkpoint_or_a_checkpoint_inside_a_table_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], places: dict, inner: str, outer: str
) -> None:
    data = _base()
    data["checkpoint"] = str(tmp_path / places["checkpoint"])
    if "tables" in places:
        data["delta"] = {}
        a, b = places["tables"]
        data["tables"] = {"a": {"path": str(tmp_path / a)}, "b": {"path": str(tmp_path / b)}}
    else:
        data["delta"]["table"] = str(tmp_path / places["table"])
    if "dead" in places:
        data["dead_letters"]["table"] = str(tmp_path / places["dead"])

    code = main(["--config", str(_write(tmp_path, data))])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[0] == f"error: invalid configuration in {tmp_path / 'conf' / 'test.yaml'}:"
    (problem,) = err[1:]
    assert f" {inner} {tmp_path}/" in problem and f" {outer} {tmp_path}/" in problem, problem
    assert problem.index(f" {inner} ") < problem.index(" is ") < problem.index(f" {outer} ")
    assert "never one inside another" in problem
    assert not (tmp_path / "x").exists()


def test_locations_that_only_share_a_prefix_are_apart(tmp_path: Path) -> None:
    data = _base()
    data["delta"]["table"] = str(tmp_path / "x" / "table")
    data["checkpoint"] = str(tmp_path / "x" / "table2")
    data["dead_letters"]["table"] = str(tmp_path / "x" / "table_dead")
    cfg = load_config(_write(tmp_path, data))
    assert cfg.checkpoint == str(tmp_path / "x" / "table2")
    # Tables of tables: may share one dead-letter table.
    data["delta"] = {}
    data["tables"] = {
        "a": {"path": str(tmp_path / "x" / "a")},
        "ab": {"path": str(tmp_path / "x" / "ab")},
    }
    assert load_config(_write(tmp_path, data)).table_names == ("a", "ab")
