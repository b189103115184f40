"""Apache Kafka's own broker on 127.0.0.1, in KRaft mode: one node (broker and controller in one
JVM, no ZooKeeper), or several for replication and fail-over, with the listeners, users and
authorizer a test asks for. Its jars (``org.apache.kafka:kafka_2.13``) come from Maven by
version, through the Ivy pyspark ships (:mod:`.maven`), into the user's cache; the JVM is the
Java 17 Spark runs on.

    >>> with KafkaCluster() as kafka:  # doctest: +SKIP
    ...     produce_values(kafka.bootstrap_servers, "orders", [b"{}"])

Each node's state (its ``server.properties``, its log folder, ``server.log``) is in a folder
of its own under ``folder`` (a temporary one unless given), formatted once with Kafka's
``StorageTool`` and removed by :meth:`stop`. A node is stopped by its pid: :meth:`kill` SIGKILLs
one (a crashed broker), :meth:`start_node` starts it again on the same folder and ports.

Settings are Kafka's defaults but where a development broker on one machine wants otherwise:
internal topics with the replication the nodes allow and a few partitions, no delay before a
group's first rebalance, the log cleaner and retention checked every second or two (so that a
test's compaction or retention happens within it), topics auto-created as Kafka's default does.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kafka_delta_dev import maven
from kafka_delta_dev.children import HOST, ChildServer, die_with_parent, free_ports

# The broker users run today; KAFKA_DELTA_KAFKA_VERSION tries another (3.7 and later run
# KRaft the same way).
KAFKA_VERSION = "4.1.1"
# Kafka's release ships log4j2's binding for its slf4j 1.7 calls; its POM does not name it.
LOG4J_VERSION = "2.24.3"
# KAFKA_DELTA_BROKER_JVM_OPTS replaces these (a bigger heap for a long benchmark, say).
JVM_OPTIONS = ("-Xms128m", "-Xmx1g", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
START_TIMEOUT_S = 60.0


def _cluster_id() -> str:
    """A KRaft cluster id as Kafka's own ``Uuid.randomUuid()`` makes them: url-safe base64 of 16
    random bytes, never starting with "-" (which a command line takes for an option)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaError(RuntimeError):
    """The broker's jars could not be had, or a node did not start."""


def kafka_version() -> str:
    return os.environ.get("KAFKA_DELTA_KAFKA_VERSION", KAFKA_VERSION)


def _cluster_id() -> str:
    """A KRaft cluster id (a UUID in URL-safe base64, as Kafka's ``Uuid`` writes one), never
    starting with '-': ``StorageTool format -t <id>`` would take such an id for an option and
    refuse to format ("argument --cluster-id/-t: expected one argument"), one start in 64
    (Kafka's own ``Uuid.randomUuid`` draws again for the same reason)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def jar_set(version: str | None = None) -> maven.JarSet:
    version = version or kafka_version()
    return maven.JarSet(
        "kafka",
        (
            f"org.apache.kafka:kafka_2.13:{version}",
            f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
        ),
    )


def jars(*, resolve: bool = True) -> maven.Resolution:
    """The broker's jar folder, resolved (once, then cached) unless ``resolve`` is False."""
    if not resolve:
        return maven.current(jar_set())
    return maven.resolve(jar_set())


@dataclass(frozen=True)
class Listener:
    """A listener beside the PLAINTEXT one every node has (which the tests' own admin clients,
    producers and the nodes themselves use): ``name`` (also Kafka's listener name),
    ``protocol`` (``SSL``, ``SASL_SSL``, ``SASL_PLAINTEXT``) and the listener's settings without
    their ``listener.name.<name>.`` prefix (``ssl.keystore.location``,
    ``plain.sasl.jaas.config``, ``ssl.client.auth``...)."""

    name: str
    protocol: str
    properties: Mapping[str, str] = field(default_factory=dict)


class KafkaCluster(ChildServer):
    """``nodes`` KRaft nodes on loopback, each a broker and a controller (a quorum of all)."""

    kind = "kafka"

    def __init__(
        self,
        folder: Path | None = None,
        *,
        nodes: int = 1,
        port: int | None = None,
        properties: Mapping[str, str] | None = None,
        listeners: Sequence[Listener] = (),
        scram_users: Mapping[str, str] | None = None,
        scram_mechanism: str = "SCRAM-SHA-512",
        log_path: Path | None = None,
        detached: bool = False,
    ) -> None:
        """``properties`` override the settings of every node; ``scram_users`` (name ->
        password) are created at format time, as KRaft allows; ``detached=False`` (the default)
        ties the nodes' lives to this process (Linux)."""
        if nodes < 1:
            raise ValueError("a cluster has at least one node")
        self.nodes = nodes
        self._own_folder = folder is None
        self.folder = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="kafka-"))
        self.listeners = list(listeners)
        # Every port of every node different: two listeners of a node on one port fail its
        # storage format ("Each listener must have a different port").
        ports = iter(free_ports(nodes * (2 + len(self.listeners))))
        self.ports = [next(ports) for _ in range(nodes)]
        if port:
            self.ports[0] = port
        self.controller_ports = [next(ports) for _ in range(nodes)]
        self.listener_ports = {
            listener.name: [next(ports) for _ in range(nodes)] for listener in self.listeners
        }
        self.properties = dict(properties or {})
        self.scram_users = dict(scram_users or {})
        self.scram_mechanism = scram_mechanism
        self.log_path = log_path
        self.detached = detached
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._jars: list[str] = []

    # -- addresses ---------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """Every node's PLAINTEXT address."""
        return ",".join(f"{HOST}:{p}" for p in self.ports)

    def address(self, listener: str, nodes: Sequence[int] | None = None) -> str:
        """The bootstrap address of a listener of :attr:`listeners` (every node, or ``nodes``,
        numbered from 1)."""
        ports = self.listener_ports[listener]
        chosen = nodes or range(1, self.nodes + 1)
        return ",".join(f"{HOST}:{ports[n - 1]}" for n in chosen)

    @property
    def process(self) -> subprocess.Popen[bytes] | None:  # ChildServer's one process: node 1
        return self.processes.get(1)

    def pid(self, node: int = 1) -> int | None:
        process = self.processes.get(node)
        return process.pid if process is not None and process.poll() is None else None

    def node_folder(self, node: int) -> Path:
        return self.folder / f"node-{node}"

    # -- life ---------------------------------------------------------------------------------

    def start(self) -> KafkaCluster:
        found = jars()
        if found.folder is None:
            raise KafkaError(f"Apache Kafka's jars are not at hand: {found.reason}")
        self._jars = found.jars
        cluster_id = _cluster_id()
        formats = []
        for node in range(1, self.nodes + 1):
            shutil.rmtree(self.node_folder(node), ignore_errors=True)  # a new cluster: empty
            self.node_folder(node).mkdir(parents=True)
            (self.node_folder(node) / "server.properties").write_text(self._server_properties(node))
            (self.node_folder(node) / "log4j2.properties").write_text(self._log4j(node))
            formats.append(self._format(node, cluster_id))
        for node, process in enumerate(formats, start=1):
            _, err = process.communicate(timeout=120)
            if process.returncode != 0:
                # The tool's own words, not its stack trace's frames.
                said = [
                    line.strip()
                    for line in err.decode(errors="replace").splitlines()
                    if line.strip() and not line.lstrip().startswith("at ")
                ]
                raise KafkaError(
                    f"formatting node {node}'s storage failed: {' / '.join(said[-3:])[-500:]}"
                )
        try:
            for node in range(1, self.nodes + 1):
                self.start_node(node, wait=False)
            self.wait_until_serving(range(1, self.nodes + 1))
        except BaseException:
            self.stop()
            raise
        return self

    def _java_command(self, main: str, *args: str, node: int | None = None) -> list[str]:
        options = os.environ.get("KAFKA_DELTA_BROKER_JVM_OPTS")
        command = [maven.java_binary(), *(options.split() if options else JVM_OPTIONS)]
        if node is not None:
            folder = self.node_folder(node)
            command += [
                f"-Dlog4j2.configurationFile=file:{folder / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={folder}",
            ]
        return [*command, "-cp", os.pathsep.join(self._jars), main, *args]

    def _format(self, node: int, cluster_id: str) -> subprocess.Popen[bytes]:
        config = self.node_folder(node) / "server.properties"
        args = ["format", f"--cluster-id={cluster_id}", f"--config={config}"]
        for user, password in self.scram_users.items():
            args += ["--add-scram", f"{self.scram_mechanism}=[name={user},password={password}]"]
        return subprocess.Popen(
            self._java_command("kafka.tools.StorageTool", *args, node=node),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def start_node(self, node: int, *, wait: bool = True) -> None:
        """Start node ``node`` (from 1) on its folder; with ``wait``, until it serves."""
        if self.pid(node) is not None:
            return
        log = self.log_path if (self.log_path and node == 1) else None
        out = open(log or self.node_folder(node) / "console.log", "ab")
        try:
            self.processes[node] = subprocess.Popen(
                self._java_command(
                    "kafka.Kafka", str(self.node_folder(node) / "server.properties"), node=node
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=None if self.detached else die_with_parent,
            )
        finally:
            out.close()
        if wait:
            self.wait_until_serving([node])

    def wait_until_serving(self, nodes: Sequence[int], timeout_s: float = START_TIMEOUT_S) -> None:
        """Until every node of ``nodes`` answers a metadata request naming it among the
        brokers (a listening socket is not enough)."""
        from confluent_kafka.admin import AdminClient

        from kafka_delta.kafka.clients import admin_settings

        deadline = time.monotonic() + timeout_s
        wanted = set(nodes)
        last: object = None
        for node in sorted(wanted):
            address = f"{HOST}:{self.ports[node - 1]}"
            admin = AdminClient(admin_settings({"bootstrap.servers": address, "log_level": 0}))
            while True:
                process = self.processes.get(node)
                if process is None or process.poll() is not None:
                    raise KafkaError(
                        f"Kafka node {node} exited with status "
                        f"{None if process is None else process.returncode} as it started "
                        f"(its log: {self.node_folder(node) / 'server.log'})"
                    )
                try:
                    metadata = admin.list_topics(timeout=1)
                    if node in metadata.brokers and len(metadata.brokers) >= len(wanted):
                        break
                except Exception as exc:
                    last = exc
                if time.monotonic() > deadline:
                    raise KafkaError(
                        f"Kafka node {node} at {address} did not answer within "
                        f"{timeout_s:.0f} s: {last}"
                    )
                time.sleep(0.1)

    def kill(self, node: int = 1) -> None:
        """SIGKILL node ``node``: a broker that crashed, leaving its folder as it was."""
        process = self.processes.pop(node, None)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()

    def stop(self) -> None:
        """Kill every node at once (nothing of a development broker is kept) and remove the
        folder this cluster made."""
        for node in list(self.processes):
            self.kill(node)
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    # -- configuration ------------------------------------------------------------------------

    def _server_properties(self, node: int) -> str:
        replicas = min(3, self.nodes)
        voters = ",".join(
            f"{n}@{HOST}:{self.controller_ports[n - 1]}" for n in range(1, self.nodes + 1)
        )
        listeners = [
            f"PLAINTEXT://{HOST}:{self.ports[node - 1]}",
            f"CONTROLLER://{HOST}:{self.controller_ports[node - 1]}",
        ]
        advertised = [f"PLAINTEXT://{HOST}:{self.ports[node - 1]}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        extra: dict[str, str] = {}
        for listener in self.listeners:
            address = f"{listener.name}://{HOST}:{self.listener_ports[listener.name][node - 1]}"
            listeners.append(address)
            advertised.append(address)
            protocols.append(f"{listener.name}:{listener.protocol}")
            for key, value in listener.properties.items():
                extra[f"listener.name.{listener.name.lower()}.{key}"] = value
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(node),
            "controller.quorum.voters": voters,
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(protocols),
            "log.dirs": str(self.node_folder(node) / "data"),
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(min(2, replicas)),
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.cleaner.backoff.ms": "1000",
            "log.retention.check.interval.ms": "2000",
            **extra,
            **self.properties,
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _log4j(self, node: int) -> str:
        log = self.node_folder(node) / "server.log"
        return (
            "status = warn\n"
            "appender.file.type = File\n"
            "appender.file.name = file\n"
            f"appender.file.fileName = {log}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.file.ref = file\n"
            # The controller's and the state change log's chatter: every partition's every move.
            "logger.state.name = state.change.logger\n"
            "logger.state.level = WARN\n"
            "logger.request.name = kafka.request.logger\n"
            "logger.request.level = WARN\n"
        )


def main(argv: list[str] | None = None) -> int:
    """``python -m kafka_delta_dev.kafka_cluster resolve``: fetch the broker's jars (once per
    version; tried again after a failure) and print their folder; ``folder``: the folder, or
    exit 1 and why there is none."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "folder"
    if command not in ("resolve", "folder"):
        print("usage: python -m kafka_delta_dev.kafka_cluster [resolve|folder]", file=sys.stderr)
        return 2
    found = maven.resolve(jar_set(), retry=True) if command == "resolve" else jars(resolve=False)
    if found.folder is None:
        print(f"Apache Kafka's jars: none ({found.reason})", file=sys.stderr)
        return 1
    print(
        f"Apache Kafka {kafka_version()}: {len(found.jars)} jars in {found.folder}", file=sys.stderr
    )
    print(found.folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
