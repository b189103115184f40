"""The development services ``scripts/broker.sh start`` started for a project, as its
``.broker.json`` records them (written by :mod:`kafka_delta_dev.broker`): a run and the commands
find the dev broker and Schema Registry there when the config names the default local address,
so no random port is pasted anywhere. The deployed engine only reads the file; it never starts
a service.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kafka_delta.runtime.processes import pid_exists

STATE_FILE = ".broker.json"

# The bootstrap address the template's local config ships with: where a developer's broker is
# assumed, unless scripts/broker.sh started one on a free port (its address in .broker.json).
_LOCAL_BOOTSTRAP = frozenset({"127.0.0.1:9092", "localhost:9092"})
# The registry address the template's local config ships with (a project on Avro or Protobuf):
# replaced by the one scripts/broker.sh started, when there is one.
_LOCAL_REGISTRY = frozenset({"http://127.0.0.1:8081", "http://localhost:8081"})


class StateFileError(RuntimeError):
    """A ``.broker.json`` that is not a broker state file."""


def read_state(path: Path) -> dict[str, Any] | None:
    """The state file's record, or None when there is none."""
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StateFileError(f"{path} is not a broker state file ({exc}); delete it") from None
    if not isinstance(state, dict) or not {"pid", "bootstrap_servers"} <= set(state):
        raise StateFileError(f"{path} is not a broker state file; delete it")
    return state


def _runs(pid: int, program: bytes) -> bool:
    """``pid`` is alive and (where /proc tells) runs ``program``: a pid reused by another
    program after a reboot is never taken for it, or signalled."""
    cmdline = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self/cmdline").exists():
        try:
            return program in cmdline.read_bytes()
        except OSError:
            return False
    return pid_exists(pid)


def broker_running(state: dict[str, Any]) -> bool:
    """The state's broker is alive: Apache Kafka's JVM (``kafka.Kafka``), or the stand-in
    Tansu where the state says so (and in a state file written before it said)."""
    program = b"kafka.Kafka" if state.get("kind") == "kafka" else b"tansu"
    return _runs(int(state["pid"]), program)


def registry_running(state: dict[str, Any]) -> bool:
    """The state's Schema Registry (``python -m kafka_delta_dev.schema_registry_server``) is
    alive."""
    pid = state.get("registry_pid")
    return isinstance(pid, int) and _runs(pid, b"kafka_delta_dev.schema_registry_server")


def state_path_of(config_path: Path) -> Path | None:
    """The project's ``.broker.json``, if there is one. The project root is the folder holding
    ``conf/``, as load_config resolves paths."""
    root = config_path.resolve().parent
    if root.name == "conf":
        root = root.parent
    state_path = root / STATE_FILE
    return state_path if state_path.is_file() else None


def started_broker(config_path: Path, configured: str) -> str | None:
    """The address of the broker ``scripts/broker.sh start`` recorded in the project's
    ``.broker.json``, when the config names the default local address and that broker still
    runs; None otherwise. One line on stderr says which broker the run uses."""
    if configured not in _LOCAL_BOOTSTRAP:
        return None
    state_path = state_path_of(config_path)
    if state_path is None:
        return None
    try:
        state = read_state(state_path)
    except StateFileError as exc:
        print(f"ignoring {state_path}: {exc}", file=sys.stderr)
        return None
    if state is None:
        return None
    if not broker_running(state):
        print(
            f"ignoring {state_path}: its broker (pid {state['pid']}) is no longer running; "
            f"using kafka.bootstrap_servers {configured}",
            file=sys.stderr,
        )
        return None
    address = str(state["bootstrap_servers"])
    print(
        f"using the broker scripts/broker.sh started, at {address} ({state_path}; "
        "--bootstrap-servers overrides)",
        file=sys.stderr,
    )
    return address


def started_registry(config_path: Path, configured: str) -> str | None:
    """The URL of the Schema Registry ``scripts/broker.sh start`` recorded in ``.broker.json``
    beside its broker, when the config names the default local address and it still runs."""
    if configured.rstrip("/") not in _LOCAL_REGISTRY:
        return None
    state_path = state_path_of(config_path)
    if state_path is None:
        return None
    try:
        state = read_state(state_path)
    except StateFileError:
        return None
    url = (state or {}).get("schema_registry_url")
    if not url or state is None or not registry_running(state):
        return None
    print(
        f"using the Schema Registry scripts/broker.sh started, at {url} ({state_path}; "
        "--schema-registry-url overrides)",
        file=sys.stderr,
    )
    return str(url)
