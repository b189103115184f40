"""What each confluent-kafka client of the pipeline is given, and how librdkafka's logs read.

``kafka.client`` holds the user's librdkafka settings for every client: the embedded source's
consumers, the metadata client (an ``AdminClient``, which librdkafka builds on a producer
handle) and the commit-back consumer. librdkafka prints a ``CONFWARN`` line for every setting a
client does not use (``fetch.wait.max.ms is a consumer property and will be ignored by this
producer instance``), on every run. So each client takes only the settings of its kind: the
tables below are librdkafka's consumer-only (``C``) and producer-only (``P``) properties of
CONFIGURATION.md (librdkafka 2.x), global (``*``) ones go everywhere.

librdkafka also logs every failed connection attempt, per client and broker, each reconnect
backoff (100 ms growing to 10 s): an unreachable broker gave ~1,300 identical ``FAIL`` lines
in 44 s. Every client therefore logs through :func:`librdkafka_logger`, which lets each
distinct message through once per process; the calls that fail say what failed themselves.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

from kafka_delta.kafka.refusals import LOG_LINES

CONSUMER_ONLY = frozenset(
    {
        "auto.commit.interval.ms",
        "auto.offset.reset",
        "check.crcs",
        "consume.callback.max.messages",
        "coordinator.query.interval.ms",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "enable.partition.eof",
        "fetch.error.backoff.ms",
        "fetch.max.bytes",
        "fetch.message.max.bytes",
        "fetch.min.bytes",
        "fetch.queue.backoff.ms",
        "fetch.wait.max.ms",
        "group.id",
        "group.instance.id",
        "group.protocol",
        "group.protocol.type",
        "group.remote.assignor",
        "heartbeat.interval.ms",
        "isolation.level",
        "max.partition.fetch.bytes",
        "max.poll.interval.ms",
        "offset.store.method",
        "partition.assignment.strategy",
        "queued.max.messages.kbytes",
        "queued.min.messages",
        "session.timeout.ms",
    }
)

PRODUCER_ONLY = frozenset(
    {
        "acks",
        "batch.num.messages",
        "batch.size",
        "compression.codec",
        "compression.level",
        "compression.type",
        "delivery.report.only.error",
        "delivery.timeout.ms",
        "enable.gapless.guarantee",
        "enable.idempotence",
        "linger.ms",
        "message.send.max.retries",
        "message.timeout.ms",
        "partitioner",
        "queue.buffering.backpressure.threshold",
        "queue.buffering.max.kbytes",
        "queue.buffering.max.messages",
        "queue.buffering.max.ms",
        "request.required.acks",
        "request.timeout.ms",
        "retries",
        "sticky.partitioning.linger.ms",
        "transaction.timeout.ms",
        "transactional.id",
    }
)


def admin_settings(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Settings for an ``AdminClient`` (a producer handle): no consumer-only ones."""
    return {k: v for k, v in conf.items() if k not in CONSUMER_ONLY} | _logging()


def consumer_settings(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Settings for a ``Consumer``: no producer-only ones."""
    return {k: v for k, v in conf.items() if k not in PRODUCER_ONLY} | _logging()


# The file-valued settings of each client, and what each file is: librdkafka's (kafka.client)
# and the Java client's (kafka.jvm_client).
LIBRDKAFKA_FILES = {
    "ssl.ca.location": "the CA that signed the brokers' certificates (PEM)",
    "ssl.certificate.location": "the client's certificate (PEM)",
    "ssl.key.location": "the client's private key (PEM)",
    "ssl.keystore.location": "the client's PKCS#12 key store",
    "ssl.crl.location": "the CA's revocation list",
    "sasl.kerberos.keytab": "the client's Kerberos keytab",
}
JVM_FILES = {
    "ssl.truststore.location": "a trust store holding the CA that signed the brokers' certificates",
    "ssl.keystore.location": "the client's key store",
}


def missing_file(client: Mapping[str, Any], jvm_client: Mapping[str, Any]) -> str | None:
    """The sentence for the first file a client setting names that this machine does not have
    (or may not read), else None: librdkafka would fail to start a client with an OpenSSL
    error ("ssl.ca.location failed: ... BIO lib"), and the Java client inside Spark's query
    with a stack trace. A relative path of ``kafka.jvm_client`` is left alone: Spark's
    executors read it in their own working folder, where ``--files`` puts files."""
    import os

    checks = [("kafka.client", k, client.get(k), what) for k, what in LIBRDKAFKA_FILES.items()]
    checks += [
        ("kafka.jvm_client", k, jvm_client.get(k), what)
        for k, what in JVM_FILES.items()
        if os.path.isabs(str(jvm_client.get(k) or ""))
    ]
    for where, key, value, what in checks:
        if not value or (key == "ssl.ca.location" and str(value) == "probe"):
            continue
        path = os.path.expanduser(str(value))
        problem = (
            "does not exist on this machine"
            if not os.path.exists(path)
            else "cannot be read by this process"
            if not os.access(path, os.R_OK)
            else None
        )
        if problem is not None:
            return (
                f"{where}'s {key} is {value}, which {problem}: point it at {what}; nothing "
                "was read or written"
            )
    return None


def about_its_group_only(error: Any) -> bool:
    """Whether an error a consumer that reads by position (``assign``: never a member of its
    group, never committing) got concerns only its ``group.id``. librdkafka looks up the group
    coordinator of every consumer that has one (confluent-kafka requires a ``group.id``), and a
    principal without Describe on that group gets ``GROUP_AUTHORIZATION_FAILED`` as an error
    event: it says nothing of the records read, which Kafka authorizes by the topic's ACLs
    alone, so such a reader passes it over."""
    from confluent_kafka import KafkaError

    return bool(error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED)


def _logging() -> dict[str, Any]:
    return {"logger": librdkafka_logger()}


class OncePerMessage(logging.Filter):
    """Lets each distinct librdkafka message through once: the same failure repeated by every
    reconnect attempt says nothing new. Timings and counters do not make a message distinct."""

    # "(after 0ms in state CONNECT, 1 identical error(s) suppressed)": librdkafka's own
    # suppression count holds parentheses of its own.
    _VARYING = re.compile(r"\(after \d+ms in state \w+(?:[^()]|\([^)]*\))*\)|\d+ms|\d+/\d+")

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        # librdkafka's "[thrd:...]" names the internal thread, which differs per attempt.
        key = self._VARYING.sub("#", re.sub(r"\[thrd:[^\]]*\]", "", message))
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True


class RefusalsSaidElsewhere(logging.Filter):
    """Keeps librdkafka's lines about a refusal (a failed SASL login, a failed TLS handshake, a
    client certificate refused, a plaintext request to a TLS listener) out of a run's log: the
    call that fails says it in one sentence with the settings to check (:mod:`.refusals`), and
    a line above it would only say it again, in librdkafka's words. ``--log-level DEBUG`` shows
    them, as DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not LOG_LINES.search(record.getMessage()):
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


_logger_lock = threading.Lock()


def librdkafka_logger() -> logging.Logger:
    """The logger every client of the pipeline logs through (see the module docstring)."""
    logger = logging.getLogger(__name__)
    with _logger_lock:
        if not any(isinstance(f, OncePerMessage) for f in logger.filters):
            logger.addFilter(RefusalsSaidElsewhere())
            logger.addFilter(OncePerMessage())
    return logger
