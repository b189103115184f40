"""Kafka that answered and said no, told apart from Kafka that did not answer.

A client whose login the brokers refuse (a wrong password, an unknown user, a SASL mechanism the
listener does not take), whose TLS handshake fails (a certificate it does not trust, one that
names another host, a client certificate the listener refuses or misses) or that speaks
plaintext to a TLS listener sees its requests fail as if the brokers were down: librdkafka ends a
metadata request with "Local: Broker transport failure", and only its error events say what
happened. Waiting does not help there, and "check that the brokers are up" is not true: the
settings are wrong. So every metadata client of the pipeline (:class:`~.admin.KafkaAdmin`) keeps
librdkafka's error events (:class:`Refusals`), and a request that fails after one of them raises
:class:`KafkaRefusedError` with one sentence naming what was refused and the settings to check,
instead of :class:`~.admin.KafkaUnavailableError`. Where librdkafka's words fit several causes
(every rejected broker certificate is "certificate verify failed"; a TLS listener and a broker
that went away both close the connection), the listener is asked again
(:mod:`.tls_probe`) and the sentence names the cause it found.

A broker that lets the client in but not at a resource (ACLs) answers the request itself with
``TOPIC_AUTHORIZATION_FAILED`` or ``GROUP_AUTHORIZATION_FAILED``: :func:`not_authorized` says
which principal lacks which ACL on what. Spark's kafka source (the Java client) reports the same
refusals as Java exceptions: :mod:`.jvm_refusals`.
"""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError

from kafka_delta.kafka import tls_probe


class KafkaRefusedError(RuntimeError):
    """Kafka answered and refused the client (its login, its TLS handshake, its protocol, an ACL
    it lacks), or the client cannot start with its settings: the settings must change, so a run
    stops at once with this sentence instead of waiting (exit code 2). Found by this class's
    name in the text Spark hands back: keep the name."""


# librdkafka's own decoration around a broker's reason: "sasl_ssl://127.0.0.1:1/bootstrap: "
# before, "(after 3ms in state AUTH_REQ)" (and "N identical error(s) suppressed") after.
_BROKER_PREFIX = re.compile(r"^(?:(?P<scheme>\w+)://)?(?P<address>[^\s/]+:\d+)(?:/\S*)?: ")
_AFTER = re.compile(r"\s*\(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)")
_SASL_PREFIX = re.compile(r"^SASL authentication error: ")
# A connection closed while the client waited for the answer to its first request (the
# ApiVersion query): what a TLS listener does to a client that does not speak TLS (librdkafka
# sometimes says so itself: "might be caused by incorrect security.protocol configuration").
_FIRST_REQUEST_CLOSED = re.compile(
    r"in state APIVERSION_QUERY|incorrect security\.protocol configuration"
)
# TLS alerts a listener sends a client whose certificate it refuses, or that shows none where
# one is required (TLS 1.3 ends such a handshake after the client thinks it is done, so
# librdkafka reports the alert as a failed receive).
_CERTIFICATE_ALERT = re.compile(
    r"alert (?:bad certificate|certificate required|unknown ca|certificate unknown|"
    r"unsupported certificate|certificate expired|certificate revoked|access denied|"
    r"handshake failure)",
    re.IGNORECASE,
)
_VERIFY_FAILED = "certificate verify failed"
# A TLS client's handshake that failed, as a transport error: a listener that closed it (no TLS
# there: librdkafka asks "connecting to a PLAINTEXT broker listener?"), or its alert.
_TLS_FAILED = re.compile(rf"SSL handshake failed|{_CERTIFICATE_ALERT.pattern}", re.IGNORECASE)
# librdkafka's log lines of the refusals above, which the call that fails says in one sentence
# (kafka.clients.RefusalsSaidElsewhere keeps them out of a run's log but at DEBUG). A plaintext
# client's closed connection is one only where its broker's name has no TLS scheme.
LOG_LINES = re.compile(
    r"SASL authentication error|SSL handshake failed|certificate verify failed|"
    rf"incorrect security\.protocol configuration|{_CERTIFICATE_ALERT.pattern}|"
    r"\[thrd:(?:sasl_plaintext://)?[^:\]/]+:\d+/\w+\]: \S+: Disconnected: connection closed by "
    r"peer.*in state APIVERSION_QUERY",
    re.IGNORECASE,
)
# librdkafka's reason a client could not be made ("Failed to create consumer: ssl.ca.location
# failed: error:05880020:x509 certificate routines::BIO lib").
_CREATE_FAILED = re.compile(r"Failed to create \w+(?: \w+)?: (?P<reason>.*)")

_SASL_MECHANISMS_WITH_A_USERNAME = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# kafka.client's settings that name a client certificate or key.
_CLIENT_CERTIFICATE = (
    "ssl.certificate.location",
    "ssl.certificate.pem",
    "ssl.keystore.location",
    "ssl.key.location",
    "ssl.key.pem",
)


def _clean(text: str) -> str:
    return _AFTER.sub("", _BROKER_PREFIX.sub("", text.strip())).strip()


def _address(text: str, conf: Mapping[str, Any]) -> str:
    """The broker a librdkafka error event is about, else the first bootstrap address."""
    found = _BROKER_PREFIX.match(text.strip())
    if found is not None:
        return found.group("address")
    return str(conf.get("bootstrap.servers", "?")).split(",")[0].strip()


def protocol(conf: Mapping[str, Any]) -> str:
    return str(conf.get("security.protocol", "PLAINTEXT")).upper()


def principal(conf: Mapping[str, Any]) -> str | None:
    """The principal Kafka's default rules give the client of librdkafka settings ``conf``:
    ``User:<sasl.username>`` for a PLAIN or SCRAM login; None where the broker decides it from
    something the client cannot name (a certificate's subject, a token, Kerberos)."""
    if protocol(conf).startswith("SASL"):
        mechanism = str(conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "GSSAPI")))
        user = conf.get("sasl.username")
        if mechanism.upper() in _SASL_MECHANISMS_WITH_A_USERNAME and user:
            return f"User:{user}"
    return None


def _who(conf: Mapping[str, Any], client: str = "kafka.client") -> str:
    named = principal(conf)
    if named is not None:
        return named
    if protocol(conf) == "SSL":
        return f"the principal of {client}'s certificate"
    return f"{client}'s principal"


def not_authorized(
    servers: str,
    conf: Mapping[str, Any],
    action: str,
    resource: str,
    name: str,
    lacks: Sequence[str],
    why: str,
    *,
    client: str = "kafka.client",
    who: str | None = None,
) -> str:
    """The sentence of a request Kafka refused for an ACL: which principal may not ``action``
    (``describe``, ``read``) which ``resource`` (``topic``, ``group``, ``cluster``) ``name``,
    and the ACLs to grant (``lacks``: Kafka's operation names, ``Describe``, ``Read``), with the
    ``kafka-acls`` command that grants them where the principal is known; ``why``: Kafka's
    error."""
    who = who or _who(conf, client)
    target = "the cluster" if resource == "cluster" else f"{resource} {name!r}"
    command = ""
    if who.startswith("User:"):
        operations = " ".join(f"--operation {op}" for op in lacks)
        where = "--cluster" if resource == "cluster" else f"--{resource} {shlex.quote(name)}"
        command = f" (kafka-acls --add --allow-principal {shlex.quote(who)} {operations} {where})"
    return (
        f"Kafka at {servers} does not let {who} {action} {target} ({why}): grant {who} "
        f"{' and '.join(lacks)} on {target}{command}"
    )


def topic_not_authorized(
    servers: str,
    conf: Mapping[str, Any],
    topic: str,
    *,
    describe: bool = False,
    why: str = "TOPIC_AUTHORIZATION_FAILED",
) -> str:
    """A topic whose metadata Kafka refused (``describe``: the principal may not even see it,
    which Kafka also answers for a topic that does not exist), or whose records it refused."""
    if describe:
        return not_authorized(
            servers,
            conf,
            "describe",
            "topic",
            topic,
            ["Describe", "Read"],
            f"{why}, also Kafka's answer for a topic that does not exist to a principal without "
            "Describe on it",
        )
    return not_authorized(servers, conf, "read", "topic", topic, ["Read"], why)


def group_not_authorized(servers: str, conf: Mapping[str, Any], group: str) -> str:
    """The consumer group the commit-back writes and ``offsets show`` reads: monitoring only."""
    return not_authorized(
        servers, conf, "read", "group", group, ["Read"], "GROUP_AUTHORIZATION_FAILED"
    )


# What each file-valued librdkafka setting must be, for the sentence of one it cannot use.
_SETTING_HINTS = {
    "ssl.ca.location": "ssl.ca.location must be the PEM file of the CA that signed the brokers' "
    "certificates",
    "ssl.certificate.location": "ssl.certificate.location must be the client's certificate (PEM)",
    "ssl.key.location": "ssl.key.location must be the client's private key (PEM) and "
    "ssl.key.password the password that opens it",
    "ssl.key.pem": "ssl.key.pem must be the client's private key (PEM) and ssl.key.password the "
    "password that opens it",
    "ssl.keystore.location": "ssl.keystore.location must be the client's PKCS#12 key store and "
    "ssl.keystore.password the password that opens it",
}


def settings_refused(conf: Mapping[str, Any], text: str) -> str:
    """librdkafka could not make a client of ``conf`` (a CA or key file it cannot read, a key
    password that does not open the key): the sentence, with librdkafka's reason."""
    found = _CREATE_FAILED.search(text)
    reason = (found.group("reason") if found else text).strip()
    key = reason.split(" failed:")[0] if " failed:" in reason else ""
    hint = _SETTING_HINTS.get(key, "check the ssl.* and sasl.* settings")
    return f"librdkafka cannot use kafka.client's settings ({reason}): in kafka.client, {hint}"


class Refusals:
    """The error events of one librdkafka client (its ``error_cb``): keeps the last refusal,
    which :meth:`sentence` turns into the sentence of :class:`KafkaRefusedError`."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._conf = dict(conf)
        self._lock = threading.Lock()
        self._last: tuple[int, str] | None = None
        # The sentence of the last event told (its code and text less librdkafka's timings).
        self._said: tuple[tuple[int, str], str | None] | None = None

    def __call__(self, error: KafkaError) -> None:
        code = error.code()
        text = error.str() or ""
        tls = "SSL" in protocol(self._conf)
        refusal = (
            code in (KafkaError._AUTHENTICATION, KafkaError._SSL)
            or (code == KafkaError._TRANSPORT and _TLS_FAILED.search(text) is not None)
            # A plaintext client's connections closed at its first request: librdkafka says
            # it in a log line, and in an error event only that every broker is down.
            or (
                not tls
                and (
                    code == KafkaError._ALL_BROKERS_DOWN
                    or (code == KafkaError._TRANSPORT and _FIRST_REQUEST_CLOSED.search(text))
                )
            )
        )
        if refusal:
            with self._lock:
                self._last = (code, text)

    def clear(self) -> None:
        with self._lock:
            self._last = None

    def seen(self) -> bool:
        """Whether an error event that may be a refusal arrived since :meth:`clear`."""
        with self._lock:
            return self._last is not None

    def sentence(self) -> str | None:
        """What the brokers refused and what to check, or None when nothing was refused (a
        closed connection that the listener's probe does not explain)."""
        with self._lock:
            last = self._last
        if last is None:
            return None
        key = (last[0], _AFTER.sub("", last[1]))
        if self._said is not None and self._said[0] == key:
            return self._said[1]  # the probes ask the listener once per refusal
        said = self._sentence(*last)
        self._said = (key, said)
        return said

    def _sentence(self, code: int, text: str) -> str | None:
        conf = self._conf
        servers = conf.get("bootstrap.servers", "?")
        reason = _clean(text)
        address = _address(text, conf)
        if code == KafkaError._AUTHENTICATION:
            mechanism = str(conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "GSSAPI")))
            user = conf.get("sasl.username")
            who = f"the login of {user!r}" if user else "the login"
            return (
                f"Kafka at {servers} refused {who} ({mechanism}: {_SASL_PREFIX.sub('', reason)}): "
                "check sasl.username, sasl.password and sasl.mechanism in kafka.client (and "
                "sasl.jaas.config in kafka.jvm_client)"
            )
        if code == KafkaError._TRANSPORT and _CERTIFICATE_ALERT.search(reason):
            return self._certificate_refused(address, reason)
        if code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN) and "SSL" not in (
            protocol(conf)
        ):
            # Which listener speaks TLS: the event's broker, else each bootstrap address.
            addresses = (
                [address]
                if _BROKER_PREFIX.match(text.strip())
                else [a.strip() for a in str(servers).split(",") if a.strip()]
            )
            for candidate in addresses:
                if tls_probe.speaks_tls(candidate):
                    return (
                        f"Kafka at {candidate} speaks TLS, but kafka.client's security.protocol "
                        f"is {protocol(conf)}: set it to SSL or SASL_SSL, as the listener "
                        "expects (and the same in kafka.jvm_client)"
                    )
            return None  # brokers that closed the connection or are down: not a refusal
        if _VERIFY_FAILED in reason:
            return self._certificate_not_accepted(address, reason)
        if tls_probe.speaks_tls(address) is False:
            return (
                f"Kafka at {address} does not speak TLS, but kafka.client's security.protocol is "
                f"{protocol(conf)}: point kafka.bootstrap_servers at the brokers' TLS listener, "
                "or set security.protocol to what this listener expects (PLAINTEXT or "
                "SASL_PLAINTEXT; the same in kafka.jvm_client)"
            )
        return (
            f"the TLS handshake with Kafka at {address} failed ({reason}): check the ssl.* "
            f"settings of kafka.client (security.protocol {protocol(conf)})"
        )

    def _certificate_not_accepted(self, address: str, reason: str) -> str:
        verdict = tls_probe.verify_certificate(address, self._conf)
        host = tls_probe.split_address(address)[0]
        if verdict is not None and verdict.kind == "name":
            return (
                f"the certificate Kafka at {address} presented does not name {host} "
                f"({verdict.reason}): put in kafka.bootstrap_servers a host name the brokers' "
                f"certificates hold (as the brokers advertise themselves), or have the "
                f"certificates name {host}"
            )
        if verdict is not None and verdict.kind == "untrusted":
            return (
                f"the certificate Kafka at {address} presented is not signed by a CA "
                f"kafka.client trusts ({verdict.reason}): set ssl.ca.location in kafka.client "
                "(and ssl.truststore.location in kafka.jvm_client) to the CA that signed the "
                "brokers' certificates"
            )
        if verdict is not None and verdict.kind == "other":
            return (
                f"kafka.client did not accept the certificate Kafka at {address} presented "
                f"({verdict.reason}): the brokers' certificates must be renewed, or "
                "ssl.ca.location changed"
            )
        return (
            f"kafka.client did not accept the certificate Kafka at {address} presented "
            f"({reason.split(': broker certificate')[0]}): check that ssl.ca.location in "
            "kafka.client names the CA that signed the brokers' certificates and that "
            "kafka.bootstrap_servers names hosts those certificates hold"
        )

    def _certificate_refused(self, address: str, reason: str) -> str:
        alert = _CERTIFICATE_ALERT.search(reason)
        said = alert.group(0) if alert else reason
        if not any(self._conf.get(key) for key in _CLIENT_CERTIFICATE):
            return (
                f"Kafka at {address} requires a client certificate and kafka.client shows none "
                f"(TLS {said}): set ssl.certificate.location and ssl.key.location (or "
                "ssl.keystore.location) in kafka.client, and ssl.keystore.location in "
                "kafka.jvm_client, to a certificate signed by a CA the brokers trust"
            )
        return (
            f"Kafka at {address} refused the certificate kafka.client showed (TLS {said}): it "
            "must be signed by a CA the brokers trust (their ssl.truststore) and be valid; check "
            "ssl.certificate.location and ssl.key.location (or ssl.keystore.location) in "
            "kafka.client, and ssl.keystore.location in kafka.jvm_client"
        )
