"""Spark's kafka source refused by Kafka, told in one sentence, as :mod:`.refusals` tells
librdkafka's refusals.

The cluster engine reads through the Java Kafka client, with ``kafka.jvm_client``'s settings;
the pipeline's own calls (metadata, the commit-back) go through librdkafka with
``kafka.client``'s, which the start-up checks. Where only the Java client's settings are wrong
(another password in ``sasl.jaas.config``, a trust store that does not hold the brokers' CA, a
principal without the topic's ACLs), the query fails with the Java client's exception inside
Spark's error text: ``SaslAuthenticationException``, ``SslAuthenticationException`` (the
reason in its causes: ``PKIX path building failed``, ``No subject alternative names``, a
``bad_certificate`` alert), ``TopicAuthorizationException``, ``GroupAuthorizationException``,
or a ``KafkaException`` that could not load a key store. :func:`jvm_refused` reads them (the
message and the JVM stack trace Spark keeps with it, whose ``Caused by:`` lines hold the
reason) and says what was refused and which of ``kafka.jvm_client``'s settings to check. The
run stops on it (exit 2) and never waits it out as an outage: Kafka answered.

Databricks shades the Kafka classes (``kafkashaded.org.apache.kafka...``): the names are
matched with any package prefix.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kafka_delta.decoding.failures import reported
from kafka_delta.kafka.refusals import KafkaRefusedError, not_authorized

if TYPE_CHECKING:
    from kafka_delta.config import KafkaConfig

_ERROR = re.compile(
    r"(?:[\w$]+\.)*org\.apache\.kafka\.common\.errors\."
    r"(?P<kind>SaslAuthentication|SslAuthentication|TopicAuthorization|GroupAuthorization|"
    r"ClusterAuthorization)Exception(?::[ \t]*(?P<message>[^\n]*?))?(?: SQLSTATE: \w+)?[ \t]*$",
    re.MULTILINE,
)
_STORE = re.compile(r"Failed to load SSL keystore (?P<path>\S+) of type (?P<type>\S+)")
_STORE_WHY = re.compile(
    r"(?:java\.io\.IOException|java\.nio\.file\.NoSuchFileException|"
    r"java\.security\.\w+Exception): (?P<why>[^\n]+)"
)
_JAAS = re.compile(r"(?:JAAS|jaas)[^\n]*")
_USERNAME = re.compile(r"""\busername\s*=\s*(?:"(?P<quoted>[^"]*)"|(?P<bare>[^\s;"]+))""")
# The reasons of a failed TLS handshake, in the causes of SslAuthenticationException.
_UNTRUSTED = re.compile(r"PKIX path building failed|unable to find valid certification path")
_NAME = re.compile(r"No subject alternative (?:DNS )?names? matching[^\n]*|No name matching[^\n]*")
_ALERT = re.compile(
    r"Received fatal alert: (?P<alert>bad_certificate|certificate_required|unknown_ca|"
    r"certificate_unknown|handshake_failure|access_denied)"
)
_TOPICS = re.compile(r"Not authorized to access topics: \[(?P<topics>[^\]]*)\]")
_GROUP = re.compile(r"Not authorized to access group: (?P<group>\S+)")


def failure_text(exc: BaseException) -> str:
    """``exc``'s text with the JVM stack trace Spark keeps beside it (classic sessions and
    Spark Connect alike hold it as ``_stackTrace``; its ``Caused by:`` lines hold the Java
    client's reason), and the same of the exceptions it was raised from."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(str(current))
        trace = getattr(current, "_stackTrace", None)
        if trace:
            parts.append(str(trace))
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


def jvm_principal(kafka: KafkaConfig) -> str:
    """Who the Java client logs in as: ``User:<username>`` of ``sasl.jaas.config``'s PLAIN or
    SCRAM login, else how the broker will name it."""
    jvm = kafka.jvm_client
    protocol = str(jvm.get("security.protocol", "PLAINTEXT")).upper()
    mechanism = str(jvm.get("sasl.mechanism", "GSSAPI")).upper()
    if protocol.startswith("SASL") and mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        found = _USERNAME.search(str(jvm.get("sasl.jaas.config", "")))
        if found is not None:
            quoted = found.group("quoted")
            return f"User:{quoted if quoted is not None else found.group('bare')}"
    if protocol == "SSL":
        return "the principal of kafka.jvm_client's certificate"
    return "kafka.jvm_client's principal"


def refused(exc: BaseException, kafka: KafkaConfig) -> str | None:
    """The sentence of a refusal ``exc`` is or reports: a :class:`KafkaRefusedError` of the
    engine's (raised on the driver, or in a read task and found in Spark's text), or the Java
    client's (:func:`jvm_refused`); None for anything else."""
    return reported(exc, KafkaRefusedError.__name__) or jvm_refused(exc, kafka)


def jvm_refused(exc: BaseException, kafka: KafkaConfig) -> str | None:
    """The sentence of a refusal of Spark's kafka source that ``exc`` reports, or None."""
    text = failure_text(exc)
    servers = kafka.bootstrap_servers
    found = _ERROR.search(text)
    if found is not None:
        kind, message = found.group("kind"), (found.group("message") or "").strip()
        if kind == "SaslAuthentication":
            principal = jvm_principal(kafka)
            who = (
                f"the login of {principal.removeprefix('User:')!r}"
                if principal.startswith("User:")
                else "the login"
            )
            return (
                f"Kafka at {servers} refused {who} of Spark's kafka source "
                f"({kafka.jvm_client.get('sasl.mechanism', 'GSSAPI')}: {message}): check "
                "sasl.jaas.config and sasl.mechanism in kafka.jvm_client"
            )
        if kind == "SslAuthentication":
            return _tls_refused(text, servers, message)
        return _not_authorized(kind, text, message, kafka)
    store = _STORE.search(text)
    if store is not None:
        path = store.group("path")
        key = next(
            (k for k, v in kafka.jvm_client.items() if k.endswith(".location") and str(v) == path),
            "ssl.truststore.location or ssl.keystore.location",
        )
        why = _STORE_WHY.search(text[store.end() :])
        stem = key.rsplit(".", 1)[0]
        return (
            f"Spark's kafka source cannot load the {store.group('type')} store {path} of "
            f"kafka.jvm_client's {key}{f' ({why.group(1).strip()})' if why else ''}: check "
            f"{key}, {stem}.password and {stem}.type in kafka.jvm_client"
        )
    return None


def _tls_refused(text: str, servers: str, message: str) -> str:
    name = _NAME.search(text)
    if name is not None:
        return (
            f"the certificate Kafka at {servers} presented does not name the host Spark's kafka "
            f"source connected to ({name.group(0).strip()}): put in kafka.bootstrap_servers a "
            "host name the brokers' certificates hold, or have the certificates name it"
        )
    if _UNTRUSTED.search(text):
        return (
            f"the certificate Kafka at {servers} presented is not signed by a CA in "
            "kafka.jvm_client's trust store (PKIX path building failed): set "
            "ssl.truststore.location (with ssl.truststore.password and ssl.truststore.type) in "
            "kafka.jvm_client to a store holding the CA that signed the brokers' certificates"
        )
    alert = _ALERT.search(text)
    if alert is not None:
        return (
            f"Kafka at {servers} refused the certificate Spark's kafka source showed, or its "
            f"lack of one (TLS alert {alert.group('alert')}): set ssl.keystore.location (with "
            "ssl.keystore.password and ssl.key.password) in kafka.jvm_client to a certificate "
            "signed by a CA the brokers trust"
        )
    return (
        f"the TLS handshake of Spark's kafka source with Kafka at {servers} failed "
        f"({message or 'SslAuthenticationException'}): check the ssl.* settings of "
        "kafka.jvm_client"
    )


def _not_authorized(kind: str, text: str, message: str, kafka: KafkaConfig) -> str:
    servers, who = kafka.bootstrap_servers, jvm_principal(kafka)
    why = f"{kind}Exception: {message}" if message else f"{kind}Exception"
    if kind == "TopicAuthorization":
        named = _TOPICS.search(text)
        topics = (
            [t.strip() for t in named.group("topics").split(",") if t.strip()]
            if named
            else list(kafka.topics)
        )
        return not_authorized(
            servers,
            kafka.jvm_client,
            "read",
            "topic" if len(topics) == 1 else "topics",
            ", ".join(topics),
            ["Describe", "Read"],
            why,
            who=who,
        )
    if kind == "GroupAuthorization":
        group = _GROUP.search(text)
        return not_authorized(
            servers,
            kafka.jvm_client,
            "read",
            "group",
            group.group("group") if group else "?",
            ["Read"],
            why,
            who=who,
        )
    return (
        f"Kafka at {servers} refused Spark's kafka source an action on the cluster ({why}): "
        f"grant {who} the cluster ACL it names"
    )
