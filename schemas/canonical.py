"""Canonical values: the one encoding of a value that every executor stores, sends and hashes.

Actor state, emitted events and logged events are kept as *canonical msgpack bytes*: encoded
once, validated by decoding them against their schema, and re-encoded from the decoded value
where decoding may coerce (an ``int`` in a ``float`` field becomes ``3.0``). Encoding follows the
value's own order (dict insertion order, a set's iteration order), which is deterministic because
every executor computes the value the same way under ``PYTHONHASHSEED=0`` (msgspec's sorted
encoding would refuse dicts with int keys). Every participant of a transaction decodes the same
bytes, so every handler sees equal values of equal types wherever it runs, and nothing a handler
holds is shared with the store (docs/concepts.md).

Nesting is bounded by :data:`MAX_NESTING`: msgspec recurses on the C stack and fails with
RecursionError at a depth that depends on the caller's own stack, which would differ between a
sequencer that accepted a value and a worker that decodes it. A schema whose depth is bounded
statically (no ``Any``, no recursive Struct) is never walked at run time.

    >>> data, value = canonical(Account(balance=5), Account)
    >>> decode_canonical(data, Account) == value
    True
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
import typing
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec
import msgspec.inspect as mi

from epochal.errors import SchemaError

__all__ = [
    "MAX_NESTING",
    "Codec",
    "canonical",
    "codec_for",
    "decode_canonical",
    "encode_canonical",
    "nesting_exceeds",
]

T = TypeVar("T")

MAX_NESTING = 100
"""Deepest nesting of containers accepted in an event or a state value (the value itself is 1)."""

_encoder = msgspec.msgpack.Encoder()

# decoding one of these never changes the value's msgpack form
_EXACT = (
    mi.IntType, mi.StrType, mi.BoolType, mi.BytesType, mi.NoneType, mi.LiteralType, mi.AnyType,
)  # fmt: skip
_CONTAINERS = (list, tuple, set, frozenset, dict)
_NESTING = (msgspec.Struct, *_CONTAINERS)


class Codec(Generic[T]):
    """The canonical form of one schema: its decoder, and what making a value canonical takes
    (a walk for unbounded nesting, a re-encode where decoding may coerce), decided once.

    >>> codec = codec_for(Account); data, value = codec.canonical(Account(5))
    >>> codec.decode(data) == value
    True
    """

    __slots__ = ("_reencode", "_walk", "decode", "decode_checked", "type")

    def __init__(self, record_type: type[T]) -> None:
        self.type = record_type
        self.decode: Callable[[bytes], T] = msgspec.msgpack.Decoder(record_type).decode
        try:
            unconstrained = _unconstrained(record_type)
        except Exception:  # a type msgspec decodes but not one to rebuild: check as before
            unconstrained = None
        self.decode_checked: Callable[[bytes], T] = unconstrained or self.decode
        """:attr:`decode` for bytes this very schema checked already (an event logged by the
        code that runs it): the same value, without its fields' constraints checked again."""
        schema: Any = record_type  # types are hashable; mypy cannot see it through type[T]
        depth, self._reencode = _shape(schema)
        self._walk = depth is None or depth > MAX_NESTING

    def encode_decoded(self, value: T) -> bytes:
        """The canonical bytes of a value this schema's decoder just made (from JSON, say): it
        is valid and coerced already, so only its nesting and its encoding are left to check."""
        if self._walk and nesting_exceeds(value):
            raise SchemaError(f"nested deeper than {MAX_NESTING} levels")
        try:
            return _encoder.encode(value)
        except (TypeError, ValueError, OverflowError) as exc:  # an int wider than 64 bits
            raise SchemaError(f"does not encode: {exc}") from exc

    def canonical(self, value: object) -> tuple[bytes, T]:
        """The canonical bytes of ``value`` and the value decoded from them.

        Raises SchemaError saying what is wrong (with msgspec's path, e.g. ``$.balance``): a
        value that does not encode, does not match the schema, or nests deeper than
        :data:`MAX_NESTING`.
        """
        if self._walk and nesting_exceeds(value):
            raise SchemaError(f"nested deeper than {MAX_NESTING} levels")
        try:
            data = _encoder.encode(value)
        except (TypeError, ValueError, OverflowError) as exc:  # unencodable, int > 64 bits
            raise SchemaError(f"does not encode: {exc}") from exc
        try:
            decoded = self.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise SchemaError(str(exc)) from exc
        if self._reencode:
            data = _encoder.encode(decoded)
        return data, decoded


def _unconstrained(record_type: Any) -> Callable[[bytes], Any] | None:
    """A decoder of ``record_type`` that skips the ``msgspec.Meta`` constraints of its fields
    (a ``pattern`` is a regex search each time, most of the decode): a twin Struct without
    them decodes, and the value is rebuilt as ``record_type``, whose ``__init__`` checks
    nothing. None where there is nothing to skip, or the type is not one rebuilt so simply: a
    Struct with a ``__post_init__`` (it could raise outside the decoder), keyword-only fields."""
    if not (isinstance(record_type, type) and issubclass(record_type, msgspec.Struct)):
        return None
    fields = msgspec.structs.fields(record_type)
    bare = [_bare(f.type) for f in fields]
    if all(b is f.type for b, f in zip(bare, fields, strict=True)) or hasattr(
        record_type, "__post_init__"
    ):
        return None
    kinds = {p.kind for p in inspect.signature(record_type).parameters.values()}
    if kinds - {inspect.Parameter.POSITIONAL_OR_KEYWORD}:
        return None
    config = record_type.__struct_config__
    twin: Any = msgspec.defstruct(
        record_type.__name__,
        [_field(f, b) for f, b in zip(fields, bare, strict=True)],
        tag=config.tag,
        tag_field=config.tag_field,
        array_like=config.array_like,
        rename={f.name: f.encode_name for f in fields},
        forbid_unknown_fields=config.forbid_unknown_fields,
        omit_defaults=config.omit_defaults,
    )
    decode = msgspec.msgpack.Decoder(twin).decode
    values = operator.attrgetter(*(f.name for f in fields))
    if len(fields) == 1:
        return lambda data: record_type(values(decode(data)))
    return lambda data: record_type(*values(decode(data)))


def _bare(field_type: Any) -> Any:
    """``Annotated[T, Meta(...)]`` → ``T``; any other type as it is."""
    if typing.get_origin(field_type) is typing.Annotated:
        return typing.get_args(field_type)[0]
    return field_type


def _field(info: msgspec.structs.FieldInfo, field_type: Any) -> tuple[Any, ...]:
    """``info`` as a :func:`msgspec.defstruct` field of ``field_type``, with its default."""
    if info.default_factory is not msgspec.NODEFAULT:
        return (info.name, field_type, msgspec.field(default_factory=info.default_factory))
    if info.default is not msgspec.NODEFAULT:
        return (info.name, field_type, info.default)
    return (info.name, field_type)


_codecs: dict[Any, Codec[Any]] = {}


def codec_for(record_type: Any) -> Codec[Any]:
    """The :class:`Codec` of a schema (one per type, built on first use)."""
    codec = _codecs.get(record_type)
    if codec is None:
        codec = _codecs[record_type] = Codec(record_type)
    return codec


def encode_canonical(value: object) -> bytes:
    """The msgpack of a value that is already canonical (decoded from canonical bytes)."""
    return _encoder.encode(value)


def decode_canonical(data: bytes, record_type: type[T]) -> T:
    """A fresh value from canonical bytes (which were validated when they were made)."""
    schema: Any = record_type
    value: T = codec_for(schema).decode(data)
    return value


@functools.cache
def _shape(record_type: Any) -> tuple[int | None, bool]:  # types are hashable
    """(static nesting depth or None if unbounded, whether decoding may change the bytes)."""
    return _walk_type(mi.type_info(record_type), frozenset())


def _walk_type(info: mi.Type, seen: frozenset[int]) -> tuple[int | None, bool]:
    if isinstance(info, mi.AnyType):
        return None, False
    if isinstance(info, _EXACT):
        return 0, False
    children: list[mi.Type] = []
    exact = True
    if isinstance(info, mi.StructType | mi.DataclassType | mi.TypedDictType | mi.NamedTupleType):
        if id(info) in seen:
            return None, True  # a recursive type: unbounded
        seen = seen | {id(info)}
        children = [f.type for f in info.fields]
    elif isinstance(info, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        children = [info.item_type]
    elif isinstance(info, mi.TupleType):
        children = list(info.item_types)
    elif isinstance(info, mi.DictType):
        children = [info.key_type, info.value_type]
    elif isinstance(info, mi.UnionType):
        depths = [_walk_type(t, seen) for t in info.types]
        bounded = [d for d, _ in depths]
        depth = None if None in bounded else max(d for d in bounded if d is not None)
        return depth, any(changes for _, changes in depths)
    else:  # float, datetime, decimal, enum, ...: decoding may coerce; re-encode to be sure
        return 0, True
    depth = 0
    for child in children:
        child_depth, changes = _walk_type(child, seen)
        exact = exact and not changes
        depth = None if depth is None or child_depth is None else max(depth, child_depth)
    return (None if depth is None else depth + 1), not exact


def nesting_exceeds(value: object, limit: int = MAX_NESTING) -> bool:
    """True if ``value`` nests containers deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, msgspec.Struct):
            children: Any = (getattr(item, f) for f in item.__struct_fields__)
        elif isinstance(item, dict):
            children = (*item.keys(), *item.values())
        elif isinstance(item, _CONTAINERS):
            children = item
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            children = (getattr(item, f.name) for f in dataclasses.fields(item))
        else:
            continue
        for child in children:
            if isinstance(child, _NESTING) or dataclasses.is_dataclass(child):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def canonical(value: object, record_type: type[T]) -> tuple[bytes, T]:
    """``codec_for(record_type).canonical(value)``."""
    schema: Any = record_type
    data, decoded = codec_for(schema).canonical(value)
    return data, decoded
