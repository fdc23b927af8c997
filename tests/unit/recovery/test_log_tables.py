"""The ``commands`` archive's columns: the event JSON made per handler in one decode and one
encode equals the event JSON made one event at a time, whatever the mix of events."""

from __future__ import annotations

import datetime
import enum
import json

import msgspec
import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from epochal.actors.api import App
from epochal.actors.snapshots import Reported
from epochal.recovery import log_tables
from epochal.recovery.log_tables import _EventJson, archived_epoch, reported_commands_table
from epochal.schemas.commands import CommandTxn, EpochRecord, InputPosition, KeyRef, Origin
from tests.unit.actors.workload import Deposit, Transfer, app

_EVENTS = st.one_of(
    st.builds(Deposit, st.integers(0, 39), st.integers(0, 2**40)).map(
        lambda e: ("deposit", msgspec.msgpack.encode(e))
    ),
    st.builds(Transfer, st.integers(0, 39), st.integers(0, 39), st.integers(-5, 99)).map(
        lambda e: ("transfer", msgspec.msgpack.encode(e))
    ),
    st.binary(max_size=12).map(lambda b: ("transfer", b)),  # bytes that may not decode
    st.just(("gone", b"\x80")),  # a handler the code no longer has
)


@given(st.lists(_EVENTS, max_size=30))
@example([("transfer", b""), ("transfer", b"\x00\x00")])  # no value, then two: aligned again
@example([("transfer", b"\x05\xc0"), ("transfer", b"")])  # two values, the second nil
def test_event_json_in_batches_is_the_event_json_of_each(events: list[tuple[str, bytes]]) -> None:
    as_json = _EventJson(app)
    one_by_one = [as_json(handler, event) for handler, event in events]
    batched = as_json.many([h for h, _ in events], [e for _, e in events])
    assert batched.to_pylist() == one_by_one
    for text in one_by_one:
        if text is not None:
            json.loads(text)


_KEY_REFS = st.lists(st.one_of(
    st.builds(KeyRef, st.just("Account"), st.integers(-(2**63), 2**64 - 1)),
    st.builds(KeyRef, st.just("Tag"), st.text(max_size=6)),  # quotes, escapes, surrogates
), max_size=3).map(tuple)  # fmt: skip
_TXN = st.builds(
    lambda handler, account, keys, origin, at, request: CommandTxn(
        0, handler, msgspec.msgpack.encode(Deposit(account, 1)), keys, origin, at, request,
    ),
    st.sampled_from(["deposit", "gone"]), st.integers(0, 39), _KEY_REFS,
    st.sampled_from(list(Origin)),
    st.one_of(st.none(), st.builds(InputPosition, st.just("testbank.in.x"), st.integers(0, 3),
                                   st.integers(0, 10**6))),
    st.sampled_from(["", "r-1"]),
)  # fmt: skip
_EPOCHS = st.lists(st.lists(_TXN, max_size=4), max_size=6)


@given(_EPOCHS, st.booleans(), st.integers(0, 2**63 - 1), st.data())
def test_archive_rows_are_the_transactions_as_logged(
    epochs: list[list[CommandTxn]], empty_epochs: bool, salt: int, data: st.DataObject
) -> None:
    """Each reported transaction's row carries its own epoch's time, seed and hash, its keys and
    its outcome, and an epoch without transactions one ``seq`` -1 row, whatever the mix: the
    columns are built apart (per epoch, flat keys), so a row that took another's value shows.
    A worker reports some of an epoch's transactions (the others are another's), maybe
    interior ones too (seqs below 0, which have rows of their own), or none of the epoch."""
    records = [
        EpochRecord(epoch, 1_000 + epoch, (salt + epoch) % 2**63, f"h{epoch}",
                    tuple(msgspec.structs.replace(t, seq=seq) for seq, t in enumerate(txns)))
        for epoch, txns in enumerate(epochs)
    ]  # fmt: skip
    mine = {
        r.epoch: [t.seq for t in r.txns if data.draw(st.booleans(), f"{r.epoch}:{t.seq}")]
        for r in records
        if data.draw(st.booleans(), f"reports {r.epoch}")
    }
    reported = [
        Reported(r.epoch, r.now_ms, r.seed, r.code_hash, [-2, -1][: r.epoch % 3] + mine[r.epoch],
                 {seq: f"no {seq}" for seq in [-1, *mine[r.epoch]] if seq % 2}, {})
        for r in records if r.epoch in mine
    ]  # fmt: skip
    archived = [archived_epoch(msgspec.msgpack.encode(r)) for r in records]
    table = reported_commands_table(app, 7, archived, reported, empty_epochs)
    table.validate(full=True)
    as_json = _EventJson(app)
    expected = [
        {"ssid": 7, "epoch": r.epoch, "now_ms": r.now_ms, "seq": t.seq, "handler": t.handler,
         "event_json": as_json(t.handler, t.event),
         "keys": [f"{k.actor_type}:{k.key!r}" for k in t.keys],
         "origin": t.origin.name.lower(), "source_topic": t.source and t.source.topic,
         "source_offset": t.source and t.source.offset, "request_id": t.request_id or None,
         "code_hash": r.code_hash, "seed": r.seed, "txn": msgspec.msgpack.encode(t),
         "committed": t.seq % 2 == 0, "reason": f"no {t.seq}" if t.seq % 2 else ""}
        for r in records for t in r.txns if t.seq in mine.get(r.epoch, ())
    ] + [
        {"ssid": 7, "epoch": r.epoch, "now_ms": r.now_ms, "seq": -1, "handler": "",
         "event_json": None, "keys": [], "origin": "", "source_topic": None,
         "source_offset": None, "request_id": None, "code_hash": r.code_hash, "seed": r.seed,
         "txn": None, "committed": None, "reason": None}
        for r in records if not r.txns and empty_epochs
    ]  # fmt: skip
    rows = table.to_pylist()
    for row in rows:
        row["now_ms"] = round(row.pop("time").timestamp() * 1000)
    assert [{k: row[k] for k in expected[0]} for row in rows] == expected if expected else not rows


class _Kind(enum.Enum):
    A = "a"
    B = "b"


class _Inner(msgspec.Struct, array_like=True):
    n: int
    tags: list[str]


class _Rich(msgspec.Struct, tag="rich", rename="camel", omit_defaults=True):
    some_name: str
    when: datetime.datetime
    blob: bytes
    kind: _Kind
    inner: _Inner
    by_id: dict[int, float]
    maybe: int | None = None


_rich_app = App("jsonapp")
_rich_app.transaction(topic="rich", event=_Rich, keys=lambda e: {})(lambda ctx, e: None)
_RICH = st.builds(
    _Rich, st.text(max_size=5),
    st.datetimes(timezones=st.just(datetime.UTC)).map(lambda d: d.replace(microsecond=0)),
    st.binary(max_size=6), st.sampled_from(_Kind),
    st.builds(_Inner, st.integers(-(2**63), 2**63 - 1), st.lists(st.text(max_size=3), max_size=3)),
    st.dictionaries(st.integers(-9, 9), st.floats(allow_nan=False), max_size=3),
    st.one_of(st.none(), st.integers(0, 9)),
)  # fmt: skip


@given(st.lists(_RICH, max_size=8))
def test_event_json_is_the_json_of_the_typed_event(events: list[_Rich]) -> None:
    """Decoded as plain msgpack, an event's JSON is the JSON of the event decoded as its type:
    tags, renamed and omitted fields, array-like structs, bytes, enums, times, int keys."""
    logged = [msgspec.msgpack.encode(e) for e in events]
    typed = [msgspec.json.encode(msgspec.msgpack.decode(b, type=_Rich)).decode() for b in logged]
    as_json = _EventJson(_rich_app)
    assert [as_json("<lambda>", b) for b in logged] == typed
    assert as_json.many(["<lambda>"] * len(logged), logged).to_pylist() == typed


def test_event_json_past_one_arrow_string_goes_one_by_one_in_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """JSON lines longer than one Arrow string holds (2 GB: events of some hundreds of KB in a
    batch) are made one by one, and a column Arrow cut into chunks makes the same rows."""
    events = [Deposit(n, n + 1) for n in range(7)]
    logged = [msgspec.msgpack.encode(e) for e in events]
    txns = tuple(CommandTxn(seq, "deposit", data, ()) for seq, data in enumerate(logged))
    records = [archived_epoch(msgspec.msgpack.encode(EpochRecord(0, 1_000, 1, "h0", txns)))]
    reported = [Reported(0, 1_000, 1, "h0", list(range(7)), {}, {})]
    whole = reported_commands_table(app, 3, records, reported, True)
    monkeypatch.setattr(log_tables, "_MAX_STRING_BYTES", 40)
    monkeypatch.setattr(log_tables, "_lines", lambda text: pytest.fail("one string past the most"))
    as_json = _EventJson(app)
    handlers = ["deposit"] * len(logged)
    assert as_json.many(handlers, logged).to_pylist() == list(map(as_json, handlers, logged))
    assert reported_commands_table(app, 3, records, reported, True).equals(whole)
    many = _EventJson.many

    def in_chunks(self: _EventJson, handlers: list[str], events: list[bytes]) -> pa.ChunkedArray:
        column = many(self, handlers, events)
        return pa.chunked_array([column.slice(0, 3), column.slice(3)])

    monkeypatch.setattr(_EventJson, "many", in_chunks)
    assert reported_commands_table(app, 3, records, reported, True).equals(whole)
