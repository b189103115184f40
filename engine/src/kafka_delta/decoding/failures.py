"""The decoder's failures as the driver sees them. An error raised in a read task comes back
from Spark as a ``StreamingQueryException`` whose text holds the Python traceback; these
helpers find the decoder's own sentence in it (or take the exception itself, when it was
raised on the driver while the reader schema was resolved)."""

from __future__ import annotations

import re

_SCHEMA_ID = re.compile(r"schema id (\d+)")
_FIELDS = re.compile(r"field\(s\) ([^:()]+?) (?:that|which|the reader)")


def reported(exc: BaseException, name: str) -> str | None:
    """The first line of the message of an exception of class ``name`` that ``exc`` is or
    carries in its text, else None."""
    if type(exc).__name__ == name:
        text = str(exc).strip()
        return text.splitlines()[0] if text else name
    marker = f"{name}: "
    text = str(exc)
    at = text.rfind(marker)
    if at < 0:
        return None
    return text[at + len(marker) :].splitlines()[0].strip()


def schema_changed(exc: BaseException) -> tuple[tuple[str, ...], int | None] | None:
    """(the new fields, the writer schema's registry id) when ``exc`` reports a
    ``SchemaChangedError``; else None."""
    if type(exc).__name__ == "SchemaChangedError":
        fields = tuple(getattr(exc, "fields", ()) or ())
        schema_id = getattr(exc, "schema_id", None)
        return fields, schema_id if isinstance(schema_id, int) else None
    sentence = reported(exc, "SchemaChangedError")
    if sentence is None:
        return None
    found = _SCHEMA_ID.search(sentence)
    names = _FIELDS.search(sentence)
    fields = tuple(n.strip(" '\"") for n in names.group(1).split(",")) if names else ()
    return fields, int(found.group(1)) if found else None


_MESSAGE = re.compile(r"carry protobuf message ([\w.]+) \(schema id ")


def message_seen(exc: BaseException) -> str | None:
    """The Protobuf message the records carry when ``exc`` reports a ``MessageSeenError``."""
    if type(exc).__name__ == "MessageSeenError":
        return getattr(exc, "message", None)
    sentence = reported(exc, "MessageSeenError")
    found = _MESSAGE.search(sentence) if sentence else None
    return found.group(1) if found else None


def registry_down(exc: BaseException) -> str | None:
    """The sentence of a ``RegistryUnavailableError`` that ``exc`` is or reports."""
    return reported(exc, "RegistryUnavailableError")
