"""msgpack on the wire; JSON accepted on input for humans and other languages.

A record whose first non-blank byte is ``{`` or ``[`` is read as JSON (a msgpack map or array of
that size is never a whole valid record of ours), anything else as msgpack. Decoders are cached
per type: building one costs more than decoding a small record.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

from epochal.errors import SchemaError

__all__ = ["Decoder", "array_header", "decode", "encode"]

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_JSON_STARTS = frozenset(b"{[")
_JSON_OR_SPACE = _JSON_STARTS | frozenset(b" \t\n\r\x0b\x0c")  # what bytes.lstrip strips
_decoders: dict[Any, Decoder[Any]] = {}


def encode(record: object) -> bytes:
    """msgpack bytes of a record."""
    return _encoder.encode(record)


def array_header(items: int) -> bytes:
    """The header of a msgpack array of ``items`` values (always the 32-bit form, which every
    reader takes): put before values already encoded, they decode as one array in one call."""
    return b"\xdd" + items.to_bytes(4, "big")


def decode(data: bytes, record_type: type[T]) -> T:
    """A record of ``record_type`` from msgpack or JSON bytes, or a SchemaError saying why not."""
    decoder: Decoder[T] | None = _decoders.get(record_type)
    if decoder is None:
        decoder = _decoders[record_type] = Decoder(record_type)
    return decoder(data)


class Decoder(Generic[T]):
    """:func:`decode` for one type, its decoders made once: what a hot loop holds on to (a
    Union's hash, to look its decoders up, costs about as much as decoding a small record)."""

    __slots__ = ("_json", "_msgpack", "_name")

    def __init__(self, record_type: type[T]) -> None:
        self._msgpack = msgspec.msgpack.Decoder(record_type)
        self._json = msgspec.json.Decoder(record_type)
        self._name = getattr(record_type, "__name__", None) or str(record_type)  # unions: none

    def __call__(self, data: bytes) -> T:
        is_json = False
        if data and data[0] in _JSON_OR_SPACE:  # else msgpack, with no copy to find out
            head = data.lstrip()[:1]
            is_json = bool(head) and head[0] in _JSON_STARTS
        try:
            record: T = self._json.decode(data) if is_json else self._msgpack.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            kind = "JSON" if is_json else "msgpack"
            raise SchemaError(f"not a valid {kind} {self._name}: {exc}",
                              record_type=self._name) from exc  # fmt: skip
        return record
