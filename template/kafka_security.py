"""The Kafka secrets of a project, by the security it was generated for (cookiecutter's
``kafka_security``): a Jinja extension cookiecutter loads through ``_extensions``, so that one
table names them for conf/databricks.yaml (its ``${NAME}`` references), databricks.yml (the
environment variables each job gets from the secret scope) and the project's config test.

A module of its own, not part of ``local_extensions`` (see ``engine_extension``'s docstring:
``cruft update`` keeps the first ``local_extensions`` it imported).
"""

from __future__ import annotations

from jinja2 import Environment
from jinja2.ext import Extension

_SASL = (
    ("KAFKA_SASL_USERNAME", "kafka-sasl-username"),
    ("KAFKA_SASL_PASSWORD", "kafka-sasl-password"),
)
# Each answer's secrets: (the environment variable the config reads, its key in the scope).
SECRETS: dict[str, tuple[tuple[str, str], ...]] = {
    "none": (),
    "sasl_ssl_scram": _SASL,
    "sasl_ssl_plain": _SASL,
    "mtls": (("KAFKA_KEY_PASSWORD", "kafka-key-password"),),
}


def kafka_secrets(security: str) -> tuple[tuple[str, str], ...]:
    return SECRETS.get(security, ())


def secret_reference(scope: str, key: str) -> str:
    """Databricks' reference to a secret (``{{secrets/<scope>/<key>}}``), which a job resolves
    when it starts: written by a function, since the template's own Jinja reads ``{{``."""
    return "{{secrets/" + scope + "/" + key + "}}"


class KafkaSecurityExtension(Extension):
    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.globals["kafka_secrets"] = kafka_secrets
        environment.globals["secret_reference"] = secret_reference
