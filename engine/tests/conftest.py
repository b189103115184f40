"""Fixtures of the engine's own suite, on top of the project plugin's
(:mod:`kafka_delta_dev.pytest_plugin`: ``spark``, ``kafka_bootstrap``, ``new_topics``,
``make_config``, ``schema_registry``, ``object_store``): engines by name, the sink parameter,
a TCP proxy that plays an unreachable broker, and configs that read the sample order events."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kafka_delta.config import PipelineConfig
from kafka_delta_dev.orders import TRANSFORM as ORDERS

# Spark's kafka source as the tests stand it in where its jars cannot be had.
STANDIN = "kafka_delta_dev.spark_kafka_standin:SparkKafkaStandIn"


@pytest.fixture
def make_config(make_config) -> Callable[..., PipelineConfig]:
    """The plugin's ``make_config``, reading the sample order events (kafka_delta_dev.orders)
    unless a test names another transform."""

    def make(*args, transform: str | None = ORDERS, **kwargs) -> PipelineConfig:
        return make_config(*args, transform=transform, **kwargs)

    return make


def engine_config(name: str) -> dict[str, str]:
    """``engine:`` of a config for a parametrized engine id (a preset, or source+sink;
    ``standin``: the stand-in for Spark's kafka source, kafka_delta_dev.spark_kafka_standin)."""
    from kafka_delta.config import ENGINE_PRESETS

    if name in ENGINE_PRESETS:
        return dict(ENGINE_PRESETS[name])
    source, sink = name.split("+")
    return {"source": STANDIN if source == "standin" else source, "sink": sink}


@pytest.fixture(params=["embedded", "cluster"])
def engine(request, spark) -> dict[str, str]:
    """Each engine that reads Kafka itself: the embedded source (librdkafka) and Spark's kafka
    source (the Java client), each with its own sink; skipped where the session lacks the
    cluster engine's jars. (test_engine_contract.py has an engine fixture of its own.)"""
    chosen = engine_config(request.param)
    skip_without_connectors(spark, chosen)
    return chosen


def skip_without_connectors(spark, engine: dict[str, str]) -> None:
    """Skip (with the reason the suite reports) when the session lacks the engine's jars."""
    from kafka_delta.runtime.connectors import missing_connectors, required_connectors
    from kafka_delta_dev.pytest_plugin import connector_skip_reason

    missing = missing_connectors(spark, required_connectors(engine["source"], engine["sink"]))
    if missing:
        pytest.skip(connector_skip_reason(missing))


@pytest.fixture(params=["delta_rs", "delta_spark"])
def sink_engine(request, spark) -> dict[str, str]:
    """The embedded source with each sink; skipped (with its reason) without delta-spark."""
    engine = {"source": "embedded", "sink": request.param}
    skip_without_connectors(spark, engine)
    return engine


class TcpProxy:
    """A loopback TCP forwarder that can be down (connections refused) or up: stands in for
    an unreachable broker or group coordinator."""

    def __init__(self, target: str) -> None:
        import socket

        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._server: object | None = None
        self._sockets: list[object] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        import socket
        import threading

        server = socket.create_server(("127.0.0.1", self.port))
        self._server = server

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.close()
                    except OSError:
                        pass

        def accept() -> None:
            while True:
                try:
                    client, _ = server.accept()
                except OSError:
                    return
                upstream = socket.create_connection(self.target)
                self._sockets += [client, upstream]
                threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
                threading.Thread(target=pump, args=(upstream, client), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()

    def stop(self) -> None:
        for sock in [self._server, *self._sockets]:
            if sock is not None:
                try:
                    sock.close()  # type: ignore[attr-defined]
                except OSError:
                    pass
        self._server, self._sockets = None, []


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory):
    """Apache Kafka with TLS, SASL and ACLs on 127.0.0.1, its certificates made for the session
    (secure_support.py), for the secure-Kafka and ACL tests; stopped by its pid at the end."""
    from kafka_delta_dev.kafka_cluster import KafkaError
    from kafka_delta_dev.tls import CertificateError
    from secure_support import start_secure_kafka

    try:
        kafka = start_secure_kafka(tmp_path_factory.mktemp("secure-kafka"))
    except (KafkaError, CertificateError) as exc:
        pytest.skip(f"no secured Apache Kafka: {exc}")
    try:
        yield kafka
    finally:
        kafka.cluster.stop()


@pytest.fixture
def tcp_proxy(kafka_bootstrap: str) -> Iterator[TcpProxy]:
    proxy = TcpProxy(kafka_bootstrap.split(",")[0])
    yield proxy
    proxy.stop()
