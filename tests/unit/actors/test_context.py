"""One handler run: what a handler sees, what counts as a write, and what aborts."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import pytest

from epochal.actors.api import App
from epochal.actors.context import Context, run_transaction
from epochal.actors.outcome import AbortKind, TxnOutcome
from epochal.actors.plan import EpochClock, Invocation
from epochal.schemas.canonical import decode_canonical, encode_canonical
from epochal.schemas.commands import KeyRef, Origin

app = App("ctx")


@app.actor(key=str, constraints={"non-negative": lambda c: c.n >= 0})
class Counter(msgspec.Struct):
    n: int = 0
    tags: list[str] = msgspec.field(default_factory=list)
    ratio: float = 0.0


@app.actor(key=int)
class Slot(msgspec.Struct):
    value: int = 0


class Op(msgspec.Struct, frozen=True):
    key: str
    delta: int


class Bump(msgspec.Struct, frozen=True):
    key: str


def _keys(e: Op) -> dict[type, list[object]]:
    return {Counter: [e.key], Slot: [1]}


def _add(ctx: Context, e: Op) -> None:
    counter = ctx.get(Counter, e.key)
    counter.n += e.delta
    counter.tags.append("added")
    ctx.put(e.key, counter)


HANDLERS: dict[str, Any] = {"add": _add}


def handler(fn: Any) -> Any:
    HANDLERS[fn.__name__] = app.transaction(event=Op, keys=_keys, client=True)(fn)
    return fn


app.transaction(event=Op, keys=_keys, client=True, name="add")(_add)


@handler
def add_twice(ctx: Context, e: Op) -> None:
    ctx.call(_add, e)
    ctx.call(_add, e)


@handler
def mutate_without_put(ctx: Context, e: Op) -> None:
    ctx.get(Counter, e.key).n += 100


@handler
def mutate_after_put(ctx: Context, e: Op) -> None:
    counter = ctx.get(Counter, e.key)
    counter.n = 7
    ctx.put(e.key, counter)
    counter.n = 1_000  # after put: does not count
    counter.tags.append("late")
    assert ctx.get(Counter, e.key).n == 7  # a get after put sees what was put


@handler
def recurse(ctx: Context, e: Op) -> None:
    recurse(ctx, e)


@handler
def emit_unknown(ctx: Context, e: Op) -> None:
    ctx.emit(e)  # no interior transaction handles Op


@handler
def draw(ctx: Context, e: Op) -> None:
    ctx.put(e.key, Counter(n=int(ctx.random() * 1e9), tags=[str(ctx.now())]))


@handler
def exists_after_get(ctx: Context, e: Op) -> None:
    ctx.get(Counter, e.key)  # a default actor, but not one that exists
    if ctx.exists(Counter, e.key):
        raise AssertionError("exists after get")
    ctx.put(e.key, Counter(1))
    if not ctx.exists(Counter, e.key):
        raise AssertionError("not exists after put")
    ctx.delete(Counter, e.key)
    if ctx.exists(Counter, e.key):
        raise AssertionError("exists after delete")


@handler
def ill_typed_int(ctx: Context, e: Op) -> None:
    counter = ctx.get(Counter, e.key)
    counter.n = counter.n * 1.05  # type: ignore[assignment]
    with contextlib.suppress(Exception):  # swallowing it does not save the transaction
        ctx.put(e.key, counter)


@handler
def int_in_float_field(ctx: Context, e: Op) -> None:
    ctx.put(e.key, Counter(ratio=round(2.6)))  # an int where a float goes: stored as 3.0


@handler
def aliased_key(ctx: Context, e: Op) -> None:
    ctx.put(1.0, Slot(5))  # type: ignore[arg-type]  # equal to the declared 1, not an int


@handler
def bool_key(ctx: Context, e: Op) -> None:
    ctx.get(Slot, True)


@handler
def catches_a_failing_call(ctx: Context, e: Op) -> None:
    ctx.put(e.key, Counter(1))
    with contextlib.suppress(ValueError):
        ctx.call(fails_after_writing, e)
    ctx.egress("log", "caller went on")


@handler
def fails_after_writing(ctx: Context, e: Op) -> None:
    ctx.put(e.key, Counter(99))
    ctx.put(1, Slot(99))
    ctx.egress("log", "from the failed call")
    raise ValueError("called handler fails")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


@handler
def raises_unprintable(ctx: Context, e: Op) -> None:
    raise Unprintable


@handler
def raises_system_exit(ctx: Context, e: Op) -> None:
    raise SystemExit(3)


@handler
def raises_memory_error(ctx: Context, e: Op) -> None:
    raise MemoryError


@handler
def egress_bad_name(ctx: Context, e: Op) -> None:
    ctx.egress("no spaces allowed", "x")


@handler
def egress_unencodable(ctx: Context, e: Op) -> None:
    ctx.egress("log", object())


def _run(name: str, op: Op, reads: dict[KeyRef, msgspec.Struct | None], seq: int = 0) -> TxnOutcome:
    keys = app.declared_keys(app.handlers[name], op)
    invocation = Invocation(1, seq, app.handlers[name], op, keys, Origin.CLIENT)
    raw = {ref: None if v is None else encode_canonical(v) for ref, v in reads.items()}
    return run_transaction(app, invocation, raw, EpochClock(1, 5_000, 42))


def _written(outcome: TxnOutcome) -> dict[KeyRef, msgspec.Struct | None]:
    types = {"Counter": Counter, "Slot": Slot}
    return {
        ref: None if v is None else decode_canonical(v, types[ref.actor_type])
        for ref, v in outcome.writes.items()
    }


REF = KeyRef("Counter", "a")
SLOT = KeyRef("Slot", 1)


def test_reads_are_copies_and_writes_count_only_when_put() -> None:
    stored = Counter(1, ["old"])
    outcome = _run("add", Op("a", 2), {REF: stored})
    assert outcome.committed and _written(outcome) == {REF: Counter(3, ["old", "added"])}
    assert stored == Counter(1, ["old"])  # the stored value was never touched
    assert _run("mutate_without_put", Op("a", 1), {REF: stored}).writes == {}


def test_put_takes_the_value_as_it_is_then() -> None:
    outcome = _run("mutate_after_put", Op("a", 0), {REF: Counter(1)})
    assert outcome.committed, outcome.reason
    assert _written(outcome) == {REF: Counter(7)}


def test_a_missing_actor_starts_from_its_defaults_but_does_not_exist() -> None:
    assert _written(_run("add", Op("a", 5), {})) == {REF: Counter(5, ["added"])}
    outcome = _run("exists_after_get", Op("a", 0), {})
    assert outcome.committed, outcome.reason
    assert outcome.writes == {REF: None}


def test_called_handler_is_part_of_the_same_transaction() -> None:
    outcome = _run("add_twice", Op("a", 2), {REF: Counter(1)})
    assert _written(outcome) == {REF: Counter(5, ["added", "added"])}
    aborted = _run("add_twice", Op("a", -1), {REF: Counter(1)})  # second call breaks n >= 0
    assert not aborted.committed and aborted.writes == {}
    assert aborted.reason == "constraint 'non-negative' violated by Counter['a']"


def test_a_called_handler_that_raises_undoes_only_its_own_effects() -> None:
    outcome = _run("catches_a_failing_call", Op("a", 0), {SLOT: Slot(1)})
    assert outcome.committed, outcome.reason
    assert _written(outcome) == {REF: Counter(1)}  # not Counter(99), and Slot untouched
    assert [value for _, value in outcome.egress] == [msgspec.msgpack.encode("caller went on")]


def test_an_ill_typed_put_aborts_naming_type_key_and_field_even_if_caught() -> None:
    outcome = _run("ill_typed_int", Op("a", 0), {REF: Counter(10)})
    assert not outcome.committed and outcome.writes == {}
    assert outcome.reason.startswith("ill-typed value for Counter['a']")
    assert "Expected `int`, got `float` - at `$.n`" in outcome.reason


def test_values_are_stored_in_their_schema_s_types() -> None:
    (value,) = _written(_run("int_in_float_field", Op("a", 0), {})).values()
    assert isinstance(value, Counter) and type(value.ratio) is float and value.ratio == 3.0


@pytest.mark.parametrize("name", ["aliased_key", "bool_key"])
def test_a_key_equal_to_a_declared_one_but_of_another_type_aborts(name: str) -> None:
    outcome = _run(name, Op("a", 0), {})
    assert not outcome.committed
    assert outcome.reason.startswith("key ") and "of Slot has type" in outcome.reason
    assert outcome.reason.endswith("Slot keys are int")


def test_fatal_errors_are_not_aborts() -> None:
    with pytest.raises(RecursionError):
        _run("recurse", Op("a", 1), {})
    with pytest.raises(MemoryError):
        _run("raises_memory_error", Op("a", 1), {})


def test_odd_exceptions_of_handler_code_are_aborts() -> None:
    unprintable = _run("raises_unprintable", Op("a", 0), {})
    assert not unprintable.committed and unprintable.reason == "Unprintable: <unprintable message>"
    system_exit = _run("raises_system_exit", Op("a", 0), {})
    assert not system_exit.committed and system_exit.reason == "SystemExit: 3"


def test_emitting_an_event_no_transaction_handles_aborts() -> None:
    outcome = _run("emit_unknown", Op("a", 1), {})
    assert not outcome.committed and "no transaction handles the emitted Op" in outcome.reason


@pytest.mark.parametrize(
    ("name", "reason"),
    [("egress_bad_name", "is not a valid topic name"), ("egress_unencodable", "does not encode")],
)
def test_bad_egress_aborts_at_once(name: str, reason: str) -> None:
    outcome = _run(name, Op("a", 0), {})
    assert not outcome.committed and reason in outcome.reason


def test_now_and_random_are_fixed_by_epoch_seed_and_seq() -> None:
    first = _written(_run("draw", Op("a", 0), {}, seq=7))[REF]
    assert first == _written(_run("draw", Op("a", 0), {}, seq=7))[REF]
    assert first != _written(_run("draw", Op("a", 0), {}, seq=8))[REF]
    assert first.tags == ["5000"]  # type: ignore[union-attr]


@handler
def undeclared(ctx: Context, e: Op) -> None:
    ctx.get(Counter, e.key + "-other")


@handler
def returns_unencodable(ctx: Context, e: Op) -> object:
    return object()


@pytest.mark.parametrize(
    ("name", "delta", "kind", "label"),
    [
        ("add", -5, AbortKind.CONSTRAINT, "constraint"),
        ("undeclared", 0, AbortKind.UNDECLARED_KEY, "undeclared_key"),
        ("aliased_key", 0, AbortKind.KEY_TYPE, "key_type"),
        ("ill_typed_int", 1, AbortKind.ILL_TYPED, "ill_typed"),  # swallowed: still the kind
        ("emit_unknown", 0, AbortKind.UNKNOWN_HANDLER, "unknown_handler"),
        ("egress_bad_name", 0, AbortKind.EGRESS, "egress"),
        ("returns_unencodable", 0, AbortKind.RESULT, "result"),
        ("fails_after_writing", 0, AbortKind.RAISED, "ValueError"),
        ("raises_unprintable", 0, AbortKind.RAISED, "Unprintable"),
        ("raises_system_exit", 0, AbortKind.RAISED, "SystemExit"),
    ],
)
def test_each_abort_says_its_kind_as_data_and_its_metric_label(
    name: str, delta: int, kind: AbortKind, label: str
) -> None:
    outcome = _run(name, Op("a", delta), {REF: Counter(n=1)})
    assert not outcome.committed and outcome.reason
    assert (outcome.abort, outcome.abort_label) == (kind, label), outcome.reason


def test_a_committed_transaction_has_no_abort_label() -> None:
    outcome = _run("add", Op("a", 1), {})
    assert outcome.committed and outcome.abort is None and outcome.abort_label == ""


def test_an_exception_type_that_is_no_identifier_is_labelled_other() -> None:
    strange = TxnOutcome(1, 0, "t", False, "a b: no", abort=AbortKind.RAISED, raised="a b")
    assert strange.abort_label == "other"
