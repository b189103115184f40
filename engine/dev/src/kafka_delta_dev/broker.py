"""The development broker for local runs and tests: Apache Kafka's own, one KRaft node on
127.0.0.1 (:mod:`.kafka_cluster`, its jars from Maven through pyspark's Ivy, cached once per
version); the Kafka-compatible stand-in Tansu (:mod:`.tansu`) only where those jars cannot be
had, which :func:`dev_broker` says in one line. ``KAFKA_DELTA_BROKER=tansu`` asks for the
stand-in (to compare), ``KAFKA_DELTA_BROKER=kafka`` refuses it (a failure instead).

    python -m kafka_delta_dev.broker start --port 9092 --state .broker.json
    python -m kafka_delta_dev.broker address --state .broker.json
    python -m kafka_delta_dev.broker registry-url --state .broker.json
    python -m kafka_delta_dev.broker stop --state .broker.json

``start`` formats a new broker in a folder of its own beside the state file (``.broker/`` for
``.broker.json``: its settings, log segments and ``server.log``), and writes the broker's pid,
kind and address to the state file; ``address`` prints the address of the broker it names if
that broker is still running: how scripts/run_local.sh and scripts/produce.sh find the broker
without its (random) port being pasted anywhere. ``stop`` stops it by its pid and removes its
folder: a development broker starts empty every time.

``start`` also starts the development Schema Registry (:mod:`.schema_registry_server`) beside
the broker, and keeps its URL in the state file under ``schema_registry_url`` (its pid under
``registry_pid``); ``registry-url`` prints it, ``stop`` stops both, each by its pid. The
registry's data (``.broker.registry.json``) goes with ``stop``, as the broker's does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kafka_delta.runtime.local_services import StateFileError, broker_running, read_state
from kafka_delta_dev.kafka_cluster import KafkaCluster, KafkaError, jar_set, jars, kafka_version
from kafka_delta_dev.maven import failed_before
from kafka_delta_dev.schema_registry_server import (
    LocalSchemaRegistry,
    RegistryError,
    is_registry_process,
)
from kafka_delta_dev.schema_registry_server import stop_pid as stop_registry_pid
from kafka_delta_dev.tansu import TansuBroker, TansuError

Broker = KafkaCluster | TansuBroker


class BrokerError(RuntimeError):
    pass


_said: set[str] = set()


def broker_kind() -> tuple[str, str | None]:
    """``("kafka", None)`` where Apache Kafka's jars are at hand (fetched now if they never
    were), else ``("tansu", why)``: the one clause that says why Kafka is not."""
    forced = os.environ.get("KAFKA_DELTA_BROKER", "").strip().lower()
    if forced == "tansu":
        return "tansu", "KAFKA_DELTA_BROKER=tansu asks for it"
    if forced not in ("", "kafka"):
        raise BrokerError(f"KAFKA_DELTA_BROKER={forced} is neither kafka nor tansu")
    if jars(resolve=False).folder is None and not failed_before(jar_set()):
        print(
            f"fetching Apache Kafka {kafka_version()}'s jars through pyspark's Ivy "
            "(once per version)",
            file=sys.stderr,
        )
    found = jars()
    if found.folder is not None:
        return "kafka", None
    if forced == "kafka":
        raise BrokerError(f"Apache Kafka's jars are not at hand ({found.reason})")
    return "tansu", f"Apache Kafka's jars are not at hand ({found.reason})"


def dev_broker(
    port: int | None = None,
    log_path: Path | None = None,
    *,
    folder: Path | None = None,
    detached: bool = False,
) -> Broker:
    """The development broker, not started: Apache Kafka where its jars are at hand, else
    Tansu, with one line on stderr saying so and why. ``folder`` holds a Kafka broker's state
    (a temporary folder, removed at stop, when None); ``detached=False`` ties the broker's life
    to this process (Linux)."""
    kind, why = broker_kind()
    if kind == "kafka":
        return KafkaCluster(folder, port=port, log_path=log_path, detached=detached)
    if why not in _said:
        _said.add(why or "")
        print(
            f"using Tansu, a Kafka-compatible stand-in, as the development broker: {why}; it "
            "differs from Kafka (engine/docs/limits.md)",
            file=sys.stderr,
        )
    return TansuBroker(folder, port=port, log_path=log_path, detached=detached)


def start_broker(broker: Broker) -> Broker:
    """Start ``broker``; :class:`BrokerError` with one sentence when it does not."""
    try:
        return broker.start()
    except (KafkaError, TansuError) as exc:
        raise BrokerError(str(exc)) from None


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description="Start or stop the development Kafka broker."
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
        folder = _broker_folder(args.state)
        shutil.rmtree(folder, ignore_errors=True)  # a new broker starts empty
        try:
            broker = start_broker(
                dev_broker(
                    args.port,
                    log_path=args.state.with_suffix(".log"),
                    folder=folder,
                    detached=True,
                )
            )
        except BrokerError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            print(f"error: the broker did not start: {exc}", file=sys.stderr)
            return 1
        pid = broker.pid()
        assert pid is not None
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
            shutil.rmtree(folder, ignore_errors=True)
            print(f"error: the schema registry did not start: {exc}", file=sys.stderr)
            return 1
        assert registry.process is not None
        args.state.write_text(
            json.dumps(
                {
                    "pid": pid,
                    "kind": broker.kind,
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
    shutil.rmtree(_broker_folder(args.state), ignore_errors=True)
    args.state.unlink()
    return 0


def _stop_pid(state: dict[str, Any], timeout_s: float = 10.0) -> None:
    """SIGKILL the state's broker (nothing of a development broker is kept: its folder goes
    next) and wait until it is gone: once ``stop`` returns, its port is free and nothing of it
    runs."""
    if not broker_running(state):
        return
    try:
        os.kill(int(state["pid"]), signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while broker_running(state) and time.monotonic() < deadline:
        time.sleep(0.05)


def _broker_folder(state_path: Path) -> Path:
    """The broker's own folder beside its state file: ``.broker/`` for ``.broker.json``."""
    return state_path.with_suffix("")


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
