"""The bytes of egress records and dead letters in an app's :class:`EgressFormat`.

Every writer of ``<app>.out.*`` and ``<app>.dlq`` encodes through :func:`egress_codec`, and
every reader inside epochal decodes through it, by the app's format, never by sniffing: the
msgpack of the integer 123 is the byte ``{``. A codec is chosen once per app, so the msgpack
default costs one call per record, as before.

In JSON, an :class:`EgressRecord`'s ``value`` is the handler's record itself as a JSON value
(``null`` in an abort report), not the base64 of its msgpack; a :class:`DeadLetter`'s
``value``, the raw bytes of a bad input, stays bytes: base64. ``<app>.replies`` stays msgpack in
either format: only the client library reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from epochal.schemas.codec import encode
from epochal.schemas.commands import DeadLetter, InputPosition
from epochal.schemas.egress import EgressFormat, EgressRecord

__all__ = ["EgressCodec", "egress_codec", "json_value"]

T = TypeVar("T")

_json = msgspec.json.Encoder()
_NULL = msgspec.Raw(b"null")


class _JsonSource(msgspec.Struct, frozen=True):
    """:class:`InputPosition` as a JSON object (its msgpack is an array): named fields read."""

    topic: str
    partition: int
    offset: int


class _JsonEgressRecord(msgspec.Struct, frozen=True):
    """:class:`EgressRecord` as JSON: ``value`` is the record's own JSON, spliced in as is."""

    epoch: int
    seq: int
    handler: str
    committed: bool
    value: msgspec.Raw = _NULL
    reason: str = ""
    source: _JsonSource | None = None
    request_id: str = ""


_json_record_decoder = msgspec.json.Decoder(_JsonEgressRecord)
_json_dead_decoder = msgspec.json.Decoder(DeadLetter)
_msgpack_record_decoder = msgspec.msgpack.Decoder(EgressRecord)
_msgpack_dead_decoder = msgspec.msgpack.Decoder(DeadLetter)


def json_value(data: bytes) -> bytes:
    """The JSON of the record whose msgpack is ``data``; TypeError if it has none (a map
    keyed by arrays, say)."""
    return _json.encode(msgspec.msgpack.decode(data))


def _encode_json_record(r: EgressRecord) -> bytes:
    value = msgspec.Raw(json_value(r.value)) if r.value else _NULL
    s = r.source
    source = None if s is None else _JsonSource(s.topic, s.partition, s.offset)
    return _json.encode(_JsonEgressRecord(r.epoch, r.seq, r.handler, r.committed, value,
                                          r.reason, source, r.request_id))  # fmt: skip


def _decode_json_record(data: bytes) -> EgressRecord:
    j = _json_record_decoder.decode(data)
    value = bytes(j.value) if j.committed else b""  # an abort report's null is no value
    s = j.source
    source = None if s is None else InputPosition(s.topic, s.partition, s.offset)
    return EgressRecord(j.epoch, j.seq, j.handler, j.committed, value, j.reason, source,
                        j.request_id)  # fmt: skip


def _decode_msgpack_value(data: bytes, as_type: type[T]) -> T:
    return msgspec.msgpack.decode(data, type=as_type)


def _decode_json_value(data: bytes, as_type: type[T]) -> T:
    return msgspec.json.decode(data, type=as_type)


@dataclass(frozen=True)
class EgressCodec:
    """The encoders and decoders of one format, so callers pick the format once.

    ``check_value``: None, or what a transaction calls on the msgpack of each record it sends
    to egress, so one with no JSON form aborts it instead of failing the egress writer after
    the commit.
    """

    format: EgressFormat
    record: Callable[[EgressRecord], bytes]
    dead_letter: Callable[[DeadLetter], bytes]
    read_record: Callable[[bytes], EgressRecord]
    read_dead_letter: Callable[[bytes], DeadLetter]
    read_value: Callable[[bytes, Any], Any]
    """The handler's record from an :class:`EgressRecord`'s ``value``, as a given type."""
    check_value: Callable[[bytes], object] | None


_CODECS = {
    EgressFormat.MSGPACK: EgressCodec(
        EgressFormat.MSGPACK, encode, encode, _msgpack_record_decoder.decode,
        _msgpack_dead_decoder.decode, _decode_msgpack_value, None,
    ),
    EgressFormat.JSON: EgressCodec(
        EgressFormat.JSON, _encode_json_record, _json.encode, _decode_json_record,
        _json_dead_decoder.decode, _decode_json_value, json_value,
    ),
}  # fmt: skip


def egress_codec(egress_format: EgressFormat | str) -> EgressCodec:
    """The codec of ``egress_format`` (the enum or its value; ConfigError for another)."""
    return _CODECS[EgressFormat.of(egress_format)]
