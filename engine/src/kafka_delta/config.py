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

import difflib
import os
import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin
from urllib.parse import urlparse

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from kafka_delta.table_names import is_table_name, location_problem, with_suffix

# Kafka's own rule for topic names (kafka.common.internals.Topic).
_TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_PIPELINE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# A column name as Spark and delta-rs accept it inside backticks (no backtick, no newline).
_COLUMN_RE = re.compile(r"^[^`\n]+$")
# ${NAME} in a config value is replaced by that environment variable when the file is loaded:
# how secrets (SASL passwords, ...) reach the config without being written into it.
_ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

# Settings the pipeline sets itself on every Kafka client; the config must not override them.
_MANAGED_CLIENT_KEYS = frozenset({"bootstrap.servers", "group.id", "enable.auto.commit"})


class ConfigError(ValueError):
    """The configuration is invalid; the message names the file and every bad key."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaConfig(_Model):
    bootstrap_servers: str = Field(min_length=1)
    # At least one: the validator says so in the project's words (pydantic's min_length said
    # "Tuple should have at least 1 item").
    topics: tuple[str, ...]
    consumer_group: str = Field(min_length=1)
    # Where the pipeline's very first start reads each partition (the table stores no offsets
    # of it yet): earliest, latest, or {topic: {partition: offset}} as Spark's kafka source
    # takes it (-2: that partition's earliest, -1: its latest; a partition left out: earliest).
    # Once the table stores offsets they win, and a partition added later starts at earliest.
    starting_offsets: Literal["earliest", "latest"] | dict[str, dict[int, int]] = "earliest"
    max_records_per_trigger: int | None = Field(default=500_000, gt=0)
    fail_on_data_loss: bool = True
    # Seconds a read task waits for offsets that the plan says exist before failing.
    poll_timeout_seconds: float = Field(default=120.0, gt=0)
    # How long a run rides out brokers that stop answering while it runs (a rolling restart, a
    # network outage), counted from the first failed request: the unfinished batch waits
    # uncommitted and is tried again after 1, 2, 4 ... 30 s; then the run stops with exit
    # code 4 and one sentence naming the brokers. 0: stop at the first failure.
    unavailable_timeout_seconds: float = Field(default=600.0, ge=0)
    # Extra librdkafka settings (security.protocol, sasl.*, ssl.*), passed through as-is to
    # every confluent-kafka client: the embedded source, metadata queries, the commit-back hook.
    client: dict[str, str | int | float | bool] = Field(default_factory=dict)
    # Extra Java Kafka client settings for Spark's built-in source (engine.source:
    # spark_kafka), passed as its `kafka.<key>` options (security.protocol, sasl.jaas.config,
    # ssl.truststore.location, ...). Java and librdkafka name some settings differently.
    jvm_client: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("topics")
    @classmethod
    def _valid_topics(cls, topics: tuple[str, ...]) -> tuple[str, ...]:
        if not topics:
            raise ValueError("lists no topic: name at least one topic to read")
        for topic in topics:
            if not _TOPIC_RE.match(topic) or topic in {".", ".."}:
                raise ValueError(
                    f"{topic!r} is not a valid Kafka topic name "
                    "(1-249 characters of letters, digits, '.', '_' or '-')"
                )
        if len(set(topics)) != len(topics):
            raise ValueError("lists a topic more than once")
        return topics

    @model_validator(mode="after")
    def _starting_offsets_name_subscribed_partitions(self) -> KafkaConfig:
        if isinstance(self.starting_offsets, str):
            return self
        unknown = sorted(set(self.starting_offsets) - set(self.topics))
        if unknown:
            raise ValueError(
                f"starting_offsets names topic(s) {unknown} that kafka.topics does not list"
            )
        bad = [
            f"{t}[{p}]={o}"
            for t, parts in self.starting_offsets.items()
            for p, o in parts.items()
            if p < 0 or o < -2
        ]
        if bad:
            raise ValueError(
                f"starting_offsets has {', '.join(bad)}: partitions are >= 0, offsets >= 0, or "
                "-2 (earliest) / -1 (latest)"
            )
        return self

    @field_validator("client", "jvm_client")
    @classmethod
    def _no_managed_client_keys(cls, client: dict[str, Any]) -> dict[str, Any]:
        prefixed = sorted(k for k in client if k.startswith("kafka."))
        if prefixed:
            raise ValueError(
                f"sets {prefixed}: give Kafka client settings without the 'kafka.' prefix "
                "(the pipeline adds it where Spark needs it)"
            )
        managed = _MANAGED_CLIENT_KEYS & set(client)
        if managed:
            raise ValueError(
                f"sets {sorted(managed)}, which the pipeline manages itself; "
                "use kafka.bootstrap_servers / kafka.consumer_group instead"
            )
        return client

    @model_validator(mode="after")
    def _same_security_for_both_clients(self) -> KafkaConfig:
        # Even on Spark's kafka source, the pipeline talks to Kafka through librdkafka: the
        # consumer-group commit, partition metadata for a new checkpoint, lag. A broker that
        # needs credentials must get them from both clients, or those calls fail at run time.
        jvm = str(self.jvm_client.get("security.protocol", "PLAINTEXT")).upper()
        native = str(self.client.get("security.protocol", "PLAINTEXT")).upper()
        if jvm != native:
            raise ValueError(
                f"jvm_client uses security.protocol {jvm} but client uses {native}: the pipeline "
                "also reaches Kafka through librdkafka (consumer-group commits, metadata), so "
                "give kafka.client the same security settings in librdkafka's names "
                "(security.protocol, sasl.mechanism, sasl.username, sasl.password, "
                "ssl.ca.location)"
            )
        return self

    def client_config(self) -> dict[str, str]:
        """librdkafka settings shared by every client the pipeline creates."""
        conf = {k: _client_value(v) for k, v in self.client.items()}
        conf["bootstrap.servers"] = self.bootstrap_servers
        return conf

    def jvm_client_options(self) -> dict[str, str]:
        """Options of Spark's kafka source for the Java client settings (``kafka.<key>``)."""
        return {f"kafka.{k}": _client_value(v) for k, v in self.jvm_client.items()}


class DeltaConfig(_Model):
    table: str = Field(min_length=1)
    storage_options: dict[str, str] = Field(default_factory=dict)
    # append: every record becomes a row. upsert: MERGE on merge_keys, one row per key holding
    # its latest value (newest by order_by, then by Kafka offset), for changelog-style topics.
    mode: Literal["append", "upsert"] = "append"
    merge_keys: tuple[str, ...] = ()
    # Column that orders two versions of one key (e.g. an event time or version number). With
    # it, an older version arriving later never overwrites a newer row; without it, the later
    # Kafka record wins (records of one key share a partition when keyed by it).
    order_by: str | None = None
    # A batch with columns the table lacks (a producer added a field): add_columns adds them,
    # nullable, before the batch's commit (rows written before read null); fail stops the run.
    schema_evolution: Literal["add_columns", "fail"] = "add_columns"
    # A tombstone (a record with a key and a null value). dead_letter: it goes to the
    # dead-letter table, like any value that cannot be decoded. delete (upsert mode, with
    # decoding.key decoded): it deletes the row of its key, as Kafka's log compaction reads it;
    # the key's fields fill the merge_keys columns of the same names (a primitive key fills the
    # one merge key). Rows a MERGE deletes are rows whose `_op` column is `d`
    # (kafka_delta.contract.OP_COLUMN): Debezium's deletes (decoding.value.envelope: debezium),
    # tombstones, or rows a transform marks so.
    tombstones: Literal["dead_letter", "delete"] = "dead_letter"
    # engine.sink delta_rs, append: who writes a batch's Parquet files. pyarrow (the default):
    # Spark's tasks hand their rows to Python (mapInArrow), pyarrow writes them. spark: Spark's
    # own Parquet writer, the rows never leave the JVM (local tables only; others, and batches
    # it cannot write as the table wants, keep pyarrow). Measured on 2 cores, order events:
    # about even on 200k-record batches, ~0.07 s slower on 10k ones (the write command's fixed
    # cost); see kafka_delta.sinks.delta_rs.jvm_writer.
    file_writer: Literal["pyarrow", "spark"] = "pyarrow"

    @field_validator("table")
    @classmethod
    def _path_or_name(cls, table: str) -> str:
        problem = location_problem(table)
        if problem is not None:
            raise ValueError(problem)
        return table

    @field_validator("merge_keys")
    @classmethod
    def _valid_keys(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        for key in keys:
            if not _COLUMN_RE.match(key):
                raise ValueError(f"{key!r} is not a usable column name")
        if len(set(keys)) != len(keys):
            raise ValueError("lists a column more than once")
        return keys

    @field_validator("order_by")
    @classmethod
    def _valid_order_by(cls, column: str | None) -> str | None:
        if column is not None and not _COLUMN_RE.match(column):
            raise ValueError(f"{column!r} is not a usable column name")
        return column

    @model_validator(mode="after")
    def _upsert_needs_keys(self) -> DeltaConfig:
        if self.mode == "upsert" and not self.merge_keys:
            raise ValueError("mode upsert needs merge_keys: the columns that identify a row")
        if self.mode == "append" and (self.merge_keys or self.order_by):
            raise ValueError("merge_keys and order_by only apply to mode: upsert")
        if self.mode == "append" and self.tombstones == "delete":
            raise ValueError(
                "tombstones: delete needs mode: upsert (an append table has no row of a key to "
                "delete); in append mode tombstones are dead letters"
            )
        return self

    @model_validator(mode="after")
    def _commits_safely(self) -> DeltaConfig:
        """Refuse the delta-rs settings under which two commits of one version can both land:
        exactly-once rests on a commit failing when its version exists (I6, the fence)."""
        if not _is_s3(self.table):
            return self
        options = {k.lower(): v for k, v in self.storage_options.items()}
        unsafe_rename = options.get(
            "aws_s3_allow_unsafe_rename", os.environ.get("AWS_S3_ALLOW_UNSAFE_RENAME", "")
        )
        if str(unsafe_rename).strip().lower() in ("true", "1", "yes"):
            raise ValueError(
                f"AWS_S3_ALLOW_UNSAFE_RENAME lets two commits to {self.table} write the same "
                "version, one silently replacing the other; remove it (delta-rs 1.6 commits "
                "with S3's conditional put; set aws_conditional_put: etag for an "
                "S3-compatible store that needs it)"
            )
        if str(options.get("aws_conditional_put", "")).strip().lower() == "disabled":
            raise ValueError(
                f"aws_conditional_put: disabled leaves commits to {self.table} without the "
                "put-if-absent that makes a version land once; remove it (or use etag)"
            )
        if "aws_s3_locking_provider" in options:
            raise ValueError(
                "AWS_S3_LOCKING_PROVIDER: delta-rs 1.6 has no DynamoDB lock (removed in 1.6.1); "
                "S3 commits use conditional put. Remove the setting, and make sure no Spark "
                "job writes this table through S3DynamoDBLogStore (the two do not coordinate)"
            )
        return self


# What a schema file's suffix says it holds, per format.
SCHEMA_FILE_SUFFIXES: dict[str, tuple[str, ...]] = {
    # A Spark DDL string ("id BIGINT NOT NULL, ...") or a JSON Schema document.
    "json": (".ddl", ".sql", ".json"),
    "avro": (".avsc",),
    # A descriptor set: protoc --include_imports --descriptor_set_out=<file>.desc <file>.proto
    "protobuf": (".desc", ".pb", ".protoset"),
}


class SchemaRegistryConfig(_Model):
    """A Confluent-compatible Schema Registry (Confluent, Karapace, Redpanda, Apicurio's
    ccompat API; the project's devtools registry for development). Credentials are never in
    the config: it names the environment variables that hold them, read by each process that
    talks to the registry."""

    url: str = Field(min_length=1)
    auth: Literal["none", "basic", "bearer"] = "none"
    user_env: str | None = None
    password_env: str | None = None
    token_env: str | None = None
    ca_location: str | None = None
    cert_location: str | None = None
    key_location: str | None = None
    timeout_seconds: float = Field(default=10.0, gt=0)
    # How long a run waits for a registry that is down (unreachable, 5xx) before it stops
    # with exit code 4: its batch waits uncommitted, and tries again after 1, 2, 4 ... 60 s.
    retry_seconds: float = Field(default=300.0, ge=0)

    @model_validator(mode="after")
    def _credentials_named(self) -> SchemaRegistryConfig:
        if self.auth == "basic" and not (self.user_env and self.password_env):
            raise ValueError(
                "auth basic needs user_env and password_env: the names of the environment "
                "variables holding the user and the password"
            )
        if self.auth == "bearer" and not self.token_env:
            raise ValueError("auth bearer needs token_env: the environment variable of the token")
        return self


class FormatConfig(_Model):
    """How the Kafka value (or key) is decoded, in the read task, before the transform."""

    # raw: the bytes as Spark's kafka source gives them (the transform parses them itself).
    # json_schema: Confluent's JSON Schema (JSONSerializer: 0x00 + schema id + JSON text), the
    # columns from the registry subject's JSON Schema versions, following its new versions.
    format: Literal["json", "json_schema", "avro", "protobuf", "raw"] = "raw"
    # A schema file of the project; without one the schema comes from the registry.
    schema_file: str | None = Field(default=None, min_length=1)
    # protobuf: the message's full name in the descriptor set (package.Message).
    message: str | None = Field(default=None, min_length=1)
    # confluent: magic byte 0 + 4-byte schema id (+ message indexes for protobuf), or the id
    # in a __value_schema_id / __key_schema_id header. none: plain bytes of schema_file.
    # Default: confluent without a schema file, none with one.
    framing: Literal["confluent", "none"] | None = None
    # Which registry subjects the records' schemas belong to (Confluent's strategies).
    # topic_name: <topic>-value (-key); a record framed with another subject's schema is a
    # dead letter. record_name / topic_record_name: any subject's schema is taken.
    subject_name_strategy: Literal["topic_name", "record_name", "topic_record_name"] = "topic_name"
    # none: the value's fields are the columns. debezium (the value only): the value is a
    # Debezium change event (before, after, source, op, ts_ms; JSON with schemas disabled, or
    # Avro/Protobuf through the registry) and the columns are the row's, `after`'s fields (for
    # a delete `before`'s), with `_op` (c, u, r, d). Upsert mode applies c/u/r as upserts and
    # d as deletes, the latest change of a key by Kafka offset (Debezium keys records by the
    # primary key, so one row's changes share a partition in source order). Truncates (op t),
    # messages (m) and events without the row they need are dead letters with the reason:
    # a table is never truncated by a record. Decode without it to land the envelope as it is
    # (before and after as struct columns).
    envelope: Literal["none", "debezium"] = "none"

    @property
    def effective_framing(self) -> str:
        if self.framing is not None:
            return self.framing
        return "none" if self.schema_file else "confluent"

    @model_validator(mode="after")
    def _schema_source(self) -> FormatConfig:
        if self.format == "raw":
            if self.envelope != "none":
                raise ValueError(
                    f"envelope {self.envelope} needs the value decoded (format json, avro or "
                    "protobuf): the envelope's fields are read from the decoded record"
                )
            if self.schema_file or self.message or self.framing:
                raise ValueError("format raw takes no schema_file, message or framing")
            return self
        if self.format == "json_schema" and (self.schema_file or self.framing == "none"):
            raise ValueError(
                "format json_schema reads its schema from the Schema Registry (records framed "
                "by Confluent's JSONSerializer); for a schema file use format json (with "
                "framing: confluent for framed records)"
            )
        if self.schema_file is not None:
            suffixes = SCHEMA_FILE_SUFFIXES[self.format]
            if not self.schema_file.lower().endswith(suffixes):
                raise ValueError(
                    f"schema_file {self.schema_file!r} is not a {self.format} schema: "
                    f"expected a file ending in {' or '.join(suffixes)}"
                )
        if self.format == "protobuf" and self.schema_file and not self.message:
            raise ValueError(
                "format protobuf with a schema_file needs message: the full name of the "
                "message in the descriptor set"
            )
        if self.effective_framing == "none" and not self.schema_file:
            raise ValueError(
                f"format {self.format} with framing none needs schema_file: without the schema "
                "id in the record, the schema must come from the project"
            )
        return self


class DecodingConfig(_Model):
    value: FormatConfig = FormatConfig()
    # None: the key stays the raw bytes (column `key`).
    key: FormatConfig | None = None
    schema_registry: SchemaRegistryConfig | None = None

    @model_validator(mode="after")
    def _registry_when_framed(self) -> DecodingConfig:
        if self.key is not None and self.key.format != "raw" and self.value.format == "raw":
            raise ValueError(
                "key: decoding the key needs the value decoded too (value.format json, avro "
                "or protobuf); with a raw value the transform parses both"
            )
        if self.key is not None and self.key.envelope != "none":
            raise ValueError(
                "key: an envelope unwraps the value's change events (decoding.value.envelope); "
                "the key is the row's key as it is"
            )
        for name, fmt in (("value", self.value), ("key", self.key)):
            if fmt is not None and fmt.format != "raw" and fmt.effective_framing == "confluent":
                if self.schema_registry is None:
                    raise ValueError(
                        f"{name}: framing confluent (the schema id in each record) needs "
                        "schema_registry.url, or give schema_file with framing: none"
                    )
        return self


SourceKind = Literal["embedded", "spark_kafka"]
SinkKind = Literal["delta_rs", "delta_spark"]

# Shorthands for `engine:`; any other mix is written out as {source: ..., sink: ...}.
ENGINE_PRESETS: dict[str, dict[str, str]] = {
    # confluent-kafka Python data source + delta-rs: needs no JVM connector jars.
    "embedded": {"source": "embedded", "sink": "delta_rs"},
    # Spark's built-in kafka source + delta-spark: Databricks, or spark-submit --packages.
    "cluster": {"source": "spark_kafka", "sink": "delta_spark"},
}


# A source of one's own, ``module:Class``: a class implementing kafka_delta.engine.Source,
# built with the PipelineConfig (kafka_delta_dev's stand-in for Spark's kafka source is one).
_CUSTOM_SOURCE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class EngineConfig(_Model):
    source: SourceKind | str = "embedded"
    sink: SinkKind = "delta_rs"

    @field_validator("source")
    @classmethod
    def _known_or_named_class(cls, value: str) -> str:
        if value in ("embedded", "spark_kafka") or _CUSTOM_SOURCE_RE.match(value):
            return value
        raise ValueError(
            f"{value!r} is not a source: embedded, spark_kafka, or module:Class of a source of "
            "your own"
        )

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, value: object) -> object:
        if isinstance(value, str):
            if value not in ENGINE_PRESETS:
                raise ValueError(
                    f"{value!r} is not an engine; use one of {sorted(ENGINE_PRESETS)} or "
                    "{source: embedded|spark_kafka, sink: delta_rs|delta_spark}"
                )
            return ENGINE_PRESETS[value]
        return value

    @property
    def name(self) -> str:
        """The preset name when the mix is one, else ``<source>+<sink>``."""
        for name, preset in ENGINE_PRESETS.items():
            if preset == {"source": self.source, "sink": self.sink}:
                return name
        return f"{self.source}+{self.sink}"


class DeadLetterConfig(_Model):
    # Records the transform marks with `_error` go to this second Delta table. Off: such a
    # record stops the pipeline instead (nothing is dropped silently either way).
    enabled: bool = True
    table: str | None = None

    @field_validator("table")
    @classmethod
    def _path_or_name(cls, table: str | None) -> str | None:
        problem = None if table is None else location_problem(table)
        if problem is not None:
            raise ValueError(problem)
        return table


# A table's name in `tables:`: it names the table in commands (`--table`), progress lines,
# metrics and the table's txnAppId (kafka_delta.offsets.model.app_id).
_TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class TableConfig(DeltaConfig):
    """One table of a pipeline that writes several (``tables:`` in ``conf/*.yaml``): a Delta
    table's settings as under ``delta:`` (``path``, ``mode``, ``merge_keys``, ``order_by``,
    ``schema_evolution``, ``tombstones``, ``storage_options``), and which records reach it:

    - ``topics``: the topics it reads (topic routing); empty: every topic of ``kafka.topics``;
    - ``route``: a Spark SQL boolean expression on the transform's output (record routing,
      e.g. ``event_type = 'paid'``); a row it does not hold true for does not reach the table.
      A dead letter (``_error`` set) passes every route: it goes to the dead-letter table of
      each table that reads its topic (tables sharing ``dead_letters.table`` hold it once);
    - ``dead_letters``: its dead-letter policy, as the pipeline's ``dead_letters:``, which it
      takes when it sets none (default: on, in ``<path>_dead_letters``).

    A transform may return a mapping of table name to DataFrame (bronze and silver from one
    read); each table then takes its own output. Each table's commits carry the pipeline's tag,
    their own txnAppId (``<pipeline_id>.<table>.<checkpoint query id>``) and the offsets of
    what it received: every rule of one table (fencing, replay, RESTORE, reset, topic ids)
    applies to each table on its own, through :meth:`PipelineConfig.for_table`."""

    topics: tuple[str, ...] = ()
    route: str | None = Field(default=None, min_length=1)
    # None: the pipeline's `dead_letters:`.
    dead_letters: DeadLetterConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _path_is_the_table(cls, value: object) -> object:
        # `path:` in the file; `table` is DeltaConfig's name for it.
        if isinstance(value, dict) and "path" in value:
            value = dict(value)
            if "table" in value:
                raise ValueError("give the table's location once, as path")
            value["table"] = value.pop("path")
        return value

    @property
    def path(self) -> str:
        return self.table

    def delta_config(self, shared_storage_options: Mapping[str, str]) -> DeltaConfig:
        """The table's settings as a ``delta:`` block (storage options: its own, else the
        shared ``delta.storage_options``)."""
        fields = {name: getattr(self, name) for name in DeltaConfig.model_fields}
        if not self.storage_options:
            fields["storage_options"] = dict(shared_storage_options)
        return DeltaConfig(**fields)


class TriggerConfig(_Model):
    mode: Literal["available_now", "processing_time"] = "available_now"
    # processing_time: a micro-batch every interval_seconds. 0, the low-latency setting: the
    # next micro-batch starts as soon as the last one ends and records are waiting (Spark's
    # ProcessingTime(0)); about one Delta version a batch, thousands an hour (configuration.md,
    # "Fresh tables").
    interval_seconds: float = Field(default=10.0, ge=0)
    # interval_seconds 0 with no record waiting: how often the run looks again. Spark's own
    # default (10 ms) cost an idle run 15-20% of a core in Kafka requests. The embedded source
    # holds its answer to Spark up to a second meanwhile, looking at Kafka's ends this often
    # (kafka_delta.sources.kafka_datasource.IDLE_WAIT_S); Spark's kafka source is asked again
    # after it (Spark's spark.sql.streaming.pollingDelay).
    idle_poll_seconds: float = Field(default=0.05, gt=0, le=10)

    @property
    def low_latency(self) -> bool:
        """The next batch as soon as the last one ends (processing time, interval 0)."""
        return self.mode == "processing_time" and self.interval_seconds == 0

    @property
    def idle_poll(self) -> float | None:
        """Seconds between looks for new records while none are waiting, on the low-latency
        setting; None on any other trigger (Spark's own polling applies)."""
        return self.idle_poll_seconds if self.low_latency else None


class MaintenanceConfig(_Model):
    # The run's own compaction (kafka_delta.runtime.compaction): every compact_every_seconds a
    # thread beside the stream compacts the run's tables and dead-letter tables, as `table
    # maintain --only compact` does, so a table committed every second keeps few files. 0 (the
    # default): never; `table maintain` on a schedule does it. Vacuum and checkpoints stay
    # with `table maintain`.
    compact_every_seconds: float = Field(default=0.0, ge=0)


class CommitBackConfig(_Model):
    enabled: bool = True
    timeout_seconds: float = Field(default=10.0, gt=0)


class MetricsConfig(_Model):
    # none: no metrics (prometheus_client is not even imported). http: serve them at
    # http://host:port/metrics for Prometheus to scrape. textfile: write them to `textfile`
    # after every batch, for node_exporter's textfile collector.
    exporter: Literal["none", "http", "textfile"] = "none"
    # Loopback by default: exposing the endpoint beyond the machine is a deliberate choice.
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=9464, ge=1, le=65535)
    textfile: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _textfile_for_textfile(self) -> MetricsConfig:
        if self.exporter == "textfile":
            if not self.textfile:
                raise ValueError("exporter textfile needs textfile: the .prom file to write")
            if not self.textfile.endswith(".prom"):
                raise ValueError(
                    f"textfile {self.textfile!r} must end in .prom (node_exporter's textfile "
                    "collector reads only *.prom files)"
                )
        return self


class ProgressConfig(_Model):
    # One JSON line per micro-batch (records read, rows, dead letters, lag, duration...),
    # appended across runs; `report` draws records/s and lag from it. null: no file.
    path: str | None = Field(default=None, min_length=1)


class SparkConfig(_Model):
    master: str | None = "local[2]"
    # A Spark Connect server (sc://host:port) to run on instead of a session of this process;
    # SPARK_REMOTE in the environment does the same. On Databricks serverless and standard
    # access compute the platform's session is already a Connect session: leave it unset.
    remote: str | None = Field(default=None, pattern=r"^sc://")
    conf: dict[str, str] = Field(default_factory=dict)


def _is_s3(uri: str) -> bool:
    return uri.split("://", 1)[0].lower() in ("s3", "s3a", "s3n") if "://" in uri else False


# Spark confs that give delta-spark a LogStore safe for more than one driver on S3.
MULTI_DRIVER_S3_LOG_STORE_CONFS = (
    "spark.delta.logStore.s3.impl",
    "spark.delta.logStore.s3a.impl",
    "spark.delta.logStore.s3n.impl",
    "spark.delta.logStore.class",
)


# module:function, as the config names the transform (kafka_delta.contract.load_transform).
_TRANSFORM_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class PipelineConfig(_Model):
    pipeline_id: str
    # The project's transform, ``package.module:function`` (kafka_delta.contract); without one
    # the records land as they arrive.
    transform: str | None = None
    engine: EngineConfig = EngineConfig()
    kafka: KafkaConfig
    # The table, when the pipeline writes one. With `tables:` (several tables, see TableConfig)
    # it may be left out, or hold only storage_options shared by the tables; it then names the
    # first table.
    delta: DeltaConfig
    # Several tables from one stream: {name: TableConfig}, in the order they commit each batch.
    # Empty (the default): the one table of `delta:`, exactly as before.
    tables: dict[str, TableConfig] = Field(default_factory=dict)
    checkpoint: str = Field(min_length=1)
    decoding: DecodingConfig = DecodingConfig()
    dead_letters: DeadLetterConfig = DeadLetterConfig()
    trigger: TriggerConfig = TriggerConfig()
    commit_back: CommitBackConfig = CommitBackConfig()
    maintenance: MaintenanceConfig = MaintenanceConfig()
    metrics: MetricsConfig = MetricsConfig()
    progress: ProgressConfig = ProgressConfig()
    spark: SparkConfig = SparkConfig()

    # Set on a view of one table (for_table): the table's name; None on the config as loaded.
    _table: str | None = PrivateAttr(default=None)
    _route: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _delta_of_the_tables(cls, value: object) -> object:
        """With ``tables:``, ``delta:`` holds at most the storage options the tables share;
        it is filled in with the first table's location (what names "the table" where one is
        needed: the start-up line, the run's first lease)."""
        if not isinstance(value, dict) or not value.get("tables"):
            return value
        tables = value["tables"]
        if not isinstance(tables, dict):
            return value
        delta = value.get("delta") or {}
        if not isinstance(delta, dict):
            return value
        first = next(iter(tables.values()))
        path = first.get("path", first.get("table")) if isinstance(first, dict) else None
        if set(delta) - {"storage_options"} and delta.get("table") != path:
            raise ValueError(
                "with tables:, delta: holds only storage_options (shared by the tables); each "
                "table's path and mode are given under tables:"
            )
        if path is None:
            return value  # the table's own validation names what is missing
        return {**value, "delta": {"storage_options": {}, **delta, "table": path}}

    @field_validator("tables")
    @classmethod
    def _valid_table_names(cls, tables: dict[str, TableConfig]) -> dict[str, TableConfig]:
        for name in tables:
            if not _TABLE_NAME_RE.match(name):
                raise ValueError(
                    f"{name!r} is not a table name: a letter or digit, then letters, digits, "
                    "'_' or '-' (at most 64 characters)"
                )
        return tables

    @model_validator(mode="after")
    def _tables_route_every_topic(self) -> PipelineConfig:
        if not self.tables:
            return self
        topics = set(self.kafka.topics)
        read: set[str] = set()
        for name, table in self.tables.items():
            unknown = sorted(set(table.topics) - topics)
            if unknown:
                raise ValueError(
                    f"tables.{name}.topics names {unknown}, which kafka.topics does not list"
                )
            read |= set(table.topics or topics)
        unread = sorted(topics - read)
        if unread:
            raise ValueError(
                f"kafka.topics lists {unread}, which no table reads: add it to a table's "
                "topics, or remove it"
            )
        # Every table has a location of its own; tables may share a dead-letter table.
        views = [self.for_table(name) for name in self.tables]
        owners: dict[str, str] = {}
        for view in views:
            path = view.delta.table.rstrip("/")
            if path in owners:
                raise ValueError(
                    f"tables.{view.table_name}: path {view.delta.table} is also the path of "
                    f"table {owners[path]}: every table needs a location of its own"
                )
            owners[path] = str(view.table_name)
        for view in views:
            dead = view.dead_letter_table
            if dead is not None and dead.rstrip("/") in owners:
                raise ValueError(
                    f"tables.{view.table_name}: its dead-letter table {dead} is the path of "
                    f"table {owners[dead.rstrip('/')]}"
                )
        return self

    @model_validator(mode="after")
    def _locations_apart(self) -> PipelineConfig:
        """The checkpoint, the tables and the dead-letter tables each have a folder of their
        own, none inside another: an operator who deletes a checkpoint (the advice for a few
        states recovery refuses) would delete a table inside it, and a checkpoint inside a
        table is deleted by whatever cleans the table's folder (and Delta's VACUUM sees files
        that are not the table's)."""
        places = [("checkpoint", self.checkpoint)]
        for view in self.table_configs():
            of = "" if view.table_name is None else f"tables.{view.table_name}."
            places.append((f"{of}table" if of else "delta.table", view.delta.table))
            dead = view.dead_letter_table
            if dead is not None:
                owned = of and self.tables[str(view.table_name)].dead_letters is not None
                places.append((f"{of if owned else ''}dead_letters.table", dead))
        dead_letters = "dead_letters.table"
        for i, (name, where) in enumerate(places):
            for other, there in places[i + 1 :]:
                same = _location_key(where) == _location_key(there)
                if same and name.endswith(dead_letters) and other.endswith(dead_letters):
                    continue  # tables may share a dead-letter table
                if _inside(where, there):
                    (inner, at), (outer, folder) = (name, where), (other, there)
                elif _inside(there, where):
                    (inner, at), (outer, folder) = (other, there), (name, where)
                else:
                    continue
                raise ValueError(
                    f"{inner} {at} {'is the same folder as' if same else 'is inside'} {outer} "
                    f"{folder}: the checkpoint and each table need a folder of their own, side "
                    "by side, never one inside another (deleting one would delete the other)"
                )
        return self

    @property
    def table_name(self) -> str | None:
        """The table this config is a view of (:meth:`for_table`); None: the config as
        loaded (its one table, or all of ``tables:``)."""
        return self._table

    @property
    def table_route(self) -> str | None:
        """The ``route`` expression of the table this config is a view of (record routing)."""
        return self._route

    @property
    def table_names(self) -> tuple[str, ...]:
        """The names of ``tables:``, in commit order; () for a config of one table."""
        return tuple(self.tables)

    def for_table(self, name: str) -> PipelineConfig:
        """This config as the pipeline sees it for table ``name`` of ``tables:``: ``delta``
        its settings, ``kafka.topics`` the topics it reads, ``dead_letters`` its policy. What
        works on a config of one table (the sinks, stored offsets, fencing, recovery, the
        commands) works on the view unchanged: one rule for every table."""
        if name not in self.tables:
            known = ", ".join(self.tables) or "none: this pipeline writes one table"
            raise ConfigError(f"no table {name!r} in tables: (tables: {known})")
        table = self.tables[name]
        topics = table.topics or self.kafka.topics
        starting = self.kafka.starting_offsets
        if not isinstance(starting, str):
            starting = {t: dict(parts) for t, parts in starting.items() if t in topics}
        view = self.model_copy(
            update={
                "delta": table.delta_config(self.delta.storage_options),
                "kafka": self.kafka.model_copy(
                    update={"topics": tuple(topics), "starting_offsets": starting}
                ),
                # Its own policy, else the pipeline's `dead_letters:` (a shared table, or off).
                "dead_letters": table.dead_letters or self.dead_letters,
                "tables": {},
            }
        )
        view._table = name
        view._route = table.route
        return view

    def table_configs(self) -> list[PipelineConfig]:
        """One config per table the pipeline writes: a view per table of ``tables:``
        (:meth:`for_table`), else this config itself."""
        if not self.tables:
            return [self]
        return [self.for_table(name) for name in self.tables]

    @field_validator("pipeline_id")
    @classmethod
    def _valid_pipeline_id(cls, value: str) -> str:
        if not _PIPELINE_ID_RE.match(value):
            raise ValueError(
                "must start with a letter or digit and hold only letters, digits, "
                "'.', '_' or '-' (at most 128 characters)"
            )
        return value

    @field_validator("transform")
    @classmethod
    def _names_a_function(cls, value: str | None) -> str | None:
        if value is not None and not _TRANSFORM_RE.match(value):
            raise ValueError(
                f"{value!r} must name a function as module:function, e.g. "
                "orders_stream.transform:transform"
            )
        return value

    @model_validator(mode="after")
    def _delta_spark_commits_safely(self) -> PipelineConfig:
        """delta-spark on S3 outside Databricks commits through S3SingleDriverLogStore unless
        told otherwise: two drivers (two runs by mistake, a retried job beside a live one) can
        then both write one version, and the fence (I6) no longer holds."""
        on_s3 = [d.table for d in (self.delta, *self.tables.values()) if _is_s3(d.table)]
        if self.engine.sink != "delta_spark" or not on_s3:
            return self
        if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
            return self  # Databricks commits to S3 through its own commit service
        if any(key in self.spark.conf for key in MULTI_DRIVER_S3_LOG_STORE_CONFS):
            return self
        raise ValueError(
            f"delta-spark would commit to {on_s3[0]} through S3SingleDriverLogStore, "
            "which lets two Spark drivers write the same version; set spark.conf "
            "spark.delta.logStore.s3a.impl: io.delta.storage.S3DynamoDBLogStore (with the "
            "delta-storage-s3-dynamodb jar), run on Databricks, or use the delta_rs sink"
        )

    @model_validator(mode="after")
    def _names_need_the_cluster_sink(self) -> PipelineConfig:
        """The embedded engine's delta-rs sink opens tables by path only: a catalog name is
        refused before any work rather than taken for a folder (kafka_delta.table_names)."""
        if self.engine.sink != "delta_rs":
            return self
        for view in self.table_configs():
            for key, location in (
                ("delta.table", view.delta.table),
                ("dead_letters.table", view.dead_letter_table),
            ):
                if location is not None and is_table_name(location):
                    where = f"tables.{view.table_name}" if view.table_name else key
                    raise ValueError(
                        f"{where} {location} is a table name, and engine.sink delta_rs writes "
                        "tables by path only: give a path, or use engine.sink: delta_spark "
                        "(tables by name in Spark's catalog, Unity Catalog on Databricks)"
                    )
        return self

    @model_validator(mode="after")
    def _tombstones_need_the_key(self) -> PipelineConfig:
        key = self.decoding.key
        deletes = any(d.tombstones == "delete" for d in (self.delta, *self.tables.values()))
        if deletes and (key is None or key.format == "raw"):
            raise ValueError(
                "delta.tombstones: delete needs decoding.key decoded (format json, avro or "
                "protobuf): a tombstone's key is all that says which row to delete"
            )
        return self

    @property
    def dead_letter_table(self) -> str | None:
        """Where dead letters go: the configured table, else ``<table>_dead_letters``."""
        if not self.dead_letters.enabled:
            return None
        return self.dead_letters.table or with_suffix(self.delta.table, "_dead_letters")

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


def _location_key(location: str) -> str:
    """A location as a comparable path: a local path (or ``file:`` URI) normalized, a URI's
    scheme and bucket kept; no trailing ``/``."""
    parsed = urlparse(location)
    windows = len(parsed.scheme) == 1 and location[1:3] in (":\\", ":/")
    if parsed.scheme in ("", "file") or windows:
        path = parsed.path if parsed.scheme == "file" else location.replace("\\", "/")
        return posixpath.normpath(path)
    return f"{parsed.scheme.lower()}://{parsed.netloc}{posixpath.normpath(parsed.path or '/')}"


def _inside(location: str, folder: str) -> bool:
    """Whether ``location`` is ``folder`` or lies below it (a sibling sharing a prefix,
    ``/x/table2`` beside ``/x/table``, does not)."""
    inner, outer = _location_key(location), _location_key(folder)
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _client_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _format_errors(error: ValidationError, source: str) -> str:
    # A value no member of a union takes (starting_offsets: a name, or a mapping) has an error
    # per member, each under the member's type ("literal['earliest','latest']"): one key's one
    # problem, told once.
    by_key: dict[tuple[int | str, ...], list[Any]] = {}
    for item in error.errors():
        loc = tuple(p for p in item["loc"] if not (isinstance(p, str) and "[" in p))
        by_key.setdefault(loc, []).append(item)
    lines = [f"invalid configuration in {source}:"]
    for loc, items in by_key.items():
        key = ".".join(str(part) for part in loc) or "(top level)"
        lines.append(f"  {key}: {_problem(loc, items)}")
    return "\n".join(lines)


def _problem(loc: tuple[int | str, ...], items: list[Any]) -> str:
    """One key's problem in plain words: an unknown key with the known one it is closest to,
    a value outside a choice with the allowed values (and the closest), else pydantic's."""
    kinds = {item["type"]: item for item in items}
    if "extra_forbidden" in kinds:
        near = difflib.get_close_matches(str(loc[-1]), _known_keys(loc[:-1]), n=1)
        return (
            f"unknown key; did you mean {near[0]}?" if near else "unknown key (check the spelling)"
        )
    if "missing" in kinds:
        return "is required"
    if "literal_error" in kinds:
        item = kinds["literal_error"]
        expected = str(item.get("ctx", {}).get("expected", ""))
        given = item.get("input")
        mapping = " (or a mapping)" if "dict_type" in kinds else ""
        near = difflib.get_close_matches(str(given), re.findall(r"'([^']*)'", expected), n=1)
        maybe = f"; did you mean {near[0]!r}?" if near else ""
        return f"must be {expected}{mapping}, not {given!r}{maybe}"
    return "; or ".join(str(item["msg"]).removeprefix("Value error, ") for item in items)


def _known_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the config takes at ``loc`` (a dotted key's parts): fields of the model there."""
    model: Any = PipelineConfig
    parts = list(loc)
    while parts:
        name = str(parts.pop(0))
        fields = {f.alias or n: f for n, f in model.model_fields.items()}
        found = model.model_fields.get(name) or fields.get(name)
        if found is None:
            return []
        model = None
        for kind in (found.annotation, *get_args(found.annotation)):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                model = kind
            elif get_origin(kind) is dict and parts:
                value = get_args(kind)[-1]
                if isinstance(value, type) and issubclass(value, BaseModel):
                    parts.pop(0)  # the mapping's key (a table's name)
                    model = value
        if model is None:
            return []
    return sorted({f.alias or n for n, f in model.model_fields.items()} | set(model.model_fields))


def _validate(data: object, source: str) -> PipelineConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid configuration in {source}: expected a mapping at the top level")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def _resolve(path: str, root: Path) -> str:
    # URIs (s3://, abfss://, dbfs:/, file:/) and table names (main.sales.orders) pass through;
    # relative paths hang off the project root.
    if is_table_name(path):
        return path
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", path):
        return path
    candidate = Path(path).expanduser()
    return str(candidate if candidate.is_absolute() else (root / candidate).resolve())


def _interpolate(data: object, environ: Mapping[str, str], where: str = "") -> object:
    """Replace ``${NAME}`` in string values with ``environ[NAME]``; a missing variable is an
    error naming the key, never an empty string that would fail later at the broker."""
    if isinstance(data, dict):
        return {
            k: _interpolate(v, environ, f"{where}.{k}" if where else str(k))
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [_interpolate(v, environ, f"{where}[{i}]") for i, v in enumerate(data)]
    if not isinstance(data, str):
        return data

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            reference = "$" + "{" + name + "}"
            raise ConfigError(
                f"{where or '(top level)'}: refers to {reference}, but the environment variable "
                f"{name} is not set"
            )
        return environ[name]

    return _ENV_REF_RE.sub(substitute, data)


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> PipelineConfig:
    """Parse and validate a YAML config file; relative paths are resolved against the project
    root (the parent of the ``conf/`` folder holding the file). ``${NAME}`` in a value is taken
    from ``environ`` (the entry point passes ``os.environ``; by default nothing is set)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    try:
        data = _interpolate(data, environ or {})
    except ConfigError as exc:
        raise ConfigError(f"invalid configuration in {path}:\n  {exc}") from None
    cfg = _validate(data, source=str(path))
    root = path.resolve().parent
    if root.name == "conf":
        root = root.parent
    return cfg.with_overrides(
        **{
            "delta.table": _resolve(cfg.delta.table, root),
            "checkpoint": _resolve(cfg.checkpoint, root),
            "metrics.textfile": cfg.metrics.textfile and _resolve(cfg.metrics.textfile, root),
            "progress.path": cfg.progress.path and _resolve(cfg.progress.path, root),
            # None (the default, <table>_dead_letters) is left as it is by with_overrides.
            "dead_letters.table": cfg.dead_letters.table and _resolve(cfg.dead_letters.table, root),
            **{
                f"tables.{name}.table": _resolve(table.table, root)
                for name, table in cfg.tables.items()
            },
            **{
                f"tables.{name}.dead_letters.table": _resolve(table.dead_letters.table, root)
                for name, table in cfg.tables.items()
                if table.dead_letters is not None and table.dead_letters.table
            },
            "decoding.value.schema_file": cfg.decoding.value.schema_file
            and _resolve(cfg.decoding.value.schema_file, root),
            "decoding.key.schema_file": cfg.decoding.key
            and cfg.decoding.key.schema_file
            and _resolve(cfg.decoding.key.schema_file, root),
        }
    )
