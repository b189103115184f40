"""Kafka that requires a login, against Apache Kafka's own broker: the right password reads, a
refused login is named as one (with the settings to check), and an unreachable address keeps its
own sentence. The brokers' listeners are made by the test (:class:`KafkaCluster`'s
``listeners``), on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kafka_delta_dev.kafka_cluster import KafkaCluster, Listener
from kafka_delta_dev.produce import ensure_topics, produce_events
from support import PACKAGE, PROJECT

pytestmark = [pytest.mark.broker, pytest.mark.usefixtures("apache_kafka")]

PASSWORD = "alice-Secret-7d3f"
PLAIN_USERS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-pw" user_admin="admin-pw" '
    f'user_alice="{PASSWORD}";'
)


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One node with a SASL_PLAINTEXT listener taking PLAIN logins (alice's among them) beside
    the PLAINTEXT one the tests produce through."""
    cluster = KafkaCluster(
        tmp_path_factory.mktemp("sasl-kafka"),
        listeners=[
            Listener(
                "SASL",
                "SASL_PLAINTEXT",
                {"sasl.enabled.mechanisms": "PLAIN", "plain.sasl.jaas.config": PLAIN_USERS},
            )
        ],
    ).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _config(tmp_path: Path, topic: str, password_env: str = "KAFKA_PASSWORD") -> Path:
    """conf/local.yaml of the rendered project, reading ``topic`` as alice over SASL/PLAIN, the
    password given as ``${...}`` (never in the file)."""
    conf = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text(encoding="utf-8"))
    conf["delta"]["table"] = str(tmp_path / "table")
    conf["dead_letters"]["table"] = str(tmp_path / "dead_letters")
    conf["checkpoint"] = str(tmp_path / "checkpoint")
    conf["decoding"]["value"]["schema_file"] = str(PROJECT / "schemas" / "order_event.ddl")
    conf["kafka"]["topics"] = [topic]
    conf["kafka"]["client"] = {
        **(conf["kafka"].get("client") or {}),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
        "sasl.password": "${" + password_env + "}",
    }
    conf["kafka"]["jvm_client"] = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            'username="alice" password="${' + password_env + '}";'
        ),
    }
    (tmp_path / "conf").mkdir(exist_ok=True)
    path = tmp_path / "conf" / "secure.yaml"
    path.write_text(yaml.safe_dump(conf), encoding="utf-8")
    return path


def _run(
    config: Path, bootstrap: str, password: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", PACKAGE, "--config", str(config), "--bootstrap-servers", bootstrap],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PROJECT,
        env={**os.environ, "PYTHONPATH": str(PROJECT / "src"), "KAFKA_PASSWORD": password},
    )
    return run, time.monotonic() - started


def test_a_wrong_password_is_named_as_a_refused_login_with_the_settings_to_check(
    sasl_kafka: KafkaCluster, tmp_path: Path
) -> None:
    """It used to say "cannot reach Kafka ... (Broker transport failure): check
    kafka.bootstrap_servers ... and that the brokers are up": the broker was up, and refused."""
    topic = "secured"
    ensure_topics(sasl_kafka.bootstrap_servers, [topic], 1)
    address = sasl_kafka.address("SASL")
    config = _config(tmp_path, topic)

    for attempt in range(2):  # the same sentence on every restart
        run, took = _run(config, address, "not-the-password")
        lines = (run.stdout + run.stderr).splitlines()
        assert run.returncode == 2, lines
        assert len(lines) == 1, lines
        assert lines[0] == (
            f"error: Kafka at {address} refused the login of 'alice' (PLAIN: Authentication "
            "failed: Invalid username or password): check sasl.username, sasl.password and "
            "sasl.mechanism in kafka.client (and sasl.jaas.config in kafka.jvm_client); "
            "nothing was read or written"
        ), lines
        assert "not-the-password" not in run.stdout + run.stderr
        assert took < 30, (attempt, took)
    assert not (tmp_path / "table").exists() and not (tmp_path / "checkpoint").exists()


def test_the_right_password_reads_every_record(sasl_kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = "secured-reads"
    ensure_topics(sasl_kafka.bootstrap_servers, [topic], 2)
    produce_events(sasl_kafka.bootstrap_servers, [topic], 500)
    run, _ = _run(_config(tmp_path, topic), sasl_kafka.address("SASL"), PASSWORD)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    from deltalake import DeltaTable

    assert DeltaTable(str(tmp_path / "table")).to_pyarrow_table().num_rows == 500
    assert PASSWORD not in run.stdout + run.stderr
