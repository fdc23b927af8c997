"""No record, of any bytes or size, makes the sequencer's pure path raise (docs/concepts.md).

Arbitrary bytes, JSON documents and msgpack values, on the input topic, on a topic no transaction
reads, and as client requests; deep nesting (1,000 and 100,000 levels), integers wider than 64
bits, huge strings and keys, NaN and infinities, invalid UTF-8, empty values. Whatever comes in:
:func:`order` returns; every record is exactly one transaction or one dead letter (a request may
also be a tick or a retry); seqs are dense; each dead letter has its coordinates, fits under the
cap and says when it was cut; the epoch survives chunking; and every logged event decodes again
with its handler's event type, as a worker will decode it.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochal.log.command_log import EpochAssembler, chunk_epoch
from epochal.log.ordering import EpochStamp, order
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import ClientRequest, InputRecord, Origin
from tests.unit.log.fuzz_app import app

TOPIC = "fuzz.in.things"
UNREAD = "fuzz.in.nobody"
REQUESTS = "fuzz.requests"
STAMP = EpochStamp(3, 1_000, 11, "code")
TAGS = ["Blob", "Listed", "Mapped", "Deep", "Odd", "Nope"]
FIELDS = ["key", "payload", "items", "inner", "table", "inners", "n", "label", "weights"]


def _deep_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _deep_msgpack(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"  # fixarray of one, depth times, then nil


def _envelope_json(tag: str, field: str, raw: bytes) -> bytes:
    return b'{"type": "%s", "key": "k", "%s": %s}' % (tag.encode(), field.encode(), raw)


def _envelope_msgpack(tag: str, field: str, raw: bytes) -> bytes:
    head = msgspec.msgpack.encode({"type": tag, "key": "k"})
    return bytes([head[0] + 1]) + head[1:] + msgspec.msgpack.encode(field) + raw  # one more key


def _deep_cases() -> list[bytes]:
    """Deep nesting in every kind of field, as JSON and as msgpack, around the limits."""
    fields = [("Blob", "payload"), ("Listed", "items"), ("Mapped", "table"), ("Deep", "payload"),
              ("Odd", "zz")]  # fmt: skip
    return [
        envelope(tag, field, deep(depth))
        for depth in (99, 101, 950, 1_000, 100_000)
        for tag, field in fields
        for envelope, deep in ((_envelope_json, _deep_json), (_envelope_msgpack, _deep_msgpack))
    ]


HUGE = "x" * 1_100_000
SPECIALS = [
    b"",
    b"   ",
    b"null",
    b"\xff" * 1_000_000,  # ~1 MB undecodable: its dead letter must still fit
    b"\xa3\xff\xfe\xfd",  # a msgpack str that is not UTF-8
    b'{"type": "Blob", "key": "\xff\xfe"}',  # JSON that is not UTF-8
    b'{"type": "Blob", "key": "k", "payload": NaN}',
    b'{"type": "Blob", "key": "k", "payload": 1e999}',
    b'{"type": "Blob", "key": "k", "payload": -1e999}',
    b'{"type": "Blob", "key": "k", "payload": 123456789012345678901234567890}',
    b'{"type": "Listed", "key": "k", "items": [-123456789012345678901234567890]}',
    b'{"type": "Mapped", "key": "k", "table": {"a": 18446744073709551616}}',
    b'{"type": "Odd", "key": "k", "n": 99999999999999999999999}',
    b'{"type": "Odd", "key": "wide", "n": 3}',
    b'{"type": "Odd", "key": "surrogate"}',
    b'{"type": "Odd", "key": "unprintable"}',
    b'{"type": "Odd", "key": "recurse"}',
    b'{"type": "Blob", "key": "\\ud800"}',
    msgspec.json.encode({"type": "Blob", "key": "k", "payload": HUGE}),
    msgspec.msgpack.encode({"type": "Listed", "key": HUGE, "items": [HUGE]}),
    msgspec.msgpack.encode({"type": "Blob", "key": "k", "payload": math.nan}),
    msgspec.msgpack.encode({"type": "Blob", "key": "k", "payload": [math.inf, -math.inf]}),
    _deep_json(100_000),
    _deep_msgpack(100_000),
    *_deep_cases(),
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=15,
)
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=15,
)


@st.composite
def documents(draw: st.DrawFn, fmt: str) -> bytes:
    """A JSON or msgpack document: bare, or an event-shaped map with arbitrary field values."""
    values = json_values if fmt == "json" else msgpack_values
    if draw(st.booleans()):
        doc: Any = draw(values)
    else:
        doc = {"type": draw(st.sampled_from(TAGS))}
        for name in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
            doc[name] = draw(st.text(max_size=10) if name == "key" else values)
    if fmt == "json":
        return json.dumps(doc).encode()  # NaN and Infinity spelled as Python does
    return msgspec.msgpack.encode(doc)


@st.composite
def events(draw: st.DrawFn, fmt: str) -> bytes:
    """An event of one of the app's types (Poke: untagged), with arbitrary values inside."""
    any_value = json_values if fmt == "json" else msgpack_values
    key, value = draw(st.text(max_size=10)), draw(any_value)
    odd_key = draw(st.sampled_from(["k", "wide", "surrogate", "unprintable", "recurse"]))
    floats = draw(st.lists(st.floats(), max_size=3))
    doc = draw(st.sampled_from([
        {"type": "Blob", "key": key, "payload": value},
        {"type": "Listed", "key": key, "items": [value, key],
         "inner": {"label": key, "weights": floats}},
        {"type": "Mapped", "key": key, "table": {key: value}, "inners": [{"label": key}]},
        {"type": "Deep", "payload": value},
        {"type": "Odd", "key": odd_key, "n": draw(st.integers())},
        {"key": key, "payload": value},
    ]))  # fmt: skip
    if fmt == "json":
        return json.dumps(doc).encode()
    try:
        return msgspec.msgpack.encode(doc)
    except OverflowError:  # Odd.n wider than msgpack: JSON still carries it
        return json.dumps(doc).encode()


# Values and keys are drawn as bytes, or as an index into SPECIALS (-1: a huge key), resolved in
# the test: a falsifying example then prints short.
Drawn = bytes | int | None
values: st.SearchStrategy[Drawn] = st.one_of(
    st.binary(max_size=64),
    documents("json"),
    documents("msgpack"),
    events("json"),
    events("msgpack"),
    st.integers(0, len(SPECIALS) - 1),
)
keys: st.SearchStrategy[Drawn] = st.one_of(st.none(), st.binary(max_size=16), st.just(-1))


def _resolve(drawn: Drawn) -> bytes | None:
    if isinstance(drawn, int):
        return b"k" * 1_200_000 if drawn < 0 else SPECIALS[drawn]
    return drawn


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, Drawn] | Drawn:
    """A requests-topic value: a client request (valid or not), a tick, or anything at all."""
    kind = draw(st.sampled_from(["poke", "unknown", "tick", "raw"]))
    if kind == "raw":
        return draw(values)
    if kind == "tick":
        return ClientRequest.tick(2).request_id, "", b""
    request_id = draw(st.sampled_from(["r1", "r2", "r3", "tick:3"]))
    handler = "poke" if kind == "poke" else draw(st.sampled_from(["blob", "nobody"]))
    return request_id, handler, draw(values)


def _request(drawn: tuple[str, str, Drawn] | Drawn) -> bytes:
    if isinstance(drawn, tuple):
        request_id, handler, event = drawn
        return encode(ClientRequest(request_id, handler, _resolve(event) or b""))
    return _resolve(drawn) or b""


records = st.lists(
    st.tuples(st.sampled_from([TOPIC, TOPIC, UNREAD]), st.integers(0, 1), values, keys),
    max_size=8,
)


def _records(spec: list[tuple[str, int, bytes, Drawn]]) -> list[InputRecord]:
    """InputRecords at dense offsets per partition, with Kafka timestamps."""
    offsets: dict[tuple[str, int], int] = {}
    out = []
    for topic, partition, value, key in spec:
        offset = offsets[(topic, partition)] = offsets.get((topic, partition), -1) + 1
        out.append(InputRecord(topic, partition, offset, value, _resolve(key), 500 + offset))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records,
    st.lists(st.tuples(requests(), keys), max_size=6),
    st.sampled_from([1024, 4096, 64 * 1024]),
)
def test_no_record_makes_order_raise_and_each_is_one_txn_or_one_dead_letter(
    spec: list[tuple[str, int, Drawn, Drawn]],
    request_spec: list[tuple[tuple[str, str, Drawn] | Drawn, Drawn]],
    cap: int,
) -> None:
    inputs = _records([(t, p, _resolve(v) or b"", k) for t, p, v, k in spec])
    requests_read = _records([(REQUESTS, 0, _request(r), k) for r, k in request_spec])
    positions = {f"{TOPIC}:5": 42}  # a partition not in this batch keeps its position

    sequenced = order(
        app, STAMP, inputs, requests_read, sequenced_requests={"r3"}, positions=positions,
        dead_letter_bytes=cap,
    )  # fmt: skip

    record = sequenced.record
    assert [t.seq for t in record.txns] == list(range(len(record.txns)))
    by_source = {(t.source.topic, t.source.partition, t.source.offset): t for t in record.txns
                 if t.source is not None}  # fmt: skip
    dead = {(d.topic, d.partition, d.offset): d for d in sequenced.dead}
    assert len(by_source) == len(record.txns) and len(dead) == len(sequenced.dead)
    assert not by_source.keys() & dead.keys()
    for r in inputs:
        assert (r.topic, r.partition, r.offset) in by_source.keys() | dead.keys()
    _check_requests(requests_read, by_source, dead)
    for r in [*inputs, *requests_read]:
        letter = dead.get((r.topic, r.partition, r.offset))
        if letter is not None:
            _check_dead_letter(letter, r, cap)
    for t in record.txns:
        decode(t.event, app.handlers[t.handler].event)  # what a worker does: it must not raise
    assert record.next_offsets[f"{TOPIC}:5"] == 42
    for r in [*inputs, *requests_read]:
        assert record.next_offsets[f"{r.topic}:{r.partition}"] > r.offset
    _check_chunks_round_trip(record)


def _check_requests(
    requests_read: list[InputRecord], by_source: dict[Any, Any], dead: dict[Any, Any]
) -> None:
    """Each request is a txn or a dead letter, unless it is a tick or an id already used."""
    used = {"r3"}
    for r in requests_read:
        where = (r.topic, r.partition, r.offset)
        try:
            request = decode(r.value, ClientRequest)
        except Exception:
            assert where in dead
            continue
        if request.is_tick or request.request_id in used:
            assert where not in by_source and where not in dead
            continue
        used.add(request.request_id)
        assert (where in by_source) != (where in dead)
        if where in by_source:
            txn = by_source[where]
            assert (txn.origin, txn.request_id) == (Origin.CLIENT, request.request_id)


def _check_dead_letter(letter: Any, r: InputRecord, cap: int) -> None:
    assert letter.reason
    assert len(encode(letter)) <= cap
    assert letter.size == len(r.value)
    assert r.value.startswith(letter.value)
    assert letter.key is None if r.key is None else r.key.startswith(letter.key)
    cut = len(letter.value) < len(r.value) or letter.key != r.key
    assert letter.truncated == cut


def _check_chunks_round_trip(record: Any) -> None:
    assembler = EpochAssembler()
    chunks = chunk_epoch(record, chunk_bytes=4096)
    logged = [assembler.add(i, c) for i, c in enumerate(chunks)]
    assert logged[-1] is not None and logged[-1].record == record


def test_the_known_wedges_become_dead_letters_with_clear_reasons() -> None:
    wedges = [
        _envelope_json("Blob", "payload", _deep_json(1_000)),  # ~2 KB, 1,000 deep: RecursionError
        _envelope_msgpack("Blob", "payload", _deep_msgpack(1_000)),
        b'{"type": "Blob", "key": "k", "payload": 123456789012345678901234567890}',
        b'{"type": "Odd", "key": "wide", "n": 3}',  # a key wider than 64 bits
        b"\xc1" * 1_000_000,  # a ~1 MB undecodable record
    ]
    inputs = [InputRecord(TOPIC, 0, i, v, b"key") for i, v in enumerate(wedges)]
    inputs.append(InputRecord(TOPIC, 0, len(wedges), b'{"type": "Blob", "key": "fine"}'))

    sequenced = order(app, STAMP, inputs)

    assert [t.source.offset for t in sequenced.record.txns if t.source] == [len(wedges)]
    assert [d.offset for d in sequenced.dead] == list(range(len(wedges)))
    assert all(len(encode(d)) <= 64 * 1024 for d in sequenced.dead)
    huge = sequenced.dead[-1]
    assert (huge.truncated, huge.size, huge.topic, huge.partition) == (True, 1_000_000, TOPIC, 0)
    assert not any(d.truncated for d in sequenced.dead[:-1])


class _Raising:
    """A router that raises what a router must never be able to raise out of order()."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def route(self, topic: str, value: bytes) -> Any:
        raise self.exc

    def route_request(self, handler: str, event: bytes) -> Any:
        raise self.exc


def test_any_exception_from_the_router_is_a_dead_letter_named_after_its_type() -> None:
    for exc, reason in [
        (RecursionError("maximum recursion depth exceeded"),
         "RecursionError: maximum recursion depth exceeded"),
        (OverflowError("int too big"), "OverflowError: int too big"),
        (MemoryError(), "MemoryError"),
        (TypeError("unhashable type: 'list'"), "TypeError: unhashable type: 'list'"),
    ]:  # fmt: skip
        request = InputRecord(REQUESTS, 0, 4, encode(ClientRequest("r", "poke", b"")))
        sequenced = order(_Raising(exc), STAMP, [InputRecord(TOPIC, 1, 7, b"x")], [request])
        assert [(d.topic, d.partition, d.offset, d.reason) for d in sequenced.dead] == [
            (TOPIC, 1, 7, reason), (REQUESTS, 0, 4, reason),
        ]  # fmt: skip
        assert sequenced.record.txns == ()
