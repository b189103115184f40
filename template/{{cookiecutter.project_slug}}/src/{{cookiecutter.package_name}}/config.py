"""Typed pipeline configuration, parsed once from ``conf/<env>.yaml`` and validated at start-up.

Library code receives a frozen :class:`PipelineConfig`; it never reads files or the environment.

>>> cfg = PipelineConfig.model_validate({
...     "pipeline_id": "orders", "kafka": {"bootstrap_servers": "127.0.0.1:9092",
...     "topics": ["orders"], "consumer_group": "orders"},
...     "delta": {"table": "/tmp/t"}, "checkpoint": "/tmp/c"})
>>> cfg.trigger.mode
'available_now'
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Kafka's own rule for topic names (kafka.common.internals.Topic).
_TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_PIPELINE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ConfigError(ValueError):
    """The configuration is invalid; the message names the file and every bad key."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaConfig(_Model):
    bootstrap_servers: str = Field(min_length=1)
    topics: tuple[str, ...] = Field(min_length=1)
    consumer_group: str = Field(min_length=1)
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    max_records_per_trigger: int | None = Field(default=500_000, gt=0)
    fail_on_data_loss: bool = True
    # Seconds a read task waits for offsets that the plan says exist before failing.
    poll_timeout_seconds: float = Field(default=120.0, gt=0)
    # Extra librdkafka settings (security.protocol, sasl.*, ssl.*), passed through as-is.
    client: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("topics")
    @classmethod
    def _valid_topics(cls, topics: tuple[str, ...]) -> tuple[str, ...]:
        for topic in topics:
            if not _TOPIC_RE.match(topic) or topic in {".", ".."}:
                raise ValueError(
                    f"{topic!r} is not a valid Kafka topic name "
                    "(1-249 characters of letters, digits, '.', '_' or '-')"
                )
        if len(set(topics)) != len(topics):
            raise ValueError("lists a topic more than once")
        return topics

    @field_validator("client")
    @classmethod
    def _no_managed_client_keys(cls, client: dict[str, Any]) -> dict[str, Any]:
        managed = {"bootstrap.servers", "group.id", "enable.auto.commit"} & set(client)
        if managed:
            raise ValueError(
                f"sets {sorted(managed)}, which the pipeline manages itself; "
                "use kafka.bootstrap_servers / kafka.consumer_group instead"
            )
        return client

    def client_config(self) -> dict[str, str]:
        """librdkafka settings shared by every client the pipeline creates."""
        conf = {k: _librdkafka_value(v) for k, v in self.client.items()}
        conf["bootstrap.servers"] = self.bootstrap_servers
        return conf


class DeltaConfig(_Model):
    table: str = Field(min_length=1)
    storage_options: dict[str, str] = Field(default_factory=dict)


class DeadLetterConfig(_Model):
    # Records the transform marks with `_error` go to this second Delta table. Off: such a
    # record stops the pipeline instead (nothing is dropped silently either way).
    enabled: bool = True
    table: str | None = None


class TriggerConfig(_Model):
    mode: Literal["available_now", "processing_time"] = "available_now"
    interval_seconds: float = Field(default=10.0, gt=0)


class CommitBackConfig(_Model):
    enabled: bool = True
    timeout_seconds: float = Field(default=10.0, gt=0)


class SparkConfig(_Model):
    master: str | None = "local[2]"
    conf: dict[str, str] = Field(default_factory=dict)


class PipelineConfig(_Model):
    pipeline_id: str
    engine: Literal["embedded"] = "embedded"
    kafka: KafkaConfig
    delta: DeltaConfig
    checkpoint: str = Field(min_length=1)
    dead_letters: DeadLetterConfig = DeadLetterConfig()
    trigger: TriggerConfig = TriggerConfig()
    commit_back: CommitBackConfig = CommitBackConfig()
    spark: SparkConfig = SparkConfig()

    @field_validator("pipeline_id")
    @classmethod
    def _valid_pipeline_id(cls, value: str) -> str:
        if not _PIPELINE_ID_RE.match(value):
            raise ValueError(
                "must start with a letter or digit and hold only letters, digits, "
                "'.', '_' or '-' (at most 128 characters)"
            )
        return value

    @property
    def dead_letter_table(self) -> str | None:
        """Where dead letters go: the configured table, else ``<table>_dead_letters``."""
        if not self.dead_letters.enabled:
            return None
        return self.dead_letters.table or f"{self.delta.table.rstrip('/')}_dead_letters"

    def with_overrides(self, **overrides: Any) -> PipelineConfig:
        """Return a copy with dotted-key overrides applied, validated like the file.

        >>> cfg.with_overrides(**{"kafka.bootstrap_servers": "broker:9092"})  # doctest: +SKIP
        """
        data = self.model_dump()
        for dotted, value in overrides.items():
            if value is None:
                continue
            node = data
            *parents, leaf = dotted.split(".")
            for key in parents:
                node = node[key]
            node[leaf] = value
        return _validate(data, source="overrides")


def _librdkafka_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _format_errors(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling)"
        elif item["type"] == "missing":
            message = "is required"
        lines.append(f"  {key}: {message}")
    return "\n".join(lines)


def _validate(data: object, source: str) -> PipelineConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid configuration in {source}: expected a mapping at the top level")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def _resolve(path: str, root: Path) -> str:
    # URIs (s3://, abfss://, dbfs:/, file:/) pass through; relative paths hang off the project root.
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", path):
        return path
    candidate = Path(path).expanduser()
    return str(candidate if candidate.is_absolute() else (root / candidate).resolve())


def load_config(path: str | Path) -> PipelineConfig:
    """Parse and validate a YAML config file; relative paths are resolved against the project
    root (the parent of the ``conf/`` folder holding the file)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    cfg = _validate(data, source=str(path))
    root = path.resolve().parent
    if root.name == "conf":
        root = root.parent
    return cfg.with_overrides(
        **{
            "delta.table": _resolve(cfg.delta.table, root),
            "checkpoint": _resolve(cfg.checkpoint, root),
        }
    )
