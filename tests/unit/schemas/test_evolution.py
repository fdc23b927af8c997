"""Actor schemas as data, and which of their changes old values survive."""

from __future__ import annotations

import datetime
import enum
import importlib
from typing import Any, Literal

import msgspec
import pytest

from epochal.actors.api import App
from epochal.errors import ConfigError, SchemaError
from epochal.schemas.actor_schemas import FieldSchema, actor_schema, union_members
from epochal.schemas.evolution import ChangeKind, schema_changes, widens


class Money(msgspec.Struct):
    amount: int = 0
    currency: str = "EUR"


class Color(enum.Enum):
    RED = "r"
    GREEN = "g"


class Account(msgspec.Struct):
    balance: int = 0
    fee: float | None = None
    tags: list[str] = []
    wallets: dict[str, Money] = {}
    color: Color = Color.RED
    kind: Literal["a", "b"] = "a"
    opened: datetime.datetime = datetime.datetime(2020, 1, 1)
    parent: Account | None = None
    pair: tuple[int, str] = (1, "x")
    raw: bytes = b"\x00"


def test_a_schema_spells_every_type_canonically_with_its_default() -> None:
    schema = actor_schema(Account)
    assert {name: f.type for name, f in schema.items()} == {
        "balance": "int",
        "fee": "None | float",
        "tags": "list[str]",
        "wallets": "dict[str, Money{amount: int, currency: str}]",
        "color": "enum Color['g', 'r']",
        "kind": "literal['a', 'b']",
        "opened": "datetime",
        "parent": "Account | None",  # the type itself: its name, not an endless spelling
        "pair": "tuple[int, str]",
        "raw": "bytes",
    }
    assert schema["balance"].default == "0" and schema["tags"].default == "[]"
    assert schema["raw"].default == '"AA=="'  # base64, as JSON has it
    assert union_members("dict[str, int | None] | list[int | str]") == [
        "dict[str, int | None]", "list[int | str]",
    ]  # fmt: skip


def test_schemas_round_trip_through_json_as_a_manifest_stores_them() -> None:
    stored = msgspec.json.encode({"Account": actor_schema(Account)})
    back = msgspec.json.decode(stored, type=dict[str, dict[str, FieldSchema]])
    assert back == {"Account": actor_schema(Account)}
    assert list(back["Account"]) == list(actor_schema(Account))  # declaration order kept


@pytest.mark.parametrize(
    ("old", "new", "widened"),
    [
        ("int", "float", True),
        ("int", "float | None", True),
        ("int", "None | int", True),
        ("None | int", "None | float | str", True),
        ("float", "int", False),  # narrowing
        ("int", "str", False),
        ("list[int]", "list[float]", False),  # nested changes are not decided member by member
        ("int | str", "int", False),
    ],
)
def test_widening_keeps_every_old_value(old: str, new: str, widened: bool) -> None:
    assert widens(old, new) is widened


def test_changes_between_schemas_name_kind_type_and_field() -> None:
    old = {
        "Account": {"balance": FieldSchema("int", "0"), "owner": FieldSchema("str", '""')},
        "Audit": {"n": FieldSchema("int", "0")},
    }
    new = {
        "Account": {"balance": FieldSchema("float", "0.0"), "holder": FieldSchema("str", '""'),
                    "fee": FieldSchema("Money{amount: int}", "{}")},
        "Branch": {"name": FieldSchema("str", '""')},
    }  # fmt: skip
    changes = schema_changes(old, new)
    assert [(c.actor_type, c.field, c.kind) for c in changes] == [
        ("Account", "balance", ChangeKind.WIDENED),
        ("Account", "owner", ChangeKind.REMOVED),
        ("Account", "holder", ChangeKind.ADDED),
        ("Account", "fee", ChangeKind.ADDED),
        ("Branch", "", ChangeKind.TYPE_ADDED),
        ("Audit", "", ChangeKind.TYPE_REMOVED),
    ]
    assert changes[0].describe() == "Account.balance: int -> float (widened)"
    retyped = schema_changes(new, {"Account": {**new["Account"], "fee": FieldSchema("int")}})
    assert [(c.field, c.kind) for c in retyped if c.field] == [("fee", ChangeKind.RETYPED)]
    assert schema_changes(old, old) == []


def _app() -> tuple[App, type[msgspec.Struct]]:
    app = App("ledger")

    @app.actor(key=int)
    class Ledger(msgspec.Struct):
        funds: float = 0.0

    return app, Ledger


def test_a_migration_turns_an_old_value_into_canonical_new_bytes_or_drops_it() -> None:
    app, ledger = _app()

    @app.migration(ledger)
    def rename(old: dict[str, Any]) -> Any:
        return None if old["balance"] < 0 else ledger(funds=old["balance"])  # type: ignore[call-arg]

    old = msgspec.msgpack.encode({"balance": 7})
    assert app.migrated("Ledger", old) == msgspec.msgpack.encode({"funds": 7.0})
    assert app.migrated("Ledger", msgspec.msgpack.encode({"balance": -1})) is None
    with pytest.raises(ConfigError, match="one migration per actor type"):
        app.migration(ledger)(rename)


@pytest.mark.parametrize(
    ("migration", "says"),
    [
        (lambda old: old["missing"], "the migration <lambda> of Ledger failed: KeyError"),
        (lambda old: {"funds": 1.0}, "returned a dict, not a Ledger"),
        (lambda old: Money(), "returned a Money, not a Ledger"),
    ],
)
def test_a_migration_that_fails_is_named(migration: Any, says: str) -> None:
    app, ledger = _app()
    app.migration(ledger)(migration)
    with pytest.raises(SchemaError, match=says):
        app.migrated("Ledger", msgspec.msgpack.encode({"balance": 7}))


def test_the_code_hash_covers_the_module_of_a_migration() -> None:
    migrations = importlib.import_module("tests.unit.schemas.migrations")  # unseen by the app

    app, ledger = _app()
    before = app.code_hash()
    app.migration(ledger)(migrations.to_ledger)
    assert app.code_hash() != before
