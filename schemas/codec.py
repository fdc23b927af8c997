"""msgpack on the wire; JSON accepted on input for humans and other languages.

A record whose first non-blank byte is ``{`` or ``[`` is read as JSON (a msgpack map or array of
that size is never a whole valid record of ours), anything else as msgpack. Decoders are cached
per type: building one costs more than decoding a small record.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from epochal.errors import SchemaError

__all__ = ["decode", "encode"]

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_JSON_STARTS = frozenset(b"{[")
_decoders: dict[Any, tuple[msgspec.msgpack.Decoder[Any], msgspec.json.Decoder[Any]]] = {}


def encode(record: object) -> bytes:
    """msgpack bytes of a record."""
    return _encoder.encode(record)


def decode(data: bytes, record_type: type[T]) -> T:
    """A record of ``record_type`` from msgpack or JSON bytes, or a SchemaError saying why not."""
    decoders = _decoders.get(record_type)
    if decoders is None:
        decoders = (msgspec.msgpack.Decoder(record_type), msgspec.json.Decoder(record_type))
        _decoders[record_type] = decoders
    head = data.lstrip()[:1]
    is_json = bool(head) and head[0] in _JSON_STARTS
    try:
        record: T = decoders[1].decode(data) if is_json else decoders[0].decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        kind = "JSON" if is_json else "msgpack"
        name = getattr(record_type, "__name__", None) or str(record_type)  # unions have no name
        raise SchemaError(f"not a valid {kind} {name}: {exc}", record_type=name) from exc
    return record
