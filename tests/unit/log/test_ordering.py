from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from epochal.log.ordering import EpochStamp, RequestWindow, dead_letter, order
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import (
    SKIPPED_REASON,
    ClientRequest,
    DeadLetter,
    InputRecord,
    Origin,
)
from tests.unit.actors.workload import Deposit, Transfer, app

STAMP = EpochStamp(9, 1_000, 7, "code")
TOPIC = "testbank.in.ops"

records = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2), st.booleans()), max_size=40
)


@given(records)
def test_order_keeps_each_input_partition_in_offset_order_with_dense_seqs(
    spec: list[tuple[str, int, bool]],
) -> None:
    inputs, offsets = [], {}
    for suffix, partition, valid in spec:
        offset = offsets[(suffix, partition)] = offsets.get((suffix, partition), -1) + 1
        value = encode(Deposit(offset, 1)) if valid else b"\xc1"
        inputs.append(InputRecord(f"{TOPIC}{suffix}", partition, offset, value))
    sequenced = order(_AnyTopic(), STAMP, list(reversed(inputs)))
    txns = sequenced.record.txns
    assert [t.seq for t in txns] == list(range(len(txns)))
    positions = [(t.source.topic, t.source.partition, t.source.offset) for t in txns if t.source]
    assert positions == sorted(positions)
    assert len(txns) + len(sequenced.dead) == len(inputs)
    for (topic, partition), offset in {
        (f"{TOPIC}{s}", p): o for (s, p), o in offsets.items()
    }.items():
        assert sequenced.record.next_offsets[f"{topic}:{partition}"] == offset + 1


class _AnyTopic:
    """The test app's router for every topic name the property invents."""

    def route(self, topic: str, value: bytes):  # type: ignore[no-untyped-def]
        return app.route(TOPIC, value)

    def route_request(self, handler: str, event: bytes):  # type: ignore[no-untyped-def]
        return app.route_request(handler, event)


def test_dead_letters_name_the_reason_and_position_and_valid_records_go_on() -> None:
    inputs = [
        InputRecord(TOPIC, 0, 0, encode(Deposit(1, 5))),
        InputRecord(TOPIC, 0, 1, b"\xc1\x00"),
        InputRecord(TOPIC, 0, 2, b'{"type": "Refund", "account": 1}'),
        InputRecord(TOPIC, 0, 3, b'{"type": "Deposit", "account": "one", "amount": 5}'),
        InputRecord("testbank.in.nobody", 1, 7, encode(Deposit(1, 5))),
        InputRecord(TOPIC, 0, 4, b'{"type": "Transfer", "source": 1, "target": 2, "amount": 3}'),
    ]
    sequenced = order(app, STAMP, inputs)
    assert [t.handler for t in sequenced.record.txns] == ["deposit", "transfer"]
    assert sequenced.record.txns[1].event == encode(Transfer(1, 2, 3))  # JSON in, msgpack logged
    reasons = {(d.topic, d.partition, d.offset): d.reason for d in sequenced.dead}
    assert "malformed" in reasons[(TOPIC, 0, 1)]
    assert reasons[(TOPIC, 0, 2)].startswith("unknown event type")
    assert "Refund" in reasons[(TOPIC, 0, 2)]
    assert "$.account" in reasons[(TOPIC, 0, 3)]
    assert "no transaction reads this topic" in reasons[("testbank.in.nobody", 1, 7)]


def test_client_requests_follow_border_records_and_retries_are_sequenced_once() -> None:
    request = ClientRequest("req-1", "transfer", encode(Transfer(1, 2, 3)))
    not_client = ClientRequest("req-2", "deposit", encode(Deposit(1, 1)))
    requests = [
        InputRecord("testbank.requests", 0, 10, encode(request)),
        InputRecord("testbank.requests", 0, 11, encode(request)),  # a retry
        InputRecord("testbank.requests", 0, 12, encode(not_client)),
        InputRecord("testbank.requests", 0, 13, encode(ClientRequest("req-0", "transfer", b"x"))),
    ]
    border = [InputRecord(TOPIC, 0, 0, encode(Deposit(1, 5)))]
    sequenced = order(app, STAMP, border, requests, sequenced_requests={"req-0"})
    assert [(t.origin, t.request_id) for t in sequenced.record.txns] == [
        (Origin.BORDER, ""), (Origin.CLIENT, "req-1"),
    ]  # fmt: skip
    assert [d.offset for d in sequenced.dead] == [12]
    assert sequenced.record.next_offsets["testbank.requests:0"] == 14


def test_every_epoch_carries_the_full_position_vector() -> None:
    before = {f"{TOPIC}:0": 5, f"{TOPIC}:1": 9, "testbank.requests:0": 3}
    inputs = [InputRecord(TOPIC, 0, 5, encode(Deposit(1, 1))), InputRecord(TOPIC, 2, 0, b"\xc1")]
    sequenced = order(app, STAMP, inputs, positions=before)
    assert sequenced.record.next_offsets == {
        f"{TOPIC}:0": 6, f"{TOPIC}:1": 9, f"{TOPIC}:2": 1, "testbank.requests:0": 3,
    }  # fmt: skip
    assert before[f"{TOPIC}:0"] == 5  # the caller's vector is not changed


def test_a_tick_is_no_transaction_no_dead_letter_and_no_request_id() -> None:
    requests = [
        InputRecord("testbank.requests", 0, 0, encode(ClientRequest.tick(8)), timestamp_ms=10),
        InputRecord("testbank.requests", 0, 1, encode(ClientRequest.tick(8)), timestamp_ms=11),
    ]
    sequenced = order(app, STAMP, [], requests)
    assert (sequenced.record.txns, sequenced.dead) == ((), ())
    assert sequenced.requests_seen == {}
    assert sequenced.record.next_offsets == {"testbank.requests:0": 2}


def test_an_idempotency_key_is_used_once_even_by_a_request_that_went_to_the_dlq() -> None:
    bad = ClientRequest("req-1", "transfer", b"\xc1")
    good = ClientRequest("req-1", "transfer", encode(Transfer(1, 2, 3)))
    requests = [
        InputRecord("testbank.requests", 0, 0, encode(bad), timestamp_ms=100),
        InputRecord("testbank.requests", 0, 1, encode(good), timestamp_ms=300),
    ]
    sequenced = order(app, STAMP, [], requests)
    assert sequenced.record.txns == ()
    assert [d.offset for d in sequenced.dead] == [0]
    assert sequenced.requests_seen == {"req-1": 300}  # the latest record carrying it


def test_request_ids_are_forgotten_once_the_window_has_passed() -> None:
    window = RequestWindow(window_ms=1_000)
    window.remember({"a": 100, "b": 500, "c": -1}, now_ms=600)  # c: no timestamp, now counts
    window.remember({"future": 10**15}, now_ms=600)  # a clock ahead of ours does not stretch it
    assert {"a", "b", "c", "future"} <= set(_members(window))
    window.prune(now_ms=1_100)  # keeps what was seen at 100 or later
    assert set(_members(window)) == {"a", "b", "c", "future"}
    window.prune(now_ms=1_101)
    assert set(_members(window)) == {"b", "c", "future"}
    window.remember({"b": 1_400}, now_ms=1_450)  # a retry extends the window
    window.prune(now_ms=1_601)
    assert set(_members(window)) == {"b"}
    window.prune(now_ms=2_401)
    assert len(window) == 0


def test_the_window_stays_flat_over_a_long_run() -> None:
    window, sizes = RequestWindow(window_ms=1_000), []
    for now in range(0, 100_000, 10):  # one request every 10 ms for 100 s
        window.remember({f"req-{now}": now}, now_ms=now)
        window.prune(now)
        sizes.append(len(window))
    assert max(sizes) == 101
    assert len(window._heap) == 101  # no stale entries pile up either


def _members(window: RequestWindow) -> list[str]:
    return [r for r in ("a", "b", "c", "future") if r in window]


def test_a_dead_letter_is_capped_keeps_its_coordinates_and_says_it_was_cut() -> None:
    record = InputRecord("t", 3, 77, b"v" * 100_000, b"k" * 50_000)
    letter = dead_letter(record, "why " * 10_000, max_bytes=4096)
    assert len(encode(letter)) <= 4096
    assert (letter.topic, letter.partition, letter.offset) == ("t", 3, 77)
    assert (letter.truncated, letter.size) == (True, 100_000)
    assert letter.value == b"v" * len(letter.value) and len(letter.value) > 1_000
    assert letter.key == b"k" * len(letter.key or b"")
    assert letter.reason.startswith("why why") and letter.reason.endswith("...")
    small = dead_letter(InputRecord("t", 0, 1, b"abc"), "bad \ud800 text")
    assert (small.value, small.key, small.truncated, small.size) == (b"abc", None, False, 3)
    assert encode(small)  # a lone surrogate in a reason cannot break the DLQ


def test_a_dead_letter_written_before_truncation_existed_still_decodes() -> None:
    class OldDeadLetter(msgspec.Struct, frozen=True):
        reason: str
        topic: str
        partition: int
        offset: int
        value: bytes
        key: bytes | None = None

    old = decode(encode(OldDeadLetter("bad", "t", 0, 4, b"x")), DeadLetter)
    assert (old.reason, old.offset, old.truncated, old.size) == ("bad", 4, False, None)


def test_a_skipped_input_is_a_dead_letter_past_which_the_position_moves() -> None:
    inputs = [InputRecord(TOPIC, 0, o, encode(Deposit(1, o + 1))) for o in range(3)]
    skipped = {(TOPIC, 0, 1), (TOPIC, 0, 9)}
    sequenced = order(app, STAMP, inputs, skipped=skipped)
    assert [t.source.offset for t in sequenced.record.txns if t.source] == [0, 2]
    (dead,) = sequenced.dead
    assert (dead.reason, dead.offset, dead.value) == (SKIPPED_REASON, 1, inputs[1].value)
    assert sequenced.record.next_offsets[f"{TOPIC}:0"] == 3
