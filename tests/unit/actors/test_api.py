"""Registering an app refuses what would fail at every record; routing a record gives the
canonical event and checked keys; the code hash covers the app's own modules and libraries."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from epochal.actors.api import App
from epochal.actors.context import Context
from epochal.errors import ConfigError, SchemaError
from epochal.schemas.canonical import decode_canonical
from epochal.schemas.commands import KeyRef


class Untagged(msgspec.Struct):
    key: str


class AlsoUntagged(msgspec.Struct):
    key: str
    amount: int


class Tagged(msgspec.Struct, tag=True):
    key: str


class AlsoTagged(msgspec.Struct, tag=True):
    key: str
    amount: float = 0.0


def _noop(ctx: Context, e: Any) -> None:
    pass


class Item(msgspec.Struct):
    n: int = 0


class Slot(msgspec.Struct):
    n: int = 0


class Plain:
    """Not something msgspec decodes."""


def _app() -> App:
    app = App("api")
    app.actor(key=str)(Item)
    app.actor(key=int)(Slot)
    return app


def test_two_event_types_msgspec_cannot_tell_apart_are_refused_at_registration() -> None:
    app = _app()
    app.transaction(topic="things", event=Untagged, keys=lambda e: {})(_noop)
    with pytest.raises(ConfigError) as refused:
        app.transaction(topic="things", event=AlsoUntagged, keys=lambda e: {}, name="also")(_noop)
    assert "Untagged, AlsoUntagged" in str(refused.value)
    assert "topic 'api.in.things'" in str(refused.value) and "tag=True" in str(refused.value)
    app.transaction(topic="tagged", event=Tagged, keys=lambda e: {}, name="t1")(_noop)
    app.transaction(topic="tagged", event=AlsoTagged, keys=lambda e: {}, name="t2")(_noop)


def test_an_event_type_msgspec_cannot_decode_is_refused_at_registration() -> None:
    with pytest.raises(ConfigError, match="cannot decode the event type of odd"):
        _app().transaction(event=Plain, keys=lambda e: {}, name="odd")(_noop)


def test_an_external_topic_is_read_by_its_full_name_and_routed_like_the_own_ones() -> None:
    app = _app()
    app.transaction(external_topic="payments.v1", event=Tagged, keys=lambda e: {}, name="p")(_noop)
    app.transaction(external_topic="payments.v1", event=AlsoTagged, keys=lambda e: {},
                    name="p2")(_noop)  # fmt: skip
    app.transaction(topic="own", event=Untagged, keys=lambda e: {Item: [e.key]}, name="o")(_noop)
    assert app.input_topics() == ["api.in.own", "payments.v1"]
    assert app.external_topics() == ["payments.v1"]
    assert [h.name for h in app.topic_handlers("payments.v1")] == ["p", "p2"]
    assert not app.handlers["p"].interior
    assert app.route("payments.v1", b'{"type": "AlsoTagged", "key": "k"}').handler == "p2"
    assert app.route("api.in.own", b'{"key": "k"}').handler == "o"
    with pytest.raises(SchemaError, match="no transaction reads this topic"):
        app.route("api.in.payments.v1", b'{"type": "Tagged", "key": "k"}')


@pytest.mark.parametrize(
    ("topic", "external", "refused"),
    [
        ("own", "payments.v1", "not both"),
        (None, "pay ments", "not a valid Kafka topic name"),
        (None, "..", "not a valid Kafka topic name"),
        (None, "x" * 250, "not a valid Kafka topic name"),
        (None, "api.in.own", "in the app's own namespace"),
    ],
)
def test_an_external_topic_that_could_not_be_one_is_refused_at_registration(
    topic: str | None, external: str, refused: str
) -> None:
    with pytest.raises(ConfigError, match=refused):
        _app().transaction(topic=topic, external_topic=external, event=Tagged,
                           keys=lambda e: {})(_noop)  # fmt: skip


def _route(keys: Any, value: bytes = b'{"type": "Tagged", "key": "a"}') -> Any:
    app = _app()
    app.transaction(topic="t", event=Tagged, keys=keys, name="h")(_noop)
    app.transaction(topic="t", event=AlsoTagged, keys=lambda e: {}, name="h2")(_noop)
    return app.route("api.in.t", value)


def test_routing_logs_the_canonical_event() -> None:
    routed = _route(lambda e: {Item: [e.key]}, b'{"type": "AlsoTagged", "key": "a", "amount": 3}')
    assert decode_canonical(routed.event, AlsoTagged) == AlsoTagged("a", 3.0)
    assert routed.event == msgspec.msgpack.encode(AlsoTagged("a", 3.0))  # 3 stored as 3.0


@given(
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=4),
    st.lists(st.integers(-2, 2), max_size=4),
)
def test_the_declared_keys_are_each_key_once_in_sorted_order(
    items: list[str], slots: list[int]
) -> None:
    routed = _route(lambda e: {Slot: slots, Item: items})
    expected = {KeyRef("Item", k) for k in items} | {KeyRef("Slot", k) for k in slots}
    assert routed.keys == tuple(sorted(expected))


def _recurse(e: Any) -> Any:
    return _recurse(e)


@pytest.mark.parametrize(
    ("keys", "reason"),
    [
        (_recurse, "key function failed: RecursionError"),
        (lambda e: {Slot: [2**70]}, "cannot be logged"),
        (lambda e: {Item: ["\ud800"]}, "cannot be logged"),
        (lambda e: {Item: [1]}, "has type int; Item keys are str"),
        (lambda e: {Slot: [True]}, "has type bool; Slot keys are int"),
        (lambda e: 1 / 0, "key function failed: ZeroDivisionError"),
        (lambda e: {Plain: ["a"]}, "not a registered actor type"),
    ],
)
def test_a_key_function_that_fails_or_gives_bad_keys_makes_a_dead_letter(
    keys: Any, reason: str
) -> None:
    with pytest.raises(SchemaError, match=reason):
        _route(keys)


def test_an_exception_whose_str_fails_still_gives_a_reason() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError

    def keys(e: Any) -> Any:
        raise Unprintable

    with pytest.raises(SchemaError, match="key function failed: Unprintable: <unprintable"):
        _route(keys)


@pytest.fixture
def app_package(tmp_path: Path) -> Iterator[Path]:
    """A throw-away app package: ``pkg.app`` defines the app, ``pkg.fees`` a helper it imports."""
    package = tmp_path / "hashpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fees.py").write_text("FEE = 1\n")
    (package / "app.py").write_text(
        textwrap.dedent("""
        import msgspec
        from epochal import App, Context

        app = App("hashed")

        @app.actor(key=str)
        class Account(msgspec.Struct):
            balance: int = 0

        class Pay(msgspec.Struct):
            key: str

        @app.transaction(topic="pay", event=Pay, keys=lambda e: {Account: [e.key]})
        def pay(ctx: Context, e: Pay) -> None:
            from .fees import FEE  # imported lazily: still the app's code

            account = ctx.get(Account, e.key)
            account.balance -= FEE
            ctx.put(e.key, account)
    """)
    )
    sys.path.insert(0, str(tmp_path))
    yield package
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m == "hashpkg" or m.startswith("hashpkg.")]:
        del sys.modules[name]


def _hash() -> str:
    for name in [m for m in sys.modules if m == "hashpkg" or m.startswith("hashpkg.")]:
        del sys.modules[name]
    module = importlib.import_module("hashpkg.app")
    return str(module.app.code_hash())


def test_the_code_hash_covers_modules_the_handlers_import_and_library_versions(
    app_package: Path,
) -> None:
    from epochal.actors.code_hash import app_modules

    before = _hash()
    assert _hash() == before  # stable
    module = importlib.import_module("hashpkg.app")
    sources, libraries = app_modules([module.pay])
    assert {"hashpkg.app", "hashpkg.fees"} <= set(sources)
    assert any(lib.startswith("msgspec==") for lib in libraries)
    assert not any(name.startswith("epochal") for name in sources)
    (app_package / "fees.py").write_text("FEE = 2\n")  # only the helper changes
    assert _hash() != before


def test_comments_docstrings_and_formatting_are_not_code(app_package: Path) -> None:
    module = app_package / "app.py"
    source = module.read_text()
    before = _hash()
    noted = source.replace(
        "def pay(ctx: Context, e: Pay) -> None:\n",
        'def pay(ctx: Context, e: Pay) -> None:  # a comment\n    """Pays the fee."""\n\n',
    )
    module.write_text(f'"""The app."""\n# more words\n{noted}\n\n')
    assert noted != source and _hash() == before
    module.write_text(source.replace("balance -= FEE", "balance -= FEE + 0"))
    assert _hash() != before


def test_the_code_hash_is_read_once_per_app_and_again_when_the_app_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hashing reads and parses source files (a weak recovery job once did it per epoch)."""
    import epochal.actors.api

    computed: list[str] = []
    real = epochal.actors.api.code_hash

    def counting(objects: Any) -> str:
        computed.append(real(objects))
        return computed[-1]

    monkeypatch.setattr(epochal.actors.api, "code_hash", counting)
    app = App("grow")

    class Counter(msgspec.Struct):
        count: int = 0

    app.actor(key=str)(Counter)
    first = app.code_hash()
    assert [app.code_hash() for _ in range(3)] == [first] * 3 and len(computed) == 1
    app.transaction(topic="t", event=Untagged, keys=lambda e: {Counter: [e.key]})(_noop)
    app.code_hash()
    assert len(computed) == 2, "a handler registered later is hashed"


def test_actor_fields_that_would_clash_with_snapshot_columns_are_refused() -> None:
    class Clashing(msgspec.Struct):
        _key: str = ""

    with pytest.raises(ConfigError, match=r"\['_key'\] would clash"):
        App("clash").actor(key=str)(Clashing)


def test_loading_an_app_under_another_name_leaves_the_modules_app_alone() -> None:
    """``epochal replay APP --name N`` run in a process that also uses the app (a test, a
    service) renamed the module's object: every later use got N's topics."""
    from epochal.actors.api import load_app
    from tests.unit.actors.workload import app

    renamed = load_app("tests.unit.actors.workload:app", "other")
    assert (renamed.name, app.name) == ("other", "testbank")
    assert renamed.topics.command_log == "other.cmd" and app.topics.command_log == "testbank.cmd"
    assert renamed.handlers is app.handlers  # the same transactions, under another name
    assert load_app("tests.unit.actors.workload:app") is app
