"""Which changes of an actor schema a snapshot's values survive, field by field.

The values of a snapshot are msgpack maps by field name, decoded with the running code's state
class. So, from the schema the snapshot records to the app's:

- a field **added** (every field has a default) decodes as its default: fine;
- a number **widened** (``int`` to ``float``, ``T`` to ``T | None``, a union gaining members)
  decodes as it was: fine;
- a field **removed** drops its value: fine only if no actor holds anything but its default
  (a rename is a removal and an addition, and would silently reset every value);
- any other **retyped** field would fail to decode, or decode as something else;
- an actor type added starts empty; one removed leaves its actors behind in the warehouse.

A change that is not fine needs a migration (``@app.migration``), which turns each old value
into the new one. :func:`schema_changes` lists the changes; the start decides from them
(:mod:`epochal.recovery.schema_evolution`).

    >>> [c.describe() for c in schema_changes({"Account": {"balance": FieldSchema("int")}},
    ...                                         {"Account": {"amount": FieldSchema("int")}})]
    ['Account.balance: int -> - (removed)', 'Account.amount: - -> int (added)']
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from epochal.schemas.actor_schemas import ActorSchema, FieldSchema, union_members

__all__ = ["ChangeKind", "FieldChange", "schema_changes", "widens"]


class ChangeKind(enum.Enum):
    """What changed of one field (or one actor type) between two schemas."""

    ADDED = "added"
    WIDENED = "widened"
    REMOVED = "removed"
    RETYPED = "retyped"
    TYPE_ADDED = "actor type added"
    TYPE_REMOVED = "actor type removed"


@dataclass(frozen=True)
class FieldChange:
    """One change from an old schema to a new one; ``field`` is "" for a whole actor type."""

    actor_type: str
    field: str
    kind: ChangeKind
    old: FieldSchema | None = None
    new: FieldSchema | None = None

    def describe(self) -> str:
        """``Account.balance: int -> float (widened)``, for logs and refusals."""
        if not self.field:
            return f"{self.actor_type} ({self.kind.value})"
        old = self.old.type if self.old else "-"
        new = self.new.type if self.new else "-"
        return f"{self.actor_type}.{self.field}: {old} -> {new} ({self.kind.value})"


def widens(old: str, new: str) -> bool:
    """Whether every value of type text ``old`` is a value of ``new`` with the same meaning:
    each member of ``old`` is one of ``new``'s, an ``int`` may become a ``float``."""
    members = set(union_members(new))
    return all(m in members or (m == "int" and "float" in members) for m in union_members(old))


def schema_changes(
    old: Mapping[str, ActorSchema], new: Mapping[str, ActorSchema]
) -> list[FieldChange]:
    """Every change from ``old`` to ``new`` (schemas by actor type), in a stable order: the
    types as ``new`` lists them, then the removed ones; within a type, the old fields, then the
    added ones."""
    changes: list[FieldChange] = []
    for name, fields in new.items():
        before = old.get(name)
        if before is None:
            changes.append(FieldChange(name, "", ChangeKind.TYPE_ADDED))
            continue
        for field, was in before.items():
            now = fields.get(field)
            if now is None:
                changes.append(FieldChange(name, field, ChangeKind.REMOVED, was, None))
            elif now.type != was.type:
                kind = ChangeKind.WIDENED if widens(was.type, now.type) else ChangeKind.RETYPED
                changes.append(FieldChange(name, field, kind, was, now))
        changes += [
            FieldChange(name, field, ChangeKind.ADDED, None, now)
            for field, now in fields.items()
            if field not in before
        ]
    changes += [FieldChange(n, "", ChangeKind.TYPE_REMOVED) for n in old if n not in new]
    return changes
