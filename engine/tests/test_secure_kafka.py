"""Kafka as production runs it, against Apache Kafka's own broker with TLS and SASL together
(secure_support.py: certificates made for the session, SCRAM users made at format time): each
shape (SASL_SSL with SCRAM-SHA-512, SASL_SSL with PLAIN as Event Hubs and Confluent Cloud take
it, mutual TLS) reads exactly once on both engines and commits back to the group, and the
commands work through the same settings; every refusal, of librdkafka's settings (checked before
Spark starts) or of the Java client's alone (Spark's kafka source), is one true sentence naming
what to check, within 30 s, exit 2, nothing written; an unreachable address keeps its own
sentence. ACLs: test_kafka_acls.py; no secret written anywhere: test_kafka_secrets.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from conftest import engine_config, skip_without_connectors
from kafka_delta.cli import EXIT_REFUSED, main
from kafka_delta.kafka.admin import KafkaAdmin, KafkaRefusedError
from kafka_delta.pipeline import Pipeline
from kafka_delta_dev.children import free_port
from secure_support import (
    RECORDS,
    SHAPES,
    SecureKafka,
    Shape,
    event_hubs,
    mutual_tls,
    scram,
    topic_and_config,
)
from support import PROJECT, assert_exactly_once

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _cli(argv: list[str], shape: Shape, monkeypatch, capsys) -> tuple[int, str, str, float]:
    """``main(argv)`` in this process with ``shape``'s secrets in the environment: its exit
    status, what it printed (stdout, stderr) and the seconds it took."""
    for name, value in shape.environ.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    started = time.monotonic()
    status = main(argv)
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    return status, out, err, took


# -- each shape reads, on both engines ------------------------------------------------------------


@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_each_production_shape_reads_exactly_once_commits_back_and_serves_the_commands(
    spark, secure_kafka, engine, shape_name, tmp_path, monkeypatch, capsys
) -> None:
    shape = SHAPES[shape_name](secure_kafka)
    path, cfg = topic_and_config(secure_kafka, shape, tmp_path, engine)
    assert cfg.kafka.client["sasl.username" if shape.name != "mtls" else "security.protocol"] in (
        "alice",
        "$ConnectionString",  # taken literally: no {...}, no reference
        "SSL",
    )

    summary = Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, RECORDS)
    assert summary.commit_back is not None and summary.commit_back.failed == 0
    admin = KafkaAdmin(cfg.kafka.client_config())
    partitions = admin.partitions(cfg.kafka.topics)
    latest = admin.latest(partitions)
    assert admin.committed(cfg.kafka.consumer_group, partitions) == latest

    # The commands, through the same settings and the same ${NAME} references.
    status, out, err, _ = _cli(
        ["offsets", "show", "--json", "--config", str(path)], shape, monkeypatch, capsys
    )
    assert status == 0, err
    shown = json.loads(out)
    assert shown["lag"] == 0 and shown["consumer_group_unreadable"] is None
    assert {r["group_offset"] for r in shown["partitions"]} == set(
        latest[cfg.kafka.topics[0]].values()
    )
    status, out, err, _ = _cli(
        ["offsets", "verify", "--config", str(path), "--against-kafka", "--ids", "id"],
        shape,
        monkeypatch,
        capsys,
    )
    assert status == 0, out + err
    assert "ok    kafka:" in out and "ok    group:" in out, out
    status, out, err, _ = _cli(
        ["offsets", "reset", "--config", str(path), "--to-current", "--execute"],
        shape,
        monkeypatch,
        capsys,
    )
    assert status == 0, out + err
    assert f"consumer group {cfg.kafka.consumer_group} now at the same offsets" in out
    if shape.name == "scram":  # reads no Kafka: once an engine, its config read the same way
        status, out, err, _ = _cli(
            ["table", "maintain", "--config", str(path)], shape, monkeypatch, capsys
        )
        assert status == 0, out + err


# -- refusals of kafka.client's settings: said before Spark starts, on both engines ---------------


def _without(settings: dict[str, str], *keys: str) -> dict[str, str]:
    return {k: v for k, v in settings.items() if k not in keys}


def _refused_shape(kafka: SecureKafka, case: str) -> tuple[Shape, str | None]:
    """The shape of each refusal case, and the bootstrap address it connects to (None: the
    shape's listener)."""
    from dataclasses import replace

    if case == "wrong password":
        return scram(kafka, password="not-the-password"), None
    if case == "unknown user":
        return scram(kafka, user="mallory", password="mallorys-password"), None
    if case == "wrong connection string":
        shape = event_hubs(kafka)
        return replace(
            shape, environ={**shape.environ, "EVENTHUBS_CONNECTION_STRING": "Endpoint=sb://x/"}
        ), None
    if case == "untrusted certificate":
        shape = scram(kafka)
        return replace(
            shape,
            client={**shape.client, "ssl.ca.location": str(kafka.tls.other_ca)},
            jvm_client={
                **shape.jvm_client,
                "ssl.truststore.location": str(kafka.tls.other_truststore),
            },
        ), None
    if case == "host name not in the certificate":
        return scram(kafka), "localhost"
    if case == "missing CA file":
        shape = scram(kafka)
        return replace(
            shape, client={**shape.client, "ssl.ca.location": "/nonexistent/kafka/ca.pem"}
        ), None
    if case == "wrong key password":
        shape = mutual_tls(kafka)
        return replace(shape, environ={**shape.environ, "KAFKA_KEY_PASSWORD": "not-it"}), None
    if case == "CA file that holds no certificate":
        shape = scram(kafka)
        return replace(
            shape, client={**shape.client, "ssl.ca.location": str(kafka.tls.folder / "ca.ext")}
        ), None
    if case == "plaintext to a TLS listener":
        return Shape("plaintext", "SCRAM", {}, {}, {}), None
    if case == "no client certificate":
        shape = mutual_tls(kafka)
        return replace(
            shape,
            client=_without(
                shape.client, "ssl.certificate.location", "ssl.key.location", "ssl.key.password"
            ),
            jvm_client=_without(
                shape.jvm_client,
                "ssl.keystore.location",
                "ssl.keystore.type",
                "ssl.keystore.password",
                "ssl.key.password",
            ),
        ), None
    raise AssertionError(case)


REFUSALS = {
    "wrong password": (
        "Kafka at {address} refused the login of 'alice' (SCRAM-SHA-512: Authentication failed "
        "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512): "
        "check sasl.username, sasl.password and sasl.mechanism in kafka.client (and "
        "sasl.jaas.config in kafka.jvm_client)"
    ),
    # Kafka tells an unknown user apart from a wrong password to nobody.
    "unknown user": (
        "Kafka at {address} refused the login of 'mallory' (SCRAM-SHA-512: Authentication failed "
        "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512): "
        "check sasl.username, sasl.password and sasl.mechanism in kafka.client (and "
        "sasl.jaas.config in kafka.jvm_client)"
    ),
    "wrong connection string": (
        "Kafka at {address} refused the login of '$ConnectionString' (PLAIN: Authentication "
        "failed: Invalid username or password): check sasl.username, sasl.password and "
        "sasl.mechanism in kafka.client (and sasl.jaas.config in kafka.jvm_client)"
    ),
    "untrusted certificate": (
        "the certificate Kafka at {address} presented is not signed by a CA kafka.client trusts "
        "(self-signed certificate in certificate chain): set ssl.ca.location in kafka.client "
        "(and ssl.truststore.location in kafka.jvm_client) to the CA that signed the brokers' "
        "certificates"
    ),
    "host name not in the certificate": (
        "the certificate Kafka at {address} presented does not name localhost (Hostname "
        "mismatch, certificate is not valid for 'localhost'.): put in kafka.bootstrap_servers a "
        "host name the brokers' certificates hold (as the brokers advertise themselves), or "
        "have the certificates name localhost"
    ),
    "missing CA file": None,  # said when the config is read: below
    # librdkafka's reason (OpenSSL's words, which change with its version) stands for "...".
    "wrong key password": (
        "librdkafka cannot use kafka.client's settings (ssl.key.location failed: ...): in "
        "kafka.client, ssl.key.location must be the client's private key (PEM) and "
        "ssl.key.password the password that opens it"
    ),
    "CA file that holds no certificate": (
        "librdkafka cannot use kafka.client's settings (ssl.ca.location failed: ...): in "
        "kafka.client, ssl.ca.location must be the PEM file of the CA that signed the "
        "brokers' certificates"
    ),
    "plaintext to a TLS listener": (
        "Kafka at {address} speaks TLS, but kafka.client's security.protocol is PLAINTEXT: set "
        "it to SSL or SASL_SSL, as the listener expects (and the same in kafka.jvm_client)"
    ),
    "no client certificate": (
        "Kafka at {address} requires a client certificate and kafka.client shows none (TLS "
        "alert bad certificate): set ssl.certificate.location and ssl.key.location (or "
        "ssl.keystore.location) in kafka.client, and ssl.keystore.location in "
        "kafka.jvm_client, to a certificate signed by a CA the brokers trust"
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_each_refusal_of_the_clients_settings_is_one_true_sentence_before_any_work(
    secure_kafka, engine, case, tmp_path, monkeypatch, capsys
) -> None:
    """Each used to be "cannot reach Kafka ... (Broker transport failure): check
    kafka.bootstrap_servers ... and that the brokers are up", after 10 s (a hostname mismatch
    was called an untrusted CA, a plaintext client met a TLS listener unnamed, a client
    certificate missing was not told at all, and a missing CA file was librdkafka's traceback):
    the brokers were up, and refused."""
    shape, host = _refused_shape(secure_kafka, case)
    listener = secure_kafka.address(shape.listener)
    address = listener.replace("127.0.0.1", host) if host else listener
    path, _ = topic_and_config(secure_kafka, shape, tmp_path, engine, records=10, bootstrap=address)

    status, out, err, took = _cli(["--config", str(path)], shape, monkeypatch, capsys)

    expected = REFUSALS[case]
    if expected is None:
        expected = (
            "kafka.client's ssl.ca.location is /nonexistent/kafka/ca.pem, which does not exist "
            "on this machine: point it at the CA that signed the brokers' certificates (PEM)"
        )
    lines = (out + err).splitlines()
    assert status == EXIT_REFUSED, lines
    said = f"error: {expected.format(address=address)}; nothing was read or written"
    assert len(lines) == 1 and re.fullmatch(
        ".+".join(re.escape(part) for part in said.split("...")), lines[0]
    ), lines
    # Said as soon as refused (the start-up's requests look at the client's error events),
    # not after their 10 s timeout.
    assert took < 10, took
    assert not (tmp_path / "table").exists() and not (tmp_path / "checkpoint").exists()
    for secret in secure_kafka.secrets().values():
        assert secret not in out + err


def test_an_unreachable_address_keeps_its_own_sentence(
    secure_kafka, engine, tmp_path, monkeypatch, capsys
) -> None:
    shape = scram(secure_kafka)
    address = f"127.0.0.1:{free_port()}"
    path, _ = topic_and_config(secure_kafka, shape, tmp_path, engine, records=0, bootstrap=address)

    status, out, err, took = _cli(["--config", str(path)], shape, monkeypatch, capsys)

    assert status == EXIT_REFUSED
    assert (out + err).splitlines() == [
        f"error: cannot reach Kafka at {address} ({address}: Connection refused): check "
        "kafka.bootstrap_servers (or --bootstrap-servers) and that the brokers are up"
    ]
    assert took < 30


def _run(config: Path, environ: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """The project's run command in a process of its own, as a scheduler starts it."""
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "orders_stream", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PROJECT,
        env={**os.environ, "PYTHONPATH": str(PROJECT / "src"), **environ},
    )
    return run, time.monotonic() - started


def test_a_wrong_password_is_the_same_one_sentence_on_every_restart(secure_kafka, tmp_path) -> None:
    """The run as a process: its whole output is the sentence, the same at each restart, exit
    2, nothing written, the password nowhere."""
    shape = scram(secure_kafka, password="not-the-password")
    path, _ = topic_and_config(secure_kafka, shape, tmp_path, engine_config("embedded"), records=10)
    address = secure_kafka.address("SCRAM")
    for attempt in range(2):
        run, took = _run(path, shape.environ)
        lines = (run.stdout + run.stderr).splitlines()
        assert run.returncode == EXIT_REFUSED, lines
        assert lines == [
            f"error: {REFUSALS['wrong password'].format(address=address)}; nothing was read or "
            "written"
        ], lines
        assert "not-the-password" not in run.stdout + run.stderr
        assert took < 30, (attempt, took)
    assert not (tmp_path / "table").exists() and not (tmp_path / "checkpoint").exists()


# -- refusals of kafka.jvm_client's settings alone: Spark's kafka source ---------------------------


def _jvm_refused_shape(kafka: SecureKafka, case: str) -> tuple[Shape, str | None]:
    """kafka.client right (the start-up's checks pass), kafka.jvm_client wrong; and the host
    the run connects to (None: 127.0.0.1)."""
    from dataclasses import replace

    shape = scram(kafka)
    if case == "wrong password":
        jaas = shape.jvm_client["sasl.jaas.config"].replace("KAFKA_PASSWORD", "KAFKA_JVM_PASSWORD")
        return replace(
            shape,
            jvm_client={**shape.jvm_client, "sasl.jaas.config": jaas},
            environ={**shape.environ, "KAFKA_JVM_PASSWORD": "not-the-password"},
        ), None
    if case == "untrusted certificate":
        return replace(
            shape,
            jvm_client={
                **shape.jvm_client,
                "ssl.truststore.location": str(kafka.tls.other_truststore),
            },
        ), None
    if case == "host name not in the certificate":
        # librdkafka told to check no host name, the Java client checking it (its default).
        return replace(
            shape, client={**shape.client, "ssl.endpoint.identification.algorithm": "none"}
        ), "localhost"
    if case == "wrong trust store password":
        return replace(
            shape, environ={**shape.environ, "KAFKA_TRUSTSTORE_PASSWORD": "not-the-password"}
        ), None
    if case == "no client certificate":
        shape = mutual_tls(kafka)
        return replace(
            shape,
            jvm_client=_without(
                shape.jvm_client,
                "ssl.keystore.location",
                "ssl.keystore.type",
                "ssl.keystore.password",
                "ssl.key.password",
            ),
        ), None
    raise AssertionError(case)


JVM_REFUSALS = {
    "wrong password": (
        "Kafka at {address} refused the login of 'alice' of Spark's kafka source "
        "(SCRAM-SHA-512: Authentication failed during authentication due to invalid credentials "
        "with SASL mechanism SCRAM-SHA-512): check sasl.jaas.config and sasl.mechanism in "
        "kafka.jvm_client"
    ),
    "untrusted certificate": (
        "the certificate Kafka at {address} presented is not signed by a CA in "
        "kafka.jvm_client's trust store (PKIX path building failed): set "
        "ssl.truststore.location (with ssl.truststore.password and ssl.truststore.type) in "
        "kafka.jvm_client to a store holding the CA that signed the brokers' certificates"
    ),
    "host name not in the certificate": (
        "the certificate Kafka at {address} presented does not name the host Spark's kafka "
        "source connected to (No name matching localhost found): put in "
        "kafka.bootstrap_servers a host name the brokers' certificates hold, or have the "
        "certificates name it"
    ),
    "wrong trust store password": (
        "Spark's kafka source cannot load the PKCS12 store {truststore} of kafka.jvm_client's "
        "ssl.truststore.location (keystore password was incorrect): check "
        "ssl.truststore.location, ssl.truststore.password and ssl.truststore.type in "
        "kafka.jvm_client"
    ),
    "no client certificate": (
        "Kafka at {address} refused the certificate Spark's kafka source showed, or its lack of "
        "one (TLS alert bad_certificate): set ssl.keystore.location (with ssl.keystore.password "
        "and ssl.key.password) in kafka.jvm_client to a certificate signed by a CA the brokers "
        "trust"
    ),
}


@pytest.mark.parametrize("case", sorted(JVM_REFUSALS))
def test_a_refusal_of_the_java_clients_settings_alone_is_one_sentence_never_an_outage(
    spark, secure_kafka, case, tmp_path
) -> None:
    """Spark's kafka source failed with the Java client's exception inside Spark's text (the
    reason only in its causes), which the run neither named nor told from an outage."""
    engine = engine_config("cluster")
    skip_without_connectors(spark, engine)
    shape, host = _jvm_refused_shape(secure_kafka, case)
    listener = secure_kafka.address(shape.listener)
    address = listener.replace("127.0.0.1", host) if host else listener
    _, cfg = topic_and_config(secure_kafka, shape, tmp_path, engine, records=20, bootstrap=address)

    started = time.monotonic()
    with pytest.raises(KafkaRefusedError) as refused:
        Pipeline(spark, cfg).run()
    took = time.monotonic() - started

    expected = JVM_REFUSALS[case].format(
        address=address, truststore=secure_kafka.tls.client_truststore
    )
    assert str(refused.value) == expected
    assert took < 30, took
    # Nothing written: no commit in the table (delta-spark may have made its folder), or none
    # with a row.
    table = tmp_path / "table"
    if list((table / "_delta_log").glob("*.json")):
        assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 0


def test_a_wrong_password_of_the_java_client_is_the_same_one_sentence_on_every_restart(
    spark, secure_kafka, tmp_path
) -> None:
    """The cluster engine's run as a process, kafka.jvm_client's password wrong: it ends with
    the sentence, the same at each restart, exit 2, nothing written, never waited out as an
    outage; above it only the start-up's lines (Spark starts before the Java client logs in),
    no stack trace, and none of the Java client's or Spark's lines about the refusal (the
    project's conf/log4j2.properties keeps them out)."""
    from kafka_delta_dev.pytest_plugin import connector_conf

    engine = engine_config("cluster")
    shape, _ = _jvm_refused_shape(secure_kafka, "wrong password")
    jars = connector_conf(engine["source"], engine["sink"])
    path, cfg = topic_and_config(
        secure_kafka, shape, tmp_path, engine, records=20, spark={"conf": jars}
    )
    expected = JVM_REFUSALS["wrong password"].format(address=secure_kafka.address("SCRAM"))
    for attempt in range(2):
        run, took = _run(path, shape.environ)
        lines = (run.stdout + run.stderr).splitlines()
        assert run.returncode == EXIT_REFUSED, lines
        # Above the sentence, the run's start-up lines only: no stack trace, nothing of the
        # refusal said before (the Java client's lines, Spark's retries).
        assert lines[-1] == f"error: {expected}", lines
        above = lines[:-1]
        assert not [line for line in above if line.startswith(("\t", " ", "Caused by"))], above
        assert not [line for line in above if "Exception" in line or " ERROR " in line], above
        assert not [line for line in above if "authentication" in line.lower()], above
        assert "not-the-password" not in run.stdout + run.stderr
        assert took < 60, (attempt, took)  # a Spark session's start, and the sentence
    table = Path(cfg.delta.table)
    if list((table / "_delta_log").glob("*.json")):
        assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 0


def test_the_configuration_guide_shows_each_shape_exactly_as_tested(secure_kafka) -> None:
    """engine/docs/configuration.md's "Secure Kafka" lines are these tests' settings: the same
    keys and values in both clients, a path for each file."""
    guide = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    section = guide.split("## Secure Kafka", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    shown = [yaml.safe_load(block)["kafka"] for block in blocks]
    tested = [scram(secure_kafka), event_hubs(secure_kafka), mutual_tls(secure_kafka)]
    assert len(shown) == len(tested)
    for doc, shape in zip(shown, tested, strict=True):
        for client, settings in (("client", shape.client), ("jvm_client", shape.jvm_client)):
            assert set(doc[client]) == set(settings), (shape.name, client)
            for key, value in settings.items():
                if value.startswith("/"):
                    assert str(doc[client][key]).startswith("/path/to/"), (shape.name, key)
                else:
                    assert doc[client][key] == value, (shape.name, client, key)
