"""Actor schemas as data: what each snapshot records of the state types that wrote it.

A start compares the schemas recorded with the latest snapshot to the app's
(:mod:`epochal.schemas.evolution`), so a field renamed or retyped is caught before any value is
decoded as something it is not. A schema is, per field (by the name it is encoded under), the
field's type as text and its default as JSON:

    >>> actor_schema(Account)
    {'balance': FieldSchema(type='int', default='0'), 'fee_paid': FieldSchema(type='int', ...)}

The text of a type is canonical (a union's members sorted, a nested Struct spelled out with its
fields), so two schemas are equal exactly when their texts are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import msgspec.inspect as mi

__all__ = [
    "RESERVED_COLUMNS",
    "ActorSchema",
    "FieldSchema",
    "actor_schema",
    "schemas_of",
    "type_text",
    "union_members",
]

RESERVED_COLUMNS = frozenset({"_key", "_state", "_ssid", "_epoch", "_deleted"})
"""The snapshot tables' own columns (:mod:`epochal.schemas.arrow`): no actor field may use
these names (checked when an actor type is registered)."""


class FieldSchema(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One field of an actor type: its type as text, its default as JSON ("" when the default
    has no JSON form)."""

    type: str
    default: str = ""


ActorSchema = dict[str, FieldSchema]
"""An actor type's fields by encoded name, in declaration order."""

_NAMES: dict[type[mi.Type], str] = {
    mi.AnyType: "any",
    mi.NoneType: "None",
    mi.BoolType: "bool",
    mi.IntType: "int",
    mi.FloatType: "float",
    mi.StrType: "str",
    mi.BytesType: "bytes",
    mi.ByteArrayType: "bytearray",
    mi.MemoryViewType: "memoryview",
    mi.DateTimeType: "datetime",
    mi.DateType: "date",
    mi.TimeType: "time",
    mi.TimeDeltaType: "timedelta",
    mi.UUIDType: "uuid",
    mi.DecimalType: "decimal",
    mi.RawType: "raw",
    mi.ExtType: "ext",
}
_SEQUENCES: dict[type[mi.Type], str] = {
    mi.ListType: "list",
    mi.SetType: "set",
    mi.FrozenSetType: "frozenset",
}


def type_text(info: mi.Type, seen: frozenset[type] = frozenset()) -> str:
    """``info`` as canonical text: ``int``, ``list[str]``, ``float | None``,
    ``Money{amount: int, currency: str}`` (a Struct already being spelled out, a recursive one,
    is its name alone)."""
    name = _NAMES.get(type(info))
    if name is not None:
        return name
    for kinds, text in _COMPOUND:
        if isinstance(info, kinds):
            return text(info, seen)
    return type(info).__name__  # a kind msgspec adds later: its name, compared as it is


def _sequence_text(info: Any, seen: frozenset[type]) -> str:
    if isinstance(info, mi.VarTupleType):
        return f"tuple[{type_text(info.item_type, seen)}, ...]"
    if isinstance(info, mi.TupleType):
        return f"tuple[{', '.join(type_text(t, seen) for t in info.item_types)}]"
    return f"{_SEQUENCES[type(info)]}[{type_text(info.item_type, seen)}]"


def _choice_text(info: Any, seen: frozenset[type]) -> str:
    if isinstance(info, mi.LiteralType):
        return f"literal[{', '.join(sorted(repr(v) for v in info.values))}]"
    values = sorted(repr(member.value) for member in info.cls)
    return f"enum {info.cls.__name__}[{', '.join(values)}]"


def _record_text(info: Any, seen: frozenset[type]) -> str:
    name: str = info.cls.__name__
    if info.cls in seen:
        return name
    inner = seen | {info.cls}
    fields = ", ".join(
        f"{getattr(f, 'encode_name', f.name)}: {type_text(f.type, inner)}" for f in info.fields
    )
    array_like = getattr(info, "array_like", False) or isinstance(info, mi.NamedTupleType)
    tag = getattr(info, "tag", None)
    head = f"{name}(tag={tag!r})" if tag is not None else name
    return f"{head}[{fields}]" if array_like else f"{head}{{{fields}}}"


_COMPOUND: tuple[tuple[Any, Callable[[Any, frozenset[type]], str]], ...] = (
    (mi.Metadata, lambda info, seen: type_text(info.type, seen)),
    ((mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType, mi.TupleType), _sequence_text),
    (
        (mi.DictType, mi.FrozenDictType),
        lambda info, seen: (
            f"dict[{type_text(info.key_type, seen)}, {type_text(info.value_type, seen)}]"
        ),
    ),
    (mi.UnionType, lambda info, seen: " | ".join(sorted(type_text(t, seen) for t in info.types))),
    ((mi.LiteralType, mi.EnumType), _choice_text),
    ((mi.StructType, mi.DataclassType, mi.TypedDictType, mi.NamedTupleType), _record_text),
    (mi.CustomType, lambda info, seen: f"custom {info.cls.__qualname__}"),
)


def union_members(text: str) -> list[str]:
    """The members of a union's text (one member for any other type), split at its top level."""
    members, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif depth == 0 and text.startswith(" | ", i):
            members.append(text[start:i])
            start = i + 3
    members.append(text[start:])
    return members


def _default_json(field: mi.Field) -> str:
    if field.default is not msgspec.NODEFAULT:
        value = field.default
    elif field.default_factory is not msgspec.NODEFAULT:
        value = field.default_factory()
    else:
        return ""
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        return ""


def actor_schema(state: type[msgspec.Struct]) -> ActorSchema:
    """The schema of one actor type's state class."""
    info = mi.type_info(state)
    assert isinstance(info, mi.StructType)
    return {
        f.encode_name: FieldSchema(type_text(f.type, frozenset({state})), _default_json(f))
        for f in info.fields
    }


def schemas_of(states: Mapping[str, type[msgspec.Struct]]) -> dict[str, ActorSchema]:
    """The schema of each actor type, by the type's name."""
    return {name: actor_schema(state) for name, state in states.items()}
