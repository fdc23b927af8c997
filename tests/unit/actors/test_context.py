from __future__ import annotations

import msgspec
import pytest

from epochal.actors.api import App
from epochal.actors.context import Context, run_transaction
from epochal.actors.plan import EpochClock, Invocation
from epochal.schemas.commands import KeyRef, Origin

app = App("ctx")


@app.actor(key=str, constraints={"non-negative": lambda c: c.n >= 0})
class Counter(msgspec.Struct):
    n: int = 0
    tags: list[str] = msgspec.field(default_factory=list)


class Op(msgspec.Struct, frozen=True):
    key: str
    delta: int


def _keys(e: Op) -> dict[type, list[str]]:
    return {Counter: [e.key]}


@app.transaction(event=Op, keys=_keys, client=True)
def add(ctx: Context, e: Op) -> None:
    counter = ctx.get(Counter, e.key)
    counter.n += e.delta
    counter.tags.append("added")
    ctx.put(e.key, counter)


@app.transaction(event=Op, keys=_keys, client=True)
def add_twice(ctx: Context, e: Op) -> None:
    ctx.call(add, e)
    ctx.call(add, e)


@app.transaction(event=Op, keys=_keys, client=True)
def mutate_without_put(ctx: Context, e: Op) -> None:
    ctx.get(Counter, e.key).n += 100


@app.transaction(event=Op, keys=_keys, client=True)
def recurse(ctx: Context, e: Op) -> None:
    recurse(ctx, e)


@app.transaction(event=Op, keys=_keys, client=True)
def emit_unknown(ctx: Context, e: Op) -> None:
    ctx.emit(e)  # no interior transaction handles Op


@app.transaction(event=Op, keys=_keys, client=True)
def draw(ctx: Context, e: Op) -> None:
    ctx.put(e.key, Counter(n=int(ctx.random() * 1e9), tags=[str(ctx.now())]))


def _run(handler: str, op: Op, reads: dict[KeyRef, Counter | None], seq: int = 0):  # type: ignore[no-untyped-def]
    keys = app.declared_keys(app.handlers[handler], op)
    invocation = Invocation(1, seq, app.handlers[handler], op, keys, Origin.CLIENT)
    return run_transaction(app, invocation, reads, EpochClock(1, 5_000, 42))


REF = KeyRef("Counter", "a")


def test_reads_are_copies_and_writes_count_only_when_put() -> None:
    stored = Counter(1, ["old"])
    outcome = _run("add", Op("a", 2), {REF: stored})
    assert outcome.committed and outcome.writes == {REF: Counter(3, ["old", "added"])}
    assert stored == Counter(1, ["old"])  # the stored value was never touched
    assert _run("mutate_without_put", Op("a", 1), {REF: stored}).writes == {}


def test_a_missing_actor_starts_from_its_defaults() -> None:
    assert _run("add", Op("a", 5), {}).writes == {REF: Counter(5, ["added"])}


def test_called_handler_is_part_of_the_same_transaction() -> None:
    outcome = _run("add_twice", Op("a", 2), {REF: Counter(1)})
    assert outcome.writes == {REF: Counter(5, ["added", "added"])}
    aborted = _run("add_twice", Op("a", -1), {REF: Counter(1)})  # second call breaks n >= 0
    assert not aborted.committed and aborted.writes == {}
    assert aborted.reason == "constraint 'non-negative' violated by Counter['a']"


def test_fatal_errors_are_not_aborts() -> None:
    with pytest.raises(RecursionError):
        _run("recurse", Op("a", 1), {})


def test_emitting_an_event_no_transaction_handles_aborts() -> None:
    outcome = _run("emit_unknown", Op("a", 1), {})
    assert not outcome.committed and "no transaction handles this emitted event" in outcome.reason


def test_now_and_random_are_fixed_by_epoch_seed_and_seq() -> None:
    first = _run("draw", Op("a", 0), {}, seq=7).writes[REF]
    assert first == _run("draw", Op("a", 0), {}, seq=7).writes[REF]
    assert first != _run("draw", Op("a", 0), {}, seq=8).writes[REF]
    assert first.tags == ["5000"]  # type: ignore[union-attr]


def test_abort_reasons_fall_into_few_metric_labels() -> None:
    from epochal.actors.worker import abort_category

    assert abort_category("constraint 'non-negative' violated by Counter['a']") == "constraint"
    assert (
        abort_category("undeclared key Account[3]: declare it in the keys of t") == "undeclared_key"
    )
    assert abort_category("ValueError: transfer to itself") == "ValueError"
