"""scripts/broker.sh keeps the development broker's address in .broker.json, where
scripts/produce.sh and scripts/run_local.sh find it: a real broker started and stopped by the
script, and the state file's failure cases, each with one clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafka_delta_dev.kafka_cluster import KAFKA_VERSION, LOG4J_VERSION


def broker(
    state: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_delta_dev.broker", *args, "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.broker
def test_started_broker_address_is_read_back_and_stop_ends_it(tmp_path: Path) -> None:
    state = tmp_path / ".broker.json"
    started = broker(state, "start")
    assert started.returncode == 0, started.stderr
    recorded = json.loads(state.read_text())
    pid = recorded["pid"]
    # Apache Kafka's own broker, its state in a folder of its own beside the state file.
    program = b"kafka.Kafka" if recorded["kind"] == "kafka" else b"tansu"
    assert program in _cmdline(pid)
    if recorded["kind"] == "kafka":
        assert (tmp_path / ".broker" / "node-1" / "server.properties").is_file()
    try:
        address = broker(state, "address")
        assert address.returncode == 0, address.stderr
        assert address.stdout.strip() == started.stdout.strip()
        assert address.stdout.startswith("127.0.0.1:")
        again = broker(state, "start")
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        stopped = broker(state, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not state.exists() and not (tmp_path / ".broker").exists()
    # Not our child (the broker runs detached): watch /proc until it is gone.
    for _ in range(100):
        if program not in _cmdline(pid):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"broker pid {pid} still running after stop")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


# An Ivy settings file whose only repository is an empty folder: Apache Kafka's jars cannot be
# fetched, as on a machine that cannot reach Maven Central.
NOWHERE = """<ivysettings>
  <settings defaultResolver="nowhere"/>
  <resolvers>
    <filesystem name="nowhere" m2compatible="true">
      <artifact pattern="{folder}/[organisation]/[module]/[revision]/[artifact]-[revision].[ext]"/>
    </filesystem>
  </resolvers>
</ivysettings>
"""


@pytest.mark.broker
def test_where_kafkas_jars_cannot_be_fetched_the_broker_is_the_stand_in_saying_so_in_one_line(
    tmp_path: Path,
) -> None:
    settings = tmp_path / "ivysettings.xml"
    (tmp_path / "empty").mkdir()
    settings.write_text(NOWHERE.format(folder=tmp_path / "empty"))
    env = {
        **os.environ,
        "KAFKA_DELTA_JAR_CACHE": str(tmp_path / "cache"),
        "KAFKA_DELTA_IVY_SETTINGS": str(settings),
    }
    state = tmp_path / ".broker.json"
    for attempt in range(2):  # the failure is kept: the second start does not fetch again
        started = broker(state, "start", env=env)
        try:
            assert started.returncode == 0, started.stderr
            assert json.loads(state.read_text())["kind"] == "tansu"
            said = [line for line in started.stderr.splitlines() if "Tansu" in line]
            assert said == [
                "using Tansu, a Kafka-compatible stand-in, as the development broker: Apache "
                "Kafka's jars are not at hand (Ivy could not resolve org.apache.kafka:kafka_2.13:"
                f"{KAFKA_VERSION}, org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}: its "
                f"repository does not serve org.apache.kafka#kafka_2.13;{KAFKA_VERSION}, "
                f"org.apache.logging.log4j#log4j-slf4j-impl;{LOG4J_VERSION}); it differs from "
                "Kafka (engine/docs/limits.md)"
            ], started.stderr
            assert ("fetching Apache Kafka" in started.stderr) == (attempt == 0), started.stderr
        finally:
            assert broker(state, "stop", env=env).returncode == 0
    # KAFKA_DELTA_BROKER=kafka refuses the stand-in: a failure, in one sentence.
    refused = broker(state, "start", env={**env, "KAFKA_DELTA_BROKER": "kafka"})
    assert refused.returncode == 1 and not state.exists()
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: the broker did not start: Apache Kafka's jars are not at hand (Ivy could not "
        )
    ), refused.stderr


def test_address_without_a_started_broker_says_how_to_start_one(tmp_path: Path) -> None:
    run = broker(tmp_path / ".broker.json", "address")
    assert run.returncode == 1 and run.stdout == ""
    assert "scripts/broker.sh start" in run.stderr and run.stderr.count("\n") == 1


def test_a_stale_state_file_is_reported_and_its_pid_never_signalled(tmp_path: Path) -> None:
    # The broker is gone and its pid now belongs to another program (here: a sleep).
    other = subprocess.Popen(["sleep", "60"])
    try:
        state = tmp_path / ".broker.json"
        state.write_text(json.dumps({"pid": other.pid, "bootstrap_servers": "127.0.0.1:1"}))

        address = broker(state, "address")
        assert address.returncode == 1 and "no longer running" in address.stderr

        stop = broker(state, "stop")
        assert stop.returncode == 0 and not state.exists()
        assert other.poll() is None  # the other program was left alone
    finally:
        other.kill()
        other.wait()


def test_a_state_file_that_is_not_one_is_named(tmp_path: Path) -> None:
    state = tmp_path / ".broker.json"
    state.write_text("not json")
    run = broker(state, "address")
    assert run.returncode == 1 and f"{state} is not a broker state file" in run.stderr
