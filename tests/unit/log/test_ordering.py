from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from epochal.log.ordering import EpochStamp, order
from epochal.schemas.codec import encode
from epochal.schemas.commands import ClientRequest, InputRecord, Origin
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
