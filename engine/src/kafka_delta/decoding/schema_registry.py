"""The Schema Registry, as the decoder sees it: confluent-kafka's ``SchemaRegistryClient``, one
per process and settings, with schemas cached by id (a registered id never changes its schema).

A failed look-up is never cached: an unknown id is asked again next time (it may be registered
since), and a registry that did not answer is asked again when the batch runs again. What a
failure means is decided here once: 404 is an unknown schema (the record is a dead letter);
no answer, a timeout, 5xx or refused credentials is :class:`RegistryUnavailableError` (the batch
stops before its commit, and the run retries).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from kafka_delta.decoding.spec import RegistrySettings, RegistryUnavailableError, SchemaFileError

_lock = threading.Lock()
_registries: dict[RegistrySettings, Registry] = {}


@dataclass(frozen=True)
class RegisteredSchema:
    schema_id: int | str  # the id, or the GUID for schemas named by one
    schema_type: str  # AVRO, PROTOBUF, JSON
    schema_str: str


def registry_for(settings: RegistrySettings) -> Registry:
    """The process's registry for ``settings`` (read tasks of one Python worker share it)."""
    with _lock:
        registry = _registries.get(settings)
        if registry is None:
            registry = _registries[settings] = Registry(settings)
        return registry


def client_config(settings: RegistrySettings, environ: dict[str, str] | None = None) -> dict:
    """confluent-kafka's client settings; the credentials come from the environment variables
    the settings name, here, and go nowhere else."""
    env = os.environ if environ is None else environ

    def secret(name: str | None, what: str) -> str:
        value = env.get(name or "")
        if not value:
            raise SchemaFileError(
                f"decoding.schema_registry.{what} names the environment variable {name}, which "
                "is not set in this process"
            )
        return value

    conf: dict[str, Any] = {
        "url": settings.url,
        "timeout": settings.timeout_seconds,
        # Retries are the pipeline's (the whole batch, with a growing wait), not the client's.
        "max.retries": 0,
    }
    if settings.auth == "basic":
        user = secret(settings.user_env, "user_env")
        password = secret(settings.password_env, "password_env")
        conf["basic.auth.user.info"] = f"{user}:{password}"
    elif settings.auth == "bearer":
        conf["bearer.auth.credentials.source"] = "STATIC_TOKEN"
        conf["bearer.auth.token"] = secret(settings.token_env, "token_env")
    for key, value in (
        ("ssl.ca.location", settings.ca_location),
        ("ssl.certificate.location", settings.cert_location),
        ("ssl.key.location", settings.key_location),
    ):
        if value:
            conf[key] = value
    return conf


class Registry:
    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
        self._client: Any = None
        self._by_id: dict[tuple[int | str, str | None], RegisteredSchema] = {}
        self._subjects: dict[int, tuple[str, ...]] = {}
        self._imports: dict[tuple[int | str, str], list[tuple[str, str]]] = {}

    @property
    def client(self) -> Any:
        if self._client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            self._client = SchemaRegistryClient(client_config(self.settings))
        return self._client

    def _call(self, what: str, call: Any) -> Any:
        """``call()``; None when the registry says the schema or subject does not exist."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return call()
        except SchemaRegistryError as exc:
            status = getattr(exc, "http_status_code", None)
            if status == 404:
                return None
            raise RegistryUnavailableError(
                f"the Schema Registry at {self.settings.url} failed {what}: HTTP {status} "
                f"{getattr(exc, 'error_message', exc)}"
            ) from None
        except SchemaFileError:
            raise
        except Exception as exc:  # no answer: connection refused, timeout, TLS, DNS
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise RegistryUnavailableError(
                f"the Schema Registry at {self.settings.url} is unreachable ({what}: {reason})"
            ) from None

    def schema_by_id(self, schema_id: int, fmt: str | None = None) -> RegisteredSchema | None:
        """The schema of ``schema_id`` (protobuf: ``fmt="serialized"``, a base64 descriptor);
        None when the registry does not know the id."""
        key = (schema_id, fmt)
        found = self._by_id.get(key)
        if found is None:
            schema = self._call(
                f"to look up schema id {schema_id}",
                lambda: self.client.get_schema(schema_id, fmt=fmt),
            )
            if schema is None:
                return None
            found = self._by_id[key] = RegisteredSchema(
                schema_id, (schema.schema_type or "AVRO").upper(), schema.schema_str
            )
        return found

    def subjects_of(self, schema_id: int, fresh: bool = False) -> tuple[str, ...] | None:
        """The subjects ``schema_id`` is registered under (``GET /schemas/ids/{id}/subjects``);
        None when the registry does not know the id. Cached, but an id's subjects can grow
        (the same schema registered under another subject): ``fresh`` asks again."""
        found = None if fresh else self._subjects.get(schema_id)
        if found is None:
            subjects = self._call(
                f"to list the subjects of schema id {schema_id}",
                lambda: self.client.get_subjects_by_schema_id(schema_id),
            )
            if subjects is None:
                return None
            found = self._subjects[schema_id] = tuple(subjects)
        return found

    def schema_by_guid(self, guid: str, fmt: str | None = None) -> RegisteredSchema | None:
        key = (guid, fmt)
        found = self._by_id.get(key)
        if found is None:
            schema = self._call(
                f"to look up schema guid {guid}",
                lambda: self.client.get_schema_by_guid(guid, fmt=fmt),
            )
            if schema is None:
                return None
            found = self._by_id[key] = RegisteredSchema(
                guid, (schema.schema_type or "AVRO").upper(), schema.schema_str
            )
        return found

    def subject_versions(self, subject: str, fmt: str | None = None) -> list[RegisteredSchema]:
        """Every live version registered under ``subject``, oldest first ([] for none)."""
        versions = self._call(
            f"to list the versions of {subject}", lambda: self.client.get_versions(subject)
        )
        out = []
        for version in versions or []:
            registered = self._call(
                f"to read version {version} of {subject}",
                lambda v=version: self.client.get_version(subject, v, fmt=fmt),
            )
            if registered is None:
                continue
            schema = registered.schema
            out.append(
                RegisteredSchema(
                    registered.schema_id,
                    (schema.schema_type or "AVRO").upper(),
                    schema.schema_str,
                )
            )
        return out

    def protobuf_imports(self, ref: int | str) -> list[tuple[str, str]]:
        """The files the Protobuf schema ``ref`` (an id, or a GUID) imports through schema
        references, recursively: (import name, base64 FileDescriptorProto), each before the files
        importing it; [] without references. Confluent's serializer registers each imported file
        as a subject of its own; well-known imports need no reference."""
        key = (ref, "imports")
        if key in self._imports:
            return self._imports[key]
        top = self._call(
            f"to look up the references of schema {ref}",
            lambda: (
                self.client.get_schema_by_guid(ref, fmt="serialized")
                if isinstance(ref, str)
                else self.client.get_schema(ref, fmt="serialized")
            ),
        )
        out: list[tuple[str, str]] = []
        seen: set[str] = set()

        def visit(references: Any) -> None:
            for r in references or []:
                if r.name in seen:
                    continue
                seen.add(r.name)
                found = self._call(
                    f"to read reference {r.name} ({r.subject} version {r.version})",
                    lambda r=r: self.client.get_version(r.subject, r.version, fmt="serialized"),
                )
                if found is None:
                    raise SchemaFileError(
                        f"schema {ref} imports {r.name}, whose subject {r.subject} version "
                        f"{r.version} the Schema Registry does not have"
                    )
                visit(found.schema.references)
                out.append((r.name, found.schema.schema_str))

        visit(getattr(top, "references", None))
        self._imports[key] = out
        return out
