"""No secret written anywhere: a run on each engine against the secured broker
(secure_support.py) with every kind of secret in play at once (a SCRAM password, a client key's
password, a trust store's password, each given as ``${NAME}`` from the environment), with
everything that writes turned on: the driver's and the executors' logs (the engine's at DEBUG,
Spark's and the Java Kafka client's at INFO), the progress file, Prometheus' text file, the
Delta logs of the table and its dead letters, Spark's checkpoint and the engine's files beside
it, Spark's event log; then ``offsets show`` at DEBUG, and a refused run's sentence. Each
secret's value is looked for in every byte of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from deltalake import DeltaTable

from conftest import engine_config, skip_without_connectors
from kafka_delta_dev.produce import ensure_topics, produce_events
from secure_support import SecureKafka, Shape, config_document, new_name, scram, write_config
from support import PROJECT

pytestmark = [pytest.mark.spark, pytest.mark.broker]

RECORDS = 60
# Spark's and the Java Kafka client's logs at INFO (a run's default is WARN): what a user who
# turns them up to look at a problem sees, the client's config dumps included.
LOG4J = """\
rootLogger.level = info
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def _everything(kafka: SecureKafka) -> Shape:
    """SCRAM over TLS with a client certificate shown too (the listener takes one if shown):
    the SASL password, the key's password and the trust store's password in one run."""
    shape = scram(kafka)
    tls = kafka.tls
    return replace(
        shape,
        client={
            **shape.client,
            "ssl.certificate.location": str(tls.client_certificate),
            "ssl.key.location": str(tls.client_key),
            "ssl.key.password": "${KAFKA_KEY_PASSWORD}",
        },
        jvm_client={
            **shape.jvm_client,
            "ssl.keystore.location": str(tls.client_keystore),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.password": "${KAFKA_KEY_PASSWORD}",
            "ssl.key.password": "${KAFKA_KEY_PASSWORD}",
        },
        environ={**shape.environ, "KAFKA_KEY_PASSWORD": tls.key_password},
    )


def _project(argv: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orders_stream", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=PROJECT,
        env={**os.environ, "PYTHONPATH": str(PROJECT / "src"), **environ},
    )


def _files(*folders: Path) -> list[Path]:
    return [p for folder in folders if folder.exists() for p in folder.rglob("*") if p.is_file()]


def _content(file: Path) -> bytes:
    """A file's bytes; a Parquet file's values (its pages may be compressed): Delta's
    checkpoints of the log, the tables' data."""
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        return repr(pq.read_table(file).to_pylist()).encode()
    return file.read_bytes()


@pytest.mark.parametrize("engine_name", ["embedded", "cluster"])
def test_no_secret_is_written_anywhere_a_run_and_the_commands_write(
    spark, secure_kafka, engine_name, tmp_path
) -> None:
    from kafka_delta_dev.pytest_plugin import connector_conf

    engine = engine_config(engine_name)
    skip_without_connectors(spark, engine)
    shape = _everything(secure_kafka)
    secrets = {
        "SASL password": secure_kafka.passwords["alice"],
        "key password": secure_kafka.tls.key_password,
        "trust store password": secure_kafka.tls.truststore_password,
    }
    topic = new_name()
    ensure_topics(secure_kafka.plaintext, [topic], 2)
    produce_events(secure_kafka.plaintext, [topic], RECORDS)
    events = tmp_path / "events"
    events.mkdir()
    document = config_document(
        tmp_path,
        shape,
        secure_kafka.address("SCRAM"),
        [topic],
        new_name(),
        engine,
        progress={"path": str(tmp_path / "progress.jsonl")},
        metrics={"exporter": "textfile", "textfile": str(tmp_path / "metrics.prom")},
        spark={
            "conf": {
                **connector_conf(engine["source"], engine["sink"]),
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": events.as_uri(),
                # Plain JSON lines: a secret in a compressed log would escape a byte search.
                "spark.eventLog.compress": "false",
            }
        },
    )
    document["kafka"]["max_records_per_trigger"] = 30
    path = write_config(tmp_path, document)
    (path.parent / "log4j2.properties").write_text(LOG4J)

    run = _project(["--config", str(path), "--log-level", "DEBUG"], shape.environ)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert DeltaTable(str(tmp_path / "table")).to_pyarrow_table().num_rows == RECORDS
    show = _project(
        ["offsets", "show", "--config", str(path), "--log-level", "DEBUG"], shape.environ
    )
    assert show.returncode == 0, show.stderr[-3000:]
    refused = _project(
        ["--config", str(path)], {**shape.environ, "KAFKA_PASSWORD": "not-the-password"}
    )
    assert refused.returncode == 2 and "refused the login" in refused.stderr, refused.stderr

    written = {
        "the run's output (driver and executors' logs)": run.stdout + run.stderr,
        "offsets show --log-level DEBUG": show.stdout + show.stderr,
        "a refused run's sentence": refused.stdout + refused.stderr,
    }
    folders = [
        tmp_path / "table",
        tmp_path / "dead_letters",
        tmp_path / "checkpoint",
        tmp_path / "checkpoint.kafka_delta",
        events,
    ]
    files = [*_files(*folders), tmp_path / "progress.jsonl", tmp_path / "metrics.prom"]
    logged = b"".join(_content(file) for file in _files(events))
    assert b"SparkListenerSQLExecutionStart" in logged, "Spark wrote no event log to read"
    assert any(p.name.endswith(".json") and "_delta_log" in str(p) for p in files)
    found = [
        f"{what} in {where}"
        for what, secret in secrets.items()
        for where, text in written.items()
        if secret in text
    ]
    found += [
        f"{what} in {file.relative_to(tmp_path)}"
        for file in files
        for what, secret in secrets.items()
        if secret.encode() in _content(file)
    ]
    assert found == []


@pytest.mark.parametrize("engine_name", ["embedded", "cluster"])
def test_the_kafka_options_the_engine_hands_spark_print_redacted(
    spark, secure_kafka, engine_name, capsys
) -> None:
    """A client certificate's key given inline (librdkafka's ssl.key.pem, the Java client's
    ssl.keystore.key) is a secret without "password" in its name or value, which Spark's own
    redaction looks for: the source's options printed with its plan (explain, the UI, a
    failure's plan) showed it until the engine made its sessions redact Kafka's secret options
    by key (spark.sql.redaction.options.regex)."""
    from kafka_delta.config import PipelineConfig
    from kafka_delta.sources.embedded import EmbeddedSource
    from kafka_delta.sources.spark_kafka import SparkKafkaSource

    engine = engine_config(engine_name)
    skip_without_connectors(spark, engine)
    tls = secure_kafka.tls
    key = tls.client_plain_key.read_text()
    certificate = tls.client_certificate.read_text()
    cfg = PipelineConfig.model_validate(
        {
            "pipeline_id": "secure-pipeline",
            "engine": engine,
            "kafka": {
                "bootstrap_servers": secure_kafka.address("MTLS"),
                "topics": [new_name()],
                "consumer_group": new_name(),
                "client": {
                    "security.protocol": "SSL",
                    "ssl.ca.location": str(tls.ca),
                    "ssl.certificate.pem": certificate,
                    "ssl.key.pem": key,
                },
                "jvm_client": {
                    "security.protocol": "SSL",
                    "ssl.truststore.type": "PEM",
                    "ssl.truststore.certificates": tls.ca.read_text(),
                    "ssl.keystore.type": "PEM",
                    "ssl.keystore.certificate.chain": certificate,
                    "ssl.keystore.key": key,
                },
            },
            "delta": {"table": "/tmp/never-written"},
            "checkpoint": "/tmp/never-written-checkpoint",
        }
    )
    source = EmbeddedSource(cfg.kafka) if engine_name == "embedded" else SparkKafkaSource(cfg.kafka)
    capsys.readouterr()

    source.stream(spark, None).explain(extended=True)

    printed = capsys.readouterr().out
    assert "StreamingRelation" in printed and "(redacted)" in printed, printed
    body = [line for line in key.splitlines() if not line.startswith("-----")]
    assert body and not [line for line in body if line in printed], printed
