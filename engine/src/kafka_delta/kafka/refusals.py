"""Kafka that answered and said no, told apart from Kafka that did not answer.

A client whose login the brokers refuse (a wrong password, an unknown user, a SASL mechanism the
listener does not take), whose TLS handshake fails (a certificate it does not trust, one that
names another host) or that speaks plaintext to a TLS listener sees its requests fail as if the
brokers were down: librdkafka ends a metadata request with "Local: Broker transport failure",
and only its error events say what happened. Waiting does not help there, and "check that the
brokers are up" is not true: the settings are wrong. So every metadata client of the pipeline
(:class:`~.admin.KafkaAdmin`) keeps librdkafka's error events (:class:`Refusals`), and a request
that fails after one of them raises :class:`KafkaRefusedError` with one sentence naming what
was refused and the settings to check, instead of :class:`~.admin.KafkaUnavailableError`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError


class KafkaRefusedError(RuntimeError):
    """Kafka answered and refused the client (its login, its TLS handshake, its protocol): the
    settings must change, so a run stops at once with this sentence instead of waiting (exit
    code 2). Found by this class's name in the text Spark hands back: keep the name."""


# librdkafka's own decoration around a broker's reason: "sasl_ssl://127.0.0.1:1/bootstrap: "
# before, "(after 3ms in state AUTH_REQ)" (and "N identical error(s) suppressed") after.
_BROKER_PREFIX = re.compile(r"^\S+://\S+?(?:/\S+)?: ")
_AFTER = re.compile(r"\s*\(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)")
_SASL_PREFIX = re.compile(r"^SASL authentication error: ")
# What librdkafka says when a plaintext client's first request meets a TLS listener (the
# listener closes the connection at the first bytes it cannot read as a TLS handshake).
_PLAINTEXT_TO_TLS = "might be caused by incorrect security.protocol configuration"
_HOSTNAME = re.compile(r"hostname mismatch|IP address mismatch|does not match", re.IGNORECASE)


def _clean(text: str) -> str:
    return _AFTER.sub("", _BROKER_PREFIX.sub("", text.strip())).strip()


class Refusals:
    """The error events of one librdkafka client (its ``error_cb``): keeps the last refusal,
    which :meth:`sentence` turns into the sentence of :class:`KafkaRefusedError`."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._conf = dict(conf)
        self._lock = threading.Lock()
        self._last: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        code = error.code()
        text = error.str() or ""
        refusal = code in (KafkaError._AUTHENTICATION, KafkaError._SSL) or (
            code == KafkaError._TRANSPORT and _PLAINTEXT_TO_TLS in text
        )
        if refusal:
            with self._lock:
                self._last = error

    def clear(self) -> None:
        with self._lock:
            self._last = None

    def sentence(self) -> str | None:
        """What the brokers refused and what to check, or None when nothing was refused."""
        with self._lock:
            error = self._last
        if error is None:
            return None
        servers = self._conf.get("bootstrap.servers", "?")
        reason = _clean(error.str() or "")
        protocol = str(self._conf.get("security.protocol", "PLAINTEXT")).upper()
        if error.code() == KafkaError._AUTHENTICATION:
            mechanism = str(
                self._conf.get("sasl.mechanism", self._conf.get("sasl.mechanisms", "GSSAPI"))
            )
            user = self._conf.get("sasl.username")
            who = f"the login of {user!r}" if user else "the login"
            return (
                f"Kafka at {servers} refused {who} ({mechanism}: {_SASL_PREFIX.sub('', reason)}): "
                "check sasl.username, sasl.password and sasl.mechanism in kafka.client (and "
                "sasl.jaas.config in kafka.jvm_client)"
            )
        if error.code() == KafkaError._SSL:
            if _HOSTNAME.search(reason):
                return (
                    f"the certificate Kafka at {servers} presented does not name the host the "
                    f"client connected to ({reason}): put a name the brokers' certificates hold "
                    "in kafka.bootstrap_servers, or have the certificates name that host"
                )
            if "certificate verify failed" in reason:
                return (
                    f"the certificate Kafka at {servers} presented is not signed by a CA this "
                    f"client trusts ({reason.split(': broker certificate')[0]}): set "
                    "ssl.ca.location in kafka.client (and ssl.truststore.location in "
                    "kafka.jvm_client) to the CA that signed the brokers' certificates"
                )
            return (
                f"the TLS handshake with Kafka at {servers} failed ({reason}): check the ssl.* "
                f"settings of kafka.client (security.protocol {protocol})"
            )
        return (
            f"Kafka at {servers} closed the connection at the client's first request, as a TLS "
            f"listener does to a client that does not speak TLS: kafka.client's "
            f"security.protocol is {protocol}; set it to SSL or SASL_SSL (and the same in "
            "kafka.jvm_client) if the listener takes TLS"
        )
