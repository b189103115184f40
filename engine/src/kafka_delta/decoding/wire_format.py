"""Confluent's wire format: which schema a record was written with, and where its bytes begin.

- magic byte 0, then the schema id as 4 bytes big-endian, then the payload; for Protobuf the
  payload starts with the message indexes (a zigzag varint count, then that many varints; a
  single 0 byte is the common ``[0]``, the file's first message);
- or the id in a ``__value_schema_id`` / ``__key_schema_id`` header: magic byte 1 and a 16-byte
  GUID (confluent-kafka's ``header_schema_id_serializer``); the value is then all payload
  (Protobuf's message indexes still lead it).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

HEADER = {"value": "__value_schema_id", "key": "__key_schema_id"}


@dataclass(frozen=True)
class Frame:
    schema: int | str  # the id, or a GUID (from the header)
    start: int  # where the payload begins
    indexes: tuple[int, ...] = ()  # Protobuf's message indexes


def header_guids(headers: Sequence[Any], part: str) -> list[bytes | None]:
    """Per record, the schema header's value, when the producer set one."""
    name = HEADER[part]
    if not any(headers):
        return [None] * len(headers)
    out: list[bytes | None] = []
    for h in headers:
        found = None
        if h:
            for entry in h:
                if entry["key"] == name:
                    found = entry["value"]
        out.append(found)
    return out


def _varint(data: bytes, at: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if at >= len(data):
            raise ValueError("the message indexes end before the record does")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at  # zigzag
        shift += 7
        if shift > 63:
            raise ValueError("a message index is not a varint")


def parse(data: bytes, header: bytes | None, protobuf: bool) -> Frame | str:
    """The record's frame, or the reason it has none (the record is then a dead letter)."""
    start = 0
    if header is not None:
        if len(header) != 17 or header[0] != 1:
            return f"schema id header of {len(header)} bytes is not magic byte 1 + a 16-byte GUID"
        schema: int | str = str(uuid.UUID(bytes=bytes(header[1:])))
    else:
        if len(data) < 5:
            if data[:1] not in (b"", b"\x00"):
                return f"wrong magic byte 0x{data[0]:02x}: not Confluent framing (0x00 + schema id)"
            return f"truncated record: {len(data)} bytes, shorter than the 5-byte schema id header"
        if data[0] != 0:
            return f"wrong magic byte 0x{data[0]:02x}: not Confluent framing (0x00 + schema id)"
        schema = int.from_bytes(data[1:5], "big")
        start = 5
    if not protobuf:
        return Frame(schema, start)
    try:
        count, at = _varint(data, start)
        if count == 0:
            return Frame(schema, at, (0,))
        if count < 0 or count > 100:
            return f"message index count {count} is not valid"
        indexes = []
        for _ in range(count):
            index, at = _varint(data, at)
            indexes.append(index)
    except ValueError as exc:
        return f"truncated record: {exc}"
    return Frame(schema, at, tuple(indexes))
