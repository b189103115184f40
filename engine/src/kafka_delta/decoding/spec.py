"""What a read task needs to decode records: the :class:`DecodeSpec` the driver resolves once
(:mod:`.resolve`) and hands to every task as one JSON string, and the decoder's errors.

Errors are of two kinds. A record that cannot be decoded is never an exception: it gets an
``_error`` and becomes a dead letter. An exception stops the batch before any commit: the
registry is down (:class:`RegistryUnavailableError`, retried), the producers' schema gained
fields the reader lacks (:class:`SchemaChangedError`, the query restarts with them), Protobuf
records carry another message than the reader's guess (:class:`MessageSeenError`, the query
restarts with that message's columns), or changed
in a way the table cannot follow (:class:`SchemaIncompatibleError`, the run stops).
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

import pyarrow as pa


class SchemaFileError(ValueError):
    """A schema file, or a schema the registry returned, that cannot be used."""


class SchemaIncompatibleError(ValueError):
    """The producers' schema changed in a way the table cannot follow."""


class SchemaChangedError(ValueError):
    """Records carry a writer schema with fields the reader schema lacks."""

    def __init__(self, fields: tuple[str, ...], schema_id: int | str | None) -> None:
        self.fields = tuple(fields)
        self.schema_id = schema_id
        super().__init__(
            f"writer schema (schema id {schema_id}) has field(s) {', '.join(fields)} that the "
            "reader schema lacks; nothing of the batch was written (with delta.schema_evolution: "
            "add_columns the table gains them)"
        )


class MessageSeenError(ValueError):
    """Protobuf without ``message:``: a batch's records carry another message than the one the
    reader schema was made from (the file's default, a guess) and none carry that one. The
    table takes the message its records carry: the query restarts with that message's columns
    (:func:`.resolve.decode_spec`'s ``message_seen``), which then holds for the run."""

    def __init__(self, message: str, schema_id: int | str | None, guessed: str) -> None:
        self.message = message
        self.schema_id = schema_id
        super().__init__(
            f"the records carry protobuf message {message} (schema id {schema_id}), not "
            f"{guessed}, the file's default the columns were made from; nothing of the batch was "
            f"written (the query restarts with the columns of {message})"
        )


class RegistryUnavailableError(RuntimeError):
    """The Schema Registry did not answer (down, timed out, 5xx, refused the credentials)."""


Format = Literal["json", "json_schema", "avro", "protobuf", "raw"]


def _schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


@dataclass(frozen=True)
class RegistrySettings:
    """How to reach the registry: ``decoding.schema_registry`` of the config
    (:class:`kafka_delta.config.SchemaRegistryConfig`, same names) as the decoders in Spark's
    workers get it, without the run's own ``retry_seconds``. Credentials are the NAMES of
    environment variables, read by the process that calls the registry; their values are never
    in the spec."""

    url: str
    auth: Literal["none", "basic", "bearer"] = "none"
    user_env: str | None = None
    password_env: str | None = None
    token_env: str | None = None
    ca_location: str | None = None
    cert_location: str | None = None
    key_location: str | None = None
    timeout_seconds: float = 10.0


@dataclass(frozen=True)
class FieldSpec:
    """How the Kafka value (or key) is decoded, and into which columns (``reader``)."""

    format: Format
    framing: Literal["confluent", "none"]
    reader: pa.Schema
    writer_schema: str | None = None  # unframed: .avsc text, or base64 of a descriptor set
    message: str | None = None  # protobuf: the message's full name
    required: tuple[str, ...] = ()  # present and not null, or the record is a dead letter
    # The registry subjects a writer schema must be registered under (TopicNameStrategy:
    # <topic>-value); a record framed with another subject's schema is a dead letter.
    # Empty: any subject (record_name and topic_record_name strategies).
    subjects: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["reader"] = _schema_to_text(self.reader)
        data["required"] = list(self.required)
        data["subjects"] = list(self.subjects)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FieldSpec:
        return cls(
            **{
                **data,
                "reader": _schema_from_text(data["reader"]),
                "required": tuple(data["required"]),
                "subjects": tuple(data.get("subjects", ())),
            }
        )


@dataclass(frozen=True)
class DecodeSpec:
    value: FieldSpec
    key: FieldSpec | None = None  # None: the key stays its raw bytes
    registry: RegistrySettings | None = None
    # debezium: the value is a change event, unwrapped into the row's columns (:mod:`.envelope`)
    envelope: Literal["none", "debezium"] = "none"
    # Not empty: a tombstone (null value) is a delete of its key, whose fields fill these
    # columns (the merge keys); empty: a tombstone is a dead letter.
    tombstone_keys: tuple[str, ...] = ()

    @property
    def marks_ops(self) -> bool:
        """Whether the output has the ``_op`` column (:data:`kafka_delta.contract.OP_COLUMN`)."""
        return self.envelope != "none" or bool(self.tombstone_keys)

    @property
    def reads_headers(self) -> bool:
        """Whether a record's headers take part in decoding it: with Confluent framing a schema
        id may travel in a header instead of the value's first bytes."""
        return any(f is not None and f.framing == "confluent" for f in (self.value, self.key))

    def to_json(self) -> str:
        return json.dumps(
            {
                "value": self.value.to_dict(),
                "key": self.key.to_dict() if self.key else None,
                "registry": asdict(self.registry) if self.registry else None,
                "envelope": self.envelope,
                "tombstone_keys": list(self.tombstone_keys),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> DecodeSpec:
        data = json.loads(text)
        return cls(
            value=FieldSpec.from_dict(data["value"]),
            key=FieldSpec.from_dict(data["key"]) if data["key"] else None,
            registry=RegistrySettings(**data["registry"]) if data["registry"] else None,
            envelope=data.get("envelope", "none"),
            tombstone_keys=tuple(data.get("tombstone_keys", ())),
        )
