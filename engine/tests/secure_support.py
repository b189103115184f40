"""Kafka as production runs it, for the secure-Kafka and ACL tests: one Apache Kafka broker on
127.0.0.1 whose listeners take TLS and SASL together, certificates made for the session
(:mod:`kafka_delta_dev.tls`, never kept), SCRAM users created at format time, and ACLs enforced
by KRaft's ``StandardAuthorizer``; and the client settings of each shape the pipeline meets, in
both clients' names, written as ``engine/docs/configuration.md`` ("Secure Kafka") shows them.

Listeners (beside the PLAINTEXT one every node has, whose ANONYMOUS principal is the tests' super
user: they create topics, produce and read back through it):

- ``SCRAM``: SASL_SSL with SCRAM-SHA-512 (MSK's and self-run clusters' shape); a client
  certificate is taken if shown (``ssl.client.auth=requested``), so one run can hold every kind
  of secret at once;
- ``PLAIN``: SASL_SSL with PLAIN, the user ``$ConnectionString`` whose password is an Event
  Hubs connection string (Confluent Cloud's shape too, with an API key and secret);
- ``MTLS``: SSL with a client certificate required (mutual TLS), its principal the
  certificate's common name.

Principals and their ACLs (topics and groups named ``secure-...``): ``alice``,
``$ConnectionString`` and the client certificate's read topics and commit to groups; ``bob``
reads topics but no group; ``dave`` may only describe topics; ``carol`` may do nothing.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from kafka_delta_dev.kafka_cluster import KafkaCluster, Listener
from kafka_delta_dev.orders import TRANSFORM as ORDERS
from kafka_delta_dev.tls import Certificates, make_certificates

PREFIX = "secure-"
SCRAM_USERS = ("alice", "bob", "carol", "dave")
# Event Hubs' Kafka endpoint takes this literal username, and the connection string as password.
CONNECTION_STRING_USER = "$ConnectionString"
CLIENT_NAME = "secure-client"


@dataclass
class SecureKafka:
    cluster: KafkaCluster
    tls: Certificates
    # SCRAM users' passwords, and the PLAIN user's (an Event Hubs connection string).
    passwords: dict[str, str] = field(default_factory=dict)
    connection_string: str = ""

    @property
    def plaintext(self) -> str:
        """The PLAINTEXT listener: the tests' own admin, producer and reader (a super user)."""
        return self.cluster.bootstrap_servers

    def address(self, listener: str) -> str:
        return self.cluster.address(listener)

    def secrets(self) -> dict[str, str]:
        """Every secret of the set-up, by what it is: what no output may hold."""
        return {
            **{f"SCRAM password of {u}": p for u, p in self.passwords.items()},
            "PLAIN password (connection string)": self.connection_string,
            "key password": self.tls.key_password,
            "trust store password": self.tls.truststore_password,
        }


def _password(name: str) -> str:
    return f"{name}-{secrets.token_urlsafe(12)}"


def start_secure_kafka(folder: Path) -> SecureKafka:
    """The broker of this module's docstring, started, its ACLs granted."""
    tls = make_certificates(folder / "tls", client_name=CLIENT_NAME)
    passwords = {user: _password(user) for user in SCRAM_USERS}
    # An Event Hubs connection string: '=', ';', '/' and a '$' the config must take literally.
    connection_string = (
        "Endpoint=sb://kafka-delta.servicebus.invalid/;SharedAccessKeyName=RootManage$"
        f"SharedAccessKey;SharedAccessKey={secrets.token_urlsafe(24)}="
    )
    plain_users = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'user_{CONNECTION_STRING_USER}="{connection_string}";'
    )
    cluster = KafkaCluster(
        folder / "kafka",
        listeners=[
            Listener(
                "SCRAM",
                "SASL_SSL",
                {
                    "sasl.enabled.mechanisms": "SCRAM-SHA-512",
                    "scram-sha-512.sasl.jaas.config": (
                        "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                    ),
                    **tls.listener_properties(client_auth="requested"),
                },
            ),
            Listener(
                "PLAIN",
                "SASL_SSL",
                {
                    "sasl.enabled.mechanisms": "PLAIN",
                    "plain.sasl.jaas.config": plain_users,
                    **tls.listener_properties(),
                },
            ),
            Listener("MTLS", "SSL", tls.listener_properties(client_auth="required")),
        ],
        properties={
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            # The PLAINTEXT listener's principal: the tests' admin, the brokers and controller.
            "super.users": "User:ANONYMOUS",
        },
        scram_users=passwords,
        scram_mechanism="SCRAM-SHA-512",
    ).start()
    try:
        _grant(cluster.bootstrap_servers)
    except BaseException:
        cluster.stop()
        raise
    return SecureKafka(cluster, tls, passwords, connection_string)


def _grant(admin_address: str) -> None:
    def allow(principal: str, kind: ResourceType, operation: AclOperation) -> AclBinding:
        return AclBinding(
            kind,
            PREFIX,
            ResourcePatternType.PREFIXED,
            principal,
            "*",
            operation,
            AclPermissionType.ALLOW,
        )

    acls = []
    for reader in ("User:alice", f"User:{CONNECTION_STRING_USER}", f"User:{CLIENT_NAME}"):
        acls += [
            allow(reader, ResourceType.TOPIC, AclOperation.READ),
            allow(reader, ResourceType.TOPIC, AclOperation.DESCRIBE),
            allow(reader, ResourceType.GROUP, AclOperation.READ),
        ]
    acls += [
        allow("User:bob", ResourceType.TOPIC, AclOperation.READ),
        allow("User:bob", ResourceType.TOPIC, AclOperation.DESCRIBE),
        allow("User:dave", ResourceType.TOPIC, AclOperation.DESCRIBE),
    ]
    admin = AdminClient({"bootstrap.servers": admin_address})
    for future in admin.create_acls(acls).values():
        future.result()


def new_name() -> str:
    """A topic or group name the readers' ACLs cover."""
    return f"{PREFIX}{uuid.uuid4().hex[:10]}"


# -- the shapes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One way production Kafka is secured: the listener, both clients' settings with the
    secrets as ``${NAME}`` references (never in the file), and the environment holding them."""

    name: str
    listener: str
    client: dict[str, str]
    jvm_client: dict[str, str]
    environ: dict[str, str]


def scram(kafka: SecureKafka, user: str = "alice", password: str | None = None) -> Shape:
    """SASL_SSL with SCRAM-SHA-512: MSK, self-run clusters."""
    return Shape(
        "scram",
        "SCRAM",
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "${KAFKA_USERNAME}",
            "sasl.password": "${KAFKA_PASSWORD}",
            "ssl.ca.location": str(kafka.tls.ca),
        },
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                'username="${KAFKA_USERNAME}" password="${KAFKA_PASSWORD}";'
            ),
            "ssl.truststore.location": str(kafka.tls.client_truststore),
            "ssl.truststore.type": "PKCS12",
            "ssl.truststore.password": "${KAFKA_TRUSTSTORE_PASSWORD}",
        },
        {
            "KAFKA_USERNAME": user,
            "KAFKA_PASSWORD": kafka.passwords[user] if password is None else password,
            "KAFKA_TRUSTSTORE_PASSWORD": kafka.tls.truststore_password,
        },
    )


def event_hubs(kafka: SecureKafka) -> Shape:
    """SASL_SSL with PLAIN, as Event Hubs takes it: the literal username ``$ConnectionString``
    (no ``{...}``: not a reference) and the connection string as the password. Confluent Cloud
    is the same with an API key and secret."""
    return Shape(
        "event-hubs",
        "PLAIN",
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "$ConnectionString",
            "sasl.password": "${EVENTHUBS_CONNECTION_STRING}",
            "ssl.ca.location": str(kafka.tls.ca),
        },
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                'username="$ConnectionString" password="${EVENTHUBS_CONNECTION_STRING}";'
            ),
            "ssl.truststore.location": str(kafka.tls.client_truststore),
            "ssl.truststore.type": "PKCS12",
            "ssl.truststore.password": "${KAFKA_TRUSTSTORE_PASSWORD}",
        },
        {
            "EVENTHUBS_CONNECTION_STRING": kafka.connection_string,
            "KAFKA_TRUSTSTORE_PASSWORD": kafka.tls.truststore_password,
        },
    )


def mutual_tls(kafka: SecureKafka) -> Shape:
    """SSL with a client certificate: the listener requires one signed by its CA."""
    return Shape(
        "mtls",
        "MTLS",
        {
            "security.protocol": "SSL",
            "ssl.ca.location": str(kafka.tls.ca),
            "ssl.certificate.location": str(kafka.tls.client_certificate),
            "ssl.key.location": str(kafka.tls.client_key),
            "ssl.key.password": "${KAFKA_KEY_PASSWORD}",
        },
        {
            "security.protocol": "SSL",
            "ssl.truststore.location": str(kafka.tls.client_truststore),
            "ssl.truststore.type": "PKCS12",
            "ssl.truststore.password": "${KAFKA_TRUSTSTORE_PASSWORD}",
            "ssl.keystore.location": str(kafka.tls.client_keystore),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.password": "${KAFKA_KEY_PASSWORD}",
            "ssl.key.password": "${KAFKA_KEY_PASSWORD}",
        },
        {
            "KAFKA_KEY_PASSWORD": kafka.tls.key_password,
            "KAFKA_TRUSTSTORE_PASSWORD": kafka.tls.truststore_password,
        },
    )


SHAPES = {"scram": scram, "event-hubs": event_hubs, "mtls": mutual_tls}


def config_document(
    folder: Path,
    shape: Shape,
    bootstrap: str,
    topics: list[str],
    group: str,
    engine: dict[str, str],
    **extra: Any,
) -> dict[str, Any]:
    """A config reading ``topics`` through ``shape``'s settings, its table, dead letters and
    checkpoint under ``folder``; ``extra``: more top-level keys (``progress``, ``spark``)."""
    return {
        "pipeline_id": "secure-pipeline",
        "transform": ORDERS,
        "engine": engine,
        "kafka": {
            "bootstrap_servers": bootstrap,
            "topics": topics,
            "consumer_group": group,
            "client": {"fetch.wait.max.ms": 100, **shape.client},
            "jvm_client": dict(shape.jvm_client),
        },
        "delta": {"table": str(folder / "table")},
        "dead_letters": {"enabled": True, "table": str(folder / "dead_letters")},
        "checkpoint": str(folder / "checkpoint"),
        "commit_back": {"timeout_seconds": 10},
        **extra,
    }


def write_config(folder: Path, document: dict[str, Any], name: str = "secure") -> Path:
    """``document`` as ``folder/conf/<name>.yaml``: secrets stay ``${NAME}`` in the file."""
    path = folder / "conf" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


# The events topic_and_config's topic holds unless told otherwise.
RECORDS = 120


def topic_and_config(
    kafka: SecureKafka,
    shape: Shape,
    folder: Path,
    engine: dict[str, str],
    *,
    records: int = RECORDS,
    bootstrap: str | None = None,
    kafka_keys: dict[str, Any] | None = None,
    **extra: Any,
) -> tuple[Path, Any]:
    """A topic of two partitions holding ``records`` events, and a config reading it through
    ``shape`` (written with its ``${NAME}`` references, loaded with its environment);
    ``kafka_keys`` join its ``kafka:`` section, ``extra`` its top level."""
    from kafka_delta.config import load_config
    from kafka_delta_dev.produce import ensure_topics, produce_events

    topic = new_name()
    ensure_topics(kafka.plaintext, [topic], 2)
    if records:
        produce_events(kafka.plaintext, [topic], records)
    document = config_document(
        folder,
        shape,
        bootstrap or kafka.address(shape.listener),
        [topic],
        new_name(),
        engine,
        **extra,
    )
    document["kafka"].update(kafka_keys or {})
    path = write_config(folder, document)
    return path, load_config(path, environ=shape.environ)
