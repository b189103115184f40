"""The repository's own dev-tool scripts (docs/development.md, "Other scripts"), run as pasted:
the development broker and its Schema Registry (kafka_delta_dev, imported by the repo's venv
straight from template/), no project generated."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _broker(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "scripts" / "broker"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_scripts_broker_starts_the_broker_and_its_schema_registry_and_stops_both(
    tmp_path: Path,
) -> None:
    started = _broker("start", cwd=tmp_path)
    state_file = tmp_path / ".broker.json"
    try:
        assert started.returncode == 0, started.stderr
        state = json.loads(state_file.read_text())
        assert started.stdout.strip() == state["bootstrap_servers"]
        # The registry runs in its own process (python -m kafka_delta_dev.schema_registry_server).
        with urllib.request.urlopen(f"{state['schema_registry_url']}/subjects", timeout=10) as r:
            assert json.loads(r.read()) == []
    finally:
        stopped = _broker("stop", cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert not state_file.exists()
    for pid in (state["pid"], state["registry_pid"]):
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"process {pid} still runs"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
