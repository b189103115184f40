"""Tables on object storage: the pipeline, its run lease and the `offsets` commands on a real
S3 API (moto's server on loopback, started and stopped by the `object_store` fixture), reached
with the same `delta.storage_options` as the commit. And the settings under which two commits of
one version could both land stop the run in one sentence.

The delta-spark sink needs Hadoop's S3A connector (hadoop-aws) for s3a:// tables, which this
machine cannot download; its S3 path is the Databricks Runtime's, and only its refusal of an
unsafe LogStore is tested here."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from kafka_delta.cli import main
from kafka_delta.config import PipelineConfig
from kafka_delta.offsets.model import BatchCommit
from kafka_delta.pipeline import Pipeline
from kafka_delta.recovery.lease import RunLease, read_leases
from kafka_delta.sinks.delta_rs.sink import DeltaRsSink
from kafka_delta_dev.produce import produce_events, produce_values
from support import PACKAGE, PROJECT, assert_exactly_once, assert_offsets_agree, table_ids

SRC = PROJECT / "src"


@pytest.fixture
def s3_config(object_store, make_config, tmp_path: Path):
    """make_config, with the table (and its dead-letter table) in a fresh bucket."""
    bucket = object_store.create_bucket(f"lake-{uuid.uuid4().hex[:8]}")

    def make(topics: list[str], **kafka: object) -> PipelineConfig:
        return make_config(
            topics,
            delta={"table": f"{bucket}/orders", "storage_options": object_store.storage_options()},
            **kafka,
        )

    return make


def _config_file(cfg: PipelineConfig, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    return path


def _offsets(cfg: PipelineConfig, tmp_path: Path, capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    config = _config_file(cfg, tmp_path / f"offsets-{uuid.uuid4().hex[:6]}.yaml")
    status = main(["offsets", args[0], "--config", str(config), *args[1:]])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.spark
@pytest.mark.broker
def test_a_pipeline_on_s3_lands_every_record_once_holds_its_lease_and_the_commands_work(
    spark, kafka_bootstrap, new_topics, s3_config, tmp_path, capsys, caplog
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 300)
    produce_values(kafka_bootstrap, topics[0], [(0, b"not json")])
    cfg = s3_config(topics, max_records_per_trigger=120)
    assert cfg.delta.table.startswith("s3://")
    held: list[list[str]] = []

    def transform(df):
        # Inside the run: the lease is in the bucket, named by its s3:// path.
        held.append(
            [
                lease.path
                for lease in read_leases(
                    cfg.delta.table, cfg.pipeline_id, cfg.delta.storage_options
                )
            ]
        )
        from kafka_delta_dev.orders import transform as default

        return default(df)

    with caplog.at_level(logging.WARNING):
        Pipeline(spark, cfg, transform=transform).run()
        produce_events(kafka_bootstrap, topics, 100, first_id=300)
        Pipeline(spark, cfg).run()
    assert not [r for r in caplog.records if "run lease" in r.getMessage()], caplog.text
    assert held and all(len(paths) == 1 for paths in held), held
    assert held[0][0].startswith(f"{cfg.delta.table}/_kafka_delta/{cfg.pipeline_id}/runs/")
    assert read_leases(cfg.delta.table, cfg.pipeline_id, cfg.delta.storage_options) == []

    assert_exactly_once(cfg, 400)
    assert_offsets_agree(cfg)
    dead = DeltaTable(cfg.dead_letter_table, storage_options=cfg.delta.storage_options)
    assert dead.to_pyarrow_table().num_rows == 1

    status, out, _ = _offsets(cfg, tmp_path, capsys, "show")
    assert status == 0, out
    assert "400 rows; 1 dead letters" in out and "total lag: 0" in out
    status, out, _ = _offsets(cfg, tmp_path, capsys, "verify", "--ids", "id")
    assert status == 0, out
    assert "verify: OK" in out

    # table maintain on the bucket: the batches' small files compacted, a checkpoint written,
    # the run leases' folder untouched, and every record still there once.
    table = DeltaTable(cfg.delta.table, storage_options=cfg.delta.storage_options)
    files_before = len(table.file_uris())
    config = _config_file(cfg, tmp_path / "maintain.yaml")
    capsys.readouterr()
    assert main(["table", "maintain", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"table {cfg.delta.table}: compact:" in out and "checkpoint: written" in out, out
    table = DeltaTable(cfg.delta.table, storage_options=cfg.delta.storage_options)
    assert len(table.file_uris()) < files_before
    assert_exactly_once(cfg, 400)
    status, out, _ = _offsets(cfg, tmp_path, capsys, "verify", "--ids", "id")
    assert status == 0, out


@pytest.mark.broker
def test_a_run_lease_in_a_bucket_blocks_a_reset_and_names_the_file_to_delete(
    kafka_bootstrap, new_topics, s3_config, tmp_path, capsys
) -> None:
    topics = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, topics, 10)
    cfg = s3_config(topics)
    sink = DeltaRsSink(cfg.delta.table, cfg.pipeline_id, storage_options=cfg.delta.storage_options)
    commit = BatchCommit(cfg.pipeline_id, f"{cfg.pipeline_id}.q1", 0, {topics[0]: {0: 10}})
    rows = pa.table({"id": pa.array(range(10), pa.int64())})
    sink.commit_batch(rows, commit.starting_at({}), start={})
    with RunLease.hold(cfg) as lease:
        assert lease is not None  # written to the bucket, not skipped with a warning
        (held,) = read_leases(cfg.delta.table, cfg.pipeline_id, cfg.delta.storage_options)
        status, _, err = _offsets(cfg, tmp_path, capsys, "reset", "--to-earliest", "--execute")
        assert status == 2
        assert "is running" in err and held.path in err and held.path.startswith("s3://")
    assert read_leases(cfg.delta.table, cfg.pipeline_id, cfg.delta.storage_options) == []


@pytest.mark.spark
@pytest.mark.broker
def test_two_runs_racing_on_one_s3_table_land_every_record_once(
    kafka_bootstrap, new_topics, s3_config, tmp_path
) -> None:
    """Two processes of one pipeline, on two checkpoints, start together on one S3 table: a
    version lands once (delta-rs's conditional put), a run that loses is fenced (exit 3, one
    line); each checkpoint restarted ends with exit 0, and every record is in the table once."""
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 1000)
    base = s3_config(topics, max_records_per_trigger=250)
    configs = [
        _config_file(
            base.with_overrides(checkpoint=str(tmp_path / f"checkpoint-{n}")),
            tmp_path / f"run-{n}.yaml",
        )
        for n in (1, 2)
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_DELTA_")}
    env.update(PYTHONPATH=str(SRC), PYSPARK_PYTHON=sys.executable)

    def run(*which: Path) -> list[tuple[int, str]]:
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", PACKAGE, "--config", str(c), "--trigger", "available-now"],
                cwd=PROJECT,  # its conf/log4j2.properties keeps a fenced run's report to one line
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for c in which
        ]
        return [(p.wait(timeout=600), p.stdout.read()) for p in runs]  # type: ignore[union-attr]

    raced = run(*configs)
    for status, output in raced:
        assert status in (0, 3), output[-3000:]
        assert "Traceback" not in output and "\tat " not in output, output[-3000:]
    produce_events(kafka_bootstrap, topics, 200, first_id=1000)
    # Each checkpoint restarted: the loser's is set aside or resumes; both end with exit 0.
    for config in configs:
        ((status, output),) = run(config)
        assert status == 0, output[-3000:]
    assert_exactly_once(base, 1200)
    assert sum(table_ids(base).values()) == 1200


def test_delta_spark_commit_copies_and_leases_live_beside_a_checkpoint_in_a_bucket(
    object_store, tmp_path: Path
) -> None:
    """The delta-spark sink's side files (commit copies, run leases) beside a checkpoint in a
    bucket, reached through pyarrow's own S3 file system with delta.storage_options' keys
    (never delta-rs: the cluster path imports none of it), and nothing in the table."""
    from pyarrow import fs as pafs

    from kafka_delta.delta.commit_copies import CommitCopies
    from kafka_delta.delta.side_folder import open_side, table_key

    bucket = object_store.create_bucket(f"lake-{uuid.uuid4().hex[:8]}")
    options = object_store.storage_options()
    checkpoint = f"{bucket}/checkpoints/orders"
    copies = CommitCopies("main.sales.orders", checkpoint, "p", options)
    commit = BatchCommit("p", "p.q1", 4, {"orders": {0: 40, 1: 38}}).with_seq(5)
    copies.write(5, commit.user_metadata(), 9)

    copy = CommitCopies("main.sales.orders", checkpoint, "p", options).read(7)
    assert copy is not None
    assert (copy.offsets, copy.delta_version, copy.seq) == ({"orders": {0: 40, 1: 38}}, 9, 5)
    assert copies.read(4) is None
    filesystem, root = open_side(f"{checkpoint}.kafka_delta", options)
    key = table_key("main.sales.orders")
    info = filesystem.get_file_info(f"{root}/p/commits/{key}/5.json")
    assert info.type == pafs.FileType.File

    cfg = PipelineConfig.model_validate(
        {
            "pipeline_id": "p",
            "kafka": {
                "bootstrap_servers": "127.0.0.1:1",
                "topics": ["orders"],
                "consumer_group": "g",
            },
            "delta": {"table": "main.sales.orders", "storage_options": options},
            "checkpoint": checkpoint,
            "engine": {"source": "embedded", "sink": "delta_spark"},
        }
    )
    from kafka_delta.recovery.lease import leases_of

    with RunLease.hold(cfg) as lease:
        assert lease is not None
        (held,) = leases_of(cfg)
        assert held.path == f"{checkpoint}.kafka_delta/p/runs/{key}/{held.run_id}.json"
    assert leases_of(cfg) == []


# -- settings that would commit unsafely --------------------------------------------------------


def _validate(table: str, storage_options: dict[str, str], **extra: object) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "pipeline_id": "p",
            "kafka": {
                "bootstrap_servers": "127.0.0.1:9092",
                "topics": ["t"],
                "consumer_group": "g",
            },
            "delta": {"table": table, "storage_options": storage_options},
            "checkpoint": "/tmp/checkpoint",
            **extra,
        }
    )


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}, "AWS_S3_ALLOW_UNSAFE_RENAME"),
        ({"aws_s3_allow_unsafe_rename": "TRUE"}, "AWS_S3_ALLOW_UNSAFE_RENAME"),
        ({"aws_conditional_put": "disabled"}, "aws_conditional_put: disabled"),
        ({"AWS_S3_LOCKING_PROVIDER": "dynamodb"}, "AWS_S3_LOCKING_PROVIDER"),
    ],
)
def test_delta_rs_settings_that_let_two_commits_share_a_version_are_refused(
    options: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        _validate("s3://lake/orders", options)
    # The same keys mean nothing to a local table.
    _validate("/tmp/orders", options)


def test_unsafe_rename_from_the_environment_is_refused_too(monkeypatch) -> None:
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    with pytest.raises(ValueError, match="AWS_S3_ALLOW_UNSAFE_RENAME"):
        _validate("s3://lake/orders", {})


def test_conditional_put_by_etag_is_accepted() -> None:
    _validate("s3://lake/orders", {"aws_conditional_put": "etag"})


def test_delta_spark_on_s3_needs_a_log_store_safe_for_two_drivers(monkeypatch) -> None:
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    engine = {"source": "embedded", "sink": "delta_spark"}
    with pytest.raises(ValueError, match="S3SingleDriverLogStore"):
        _validate("s3a://lake/orders", {}, engine=engine)
    store = {"spark.delta.logStore.s3a.impl": "io.delta.storage.S3DynamoDBLogStore"}
    _validate("s3a://lake/orders", {}, engine=engine, spark={"conf": store})
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "17.3")
    _validate("s3://lake/orders", {}, engine=engine)


def test_main_refuses_an_unsafe_s3_config_in_one_sentence_with_exit_2(tmp_path, capsys) -> None:
    config = tmp_path / "unsafe.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pipeline_id": "p",
                "kafka": {
                    "bootstrap_servers": "127.0.0.1:9092",
                    "topics": ["t"],
                    "consumer_group": "g",
                },
                "delta": {
                    "table": "s3://lake/orders",
                    "storage_options": {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"},
                },
                "checkpoint": str(tmp_path / "checkpoint"),
            }
        )
    )
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "AWS_S3_ALLOW_UNSAFE_RENAME" in err and "Traceback" not in err
