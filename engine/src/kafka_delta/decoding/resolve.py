"""The driver's half of decoding: the config's ``decoding:`` section turned into the
:class:`~.spec.DecodeSpec` the read tasks receive, with the reader schema resolved once.

The reader schema (the columns the transform sees) comes from the project's schema file, or
from the Schema Registry: the union of every version registered under the topics' subjects
(``<topic>-value``, Confluent's TopicNameStrategy), in the order fields first appear, plus any
writer schema the pipeline met in records since (``decoding.value.subject_name_strategy``
record_name or topic_record_name). A union of all versions never loses a column the table has:
a field a later version drops reads null; a promotion widens the column; any other type change
keeps the column's first type (:mod:`.versions`), and the records that cannot fill it are dead
letters. With the default topic_name strategy, a record framed with a schema registered under
another subject never widens the reader: it is a dead letter naming its schema id and subject.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from kafka_delta.config import DecodingConfig, FormatConfig, PipelineConfig
from kafka_delta.decoding.avro_types import avro_to_arrow
from kafka_delta.decoding.json_types import json_schema_to_arrow
from kafka_delta.decoding.protobuf_types import protobuf_to_arrow
from kafka_delta.decoding.schema_registry import registry_for
from kafka_delta.decoding.spec import (
    DecodeSpec,
    FieldSpec,
    RegistrySettings,
    RegistryUnavailableError,
    SchemaFileError,
)
from kafka_delta.decoding.versions import union_schemas


def build_decode_spec(
    spark: SparkSession,
    config: PipelineConfig,
    writer_schema_ids: Iterable[int] = (),
    message_seen: str | None = None,
    table_columns: Callable[[], Iterable[str] | None] | None = None,
) -> DecodeSpec | None:
    """The pipeline's decode spec; None when the value stays raw bytes. The records are decoded
    once for every table: when a table has ``tombstones: delete``, a tombstone is read as a
    delete whose key fills the merge keys of the tables that delete (each table then takes it as
    its own ``tombstones`` says: :func:`kafka_delta.routing.key_deletes`). ``table_columns``:
    the columns of the table as it is, asked only for Protobuf without ``message:`` before a
    message was seen (a table that exists says which message it takes)."""
    value = config.decoding.value
    columns = (
        table_columns()
        if table_columns is not None
        and value.format == "protobuf"
        and not value.message
        and not message_seen
        else None
    )
    spec = decode_spec(
        spark, config.decoding, config.kafka.topics, writer_schema_ids, message_seen, columns
    )
    keys: dict[str, None] = {}
    for table in config.table_configs():
        if table.delta.tombstones == "delete":
            keys.update(dict.fromkeys(table.delta.merge_keys))
    if spec is not None and keys:
        spec = replace(spec, tombstone_keys=tuple(keys))
    return spec


def decode_spec(
    spark: SparkSession,
    decoding: DecodingConfig,
    topics: Iterable[str],
    writer_schema_ids: Iterable[int] = (),
    message_seen: str | None = None,
    table_columns: Iterable[str] | None = None,
) -> DecodeSpec | None:
    """Protobuf without ``message:``: the value's message is ``message_seen``, the one its
    records were found to carry (:class:`.spec.MessageSeenError`), else the one whose fields
    are the ``table_columns`` of the table that exists (a message of a run before), else the
    file's default (:mod:`.protobuf_types`)."""
    if decoding.value.format == "raw":
        return None
    registry = _registry_settings(decoding)
    topics = tuple(topics)
    ids = tuple(sorted(set(writer_schema_ids)))
    value = _field_spec(
        spark, decoding.value, "value", topics, registry, ids, message_seen, table_columns
    )
    key = (
        _field_spec(spark, decoding.key, "key", topics, registry, ())
        if decoding.key is not None and decoding.key.format != "raw"
        else None
    )
    return DecodeSpec(value=value, key=key, registry=registry, envelope=decoding.value.envelope)


def _registry_settings(decoding: DecodingConfig) -> RegistrySettings | None:
    r = decoding.schema_registry
    if r is None:
        return None
    return RegistrySettings(**r.model_dump(include=set(RegistrySettings.__dataclass_fields__)))


def _field_spec(
    spark: SparkSession,
    fmt: FormatConfig,
    part: str,
    topics: tuple[str, ...],
    registry: RegistrySettings | None,
    writer_schema_ids: tuple[int, ...],
    message_seen: str | None = None,
    table_columns: Iterable[str] | None = None,
) -> FieldSpec:
    if fmt.format == "protobuf" and not fmt.message and fmt.schema_file is None:
        if not message_seen and table_columns and registry is not None:
            message_seen = _message_of_table(part, topics, registry, tuple(table_columns))
        if message_seen:
            # The records' message is the table's, as if configured (others are dead letters).
            fmt = fmt.model_copy(update={"message": message_seen})
    framing = fmt.effective_framing
    if fmt.schema_file is not None:
        reader, required, writer, message = _from_file(spark, fmt)
    else:
        assert registry is not None  # the config requires one without a schema file
        reader, required = _from_registry(fmt, part, topics, registry, writer_schema_ids)
        writer, message = None, fmt.message
    subjects = (
        tuple(f"{t}-{part}" for t in topics)
        if framing == "confluent" and fmt.subject_name_strategy == "topic_name"
        else ()
    )
    return FieldSpec(
        format=fmt.format,
        framing=framing,  # type: ignore[arg-type]
        reader=reader,
        writer_schema=writer,
        message=message,
        required=required,
        subjects=subjects,
    )


def _read(path: str, binary: bool = False) -> str | bytes:
    file = Path(path)
    if not file.is_file():
        what = "a folder" if file.is_dir() else "not there"
        raise SchemaFileError(f"schema file {path} is {what}: decoding needs the schema file")
    try:
        return file.read_bytes() if binary else file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaFileError(f"cannot read schema file {path}: {exc}") from None


def _from_file(
    spark: SparkSession, fmt: FormatConfig
) -> tuple[pa.Schema, tuple[str, ...], str | None, str | None]:
    """(reader schema, required fields, writer schema for unframed records, message)."""
    path = fmt.schema_file
    assert path is not None
    if fmt.format == "json":
        text = str(_read(path))
        if path.lower().endswith(".json"):
            reader, required = json_schema_to_arrow(text)
            return reader, tuple(required), None, None
        reader, required = ddl_to_arrow(spark, text, path)
        return reader, required, None, None
    if fmt.format == "avro":
        text = str(_read(path))
        return _nullable(avro_to_arrow(text)), (), text, None
    data = _read(path, binary=True)
    assert isinstance(data, bytes) and fmt.message is not None
    reader = protobuf_to_arrow(data, fmt.message)
    return _nullable(reader), (), base64.b64encode(data).decode(), fmt.message


def ddl_to_arrow(spark: SparkSession, text: str, path: str) -> tuple[pa.Schema, tuple[str, ...]]:
    """A Spark DDL schema file ("id BIGINT NOT NULL, ...", ``--`` comment lines allowed) as
    the reader schema (every column nullable) and its NOT NULL columns (required: a record
    without one is a dead letter)."""
    from pyspark.errors import PySparkException
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    ddl = " ".join(
        line for line in text.splitlines() if line.strip() and not line.strip().startswith("--")
    )
    _ = spark  # the DDL parser is Spark's, through the session's JVM
    try:
        parsed = _parse_datatype_string(ddl)
    except (PySparkException, Exception) as exc:
        raise SchemaFileError(f"schema file {path} is not a Spark DDL schema: {exc}") from None
    if not isinstance(parsed, StructType):
        raise SchemaFileError(f"schema file {path} holds {parsed.simpleString()}, not columns")
    required = tuple(f.name for f in parsed.fields if not f.nullable)
    arrow = to_arrow_schema(parsed, timezone="UTC")
    return _nullable(arrow), required


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


def _from_registry(
    fmt: FormatConfig,
    part: str,
    topics: tuple[str, ...],
    settings: RegistrySettings,
    writer_schema_ids: tuple[int, ...],
) -> tuple[pa.Schema, tuple[str, ...]]:
    registry = registry_for(settings)
    found = []
    for topic in topics:
        found.extend(registry.subject_versions(f"{topic}-{part}"))
    found.extend(registry.schema_by_id(i) for i in writer_schema_ids)
    if not found:
        # A pipeline deployed before its producers: nothing to read yet, and the first producer
        # registers the schema. Waited for like an outage (schema_registry.retry_seconds), then
        # one sentence; never a failure that repeats at once on every restart.
        subjects = ", ".join(f"{t}-{part}" for t in topics)
        raise RegistryUnavailableError(
            f"the Schema Registry at {settings.url} has no schema under {subjects} yet: waiting "
            f"for a producer with a registry serializer to register one (or give "
            f"decoding.{part}.schema_file)"
        )
    schemas = [_arrow_of(fmt, s, part, registry) for s in found]
    if all(s is None for s in schemas):  # every version lacks the message named
        raise SchemaFileError(
            f"no schema under {', '.join(f'{t}-{part}' for t in topics)} has the protobuf "
            f"message {fmt.message} (decoding.{part}.message)"
        )
    return union_schemas([s for s in schemas if s is not None]), ()


def _message_of_table(
    part: str, topics: tuple[str, ...], settings: RegistrySettings, columns: tuple[str, ...]
) -> str | None:
    """The message of the subjects' newest Protobuf file whose fields are ``columns``, an
    existing table's (:func:`.protobuf_types.message_of_columns`); None when none is."""
    from kafka_delta.decoding.protobuf_types import message_of_columns, protobuf_file

    registry = registry_for(settings)
    for topic in topics:
        versions = registry.subject_versions(f"{topic}-{part}")
        schema = versions[-1] if versions else None
        schema_id = getattr(schema, "schema_id", None)
        if schema is None or getattr(schema, "schema_type", "") != "PROTOBUF" or schema_id is None:
            continue
        serialized = registry.schema_by_id(schema_id, fmt="serialized")
        text = serialized.schema_str if serialized is not None else schema.schema_str
        try:
            file = protobuf_file(text, registry.protobuf_imports(schema_id))
        except SchemaFileError:
            continue
        found = message_of_columns(file, columns)
        if found is not None:
            return found
    return None


def _arrow_of(
    fmt: FormatConfig, schema: object, part: str, registry: object = None
) -> pa.Schema | None:
    """The columns of a registered schema; None for a Protobuf file without the message
    ``fmt.message`` names (a version before the message was added: its records, of other
    messages, are dead letters)."""
    kind = getattr(schema, "schema_type", None) or "AVRO"
    text = getattr(schema, "schema_str", schema)
    expected = {"avro": "AVRO", "protobuf": "PROTOBUF", "json": "JSON", "json_schema": "JSON"}[
        fmt.format
    ]
    if kind.upper() != expected:
        raise SchemaFileError(
            f"decoding.{part}.format is {fmt.format}, but the registry holds a {kind} schema for it"
        )
    if fmt.format == "avro":
        return avro_to_arrow(text)
    if fmt.format in ("json", "json_schema"):
        return json_schema_to_arrow(text)[0]
    return _protobuf_arrow(fmt, schema, text, registry)


def _protobuf_arrow(
    fmt: FormatConfig, schema: object, text: str, registry: object
) -> pa.Schema | None:
    """The columns of a registered Protobuf schema: its file in the registry's serialized form
    with its references resolved, and the message ``fmt.message`` names, else the file's
    default message (protobuf_types: its one top-level message, or the one no other uses)."""
    from kafka_delta.decoding.protobuf_types import find_message, message_to_arrow, protobuf_file

    schema_id = getattr(schema, "schema_id", None)
    imports: list[tuple[str, str]] = []
    if registry is not None and schema_id is not None:
        serialized = registry.schema_by_id(schema_id, fmt="serialized")  # type: ignore[attr-defined]
        if serialized is not None:
            text = serialized.schema_str
        imports = registry.protobuf_imports(schema_id)  # type: ignore[attr-defined]
    file = protobuf_file(text, imports)
    if fmt.message:
        try:
            file.pool.FindMessageTypeByName(fmt.message)
        except KeyError:
            return None
    return message_to_arrow(find_message(file, fmt.message))
