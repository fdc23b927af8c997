"""bench.baselines' plain bank on a real broker equals a serial replay of the bank's rules.

The baseline is the bar epochal's throughput is measured against (``python -m bench.bank``); a
bar that computes something else than the bank is no bar. The expected balances and outputs are
replayed here from the events themselves, by the rules of ``examples/bank/app.py``, not with the
baseline's code.
"""

from __future__ import annotations

import threading
import time
import uuid

import msgspec
import pytest
from confluent_kafka import TopicPartition

from bench.baselines import Aborted, PlainBank, Receipt, plain_bank
from epochal.log.client import KafkaClients
from examples.bank.producer import Deposit, Transfer, events

pytestmark = pytest.mark.integration

TRANSFERS = 300
ACCOUNTS = 20

Outcome = tuple[str, str, int, int, int]  # source, target, amount, source/target balance after


def _serial_replay(
    backlog: list[Deposit | Transfer],
) -> tuple[dict[str, int], list[Outcome], list[tuple[str, str, int]]]:
    """Final balances, receipts and aborted transfers of the events applied one by one."""
    balance: dict[str, int] = {}
    receipts: list[Outcome] = []
    aborted: list[tuple[str, str, int]] = []
    for event in backlog:
        if isinstance(event, Deposit):
            balance[event.account] = balance.get(event.account, 0) + event.amount
        elif event.source == event.target or balance.get(event.source, 0) < event.amount:
            aborted.append((event.source, event.target, event.amount))
        else:
            balance[event.source] -= event.amount
            balance[event.target] = balance.get(event.target, 0) + event.amount
            receipts.append(
                (
                    event.source,
                    event.target,
                    event.amount,
                    balance[event.source],
                    balance[event.target],
                )
            )
    return balance, receipts, aborted


def _backlog() -> tuple[list[Deposit | Transfer], list[bytes]]:
    """The producer's events and edges after them: a whole balance moved (commits), a transfer
    to itself, one from the emptied account; as records, with one the app's schema refuses."""
    backlog: list[Deposit | Transfer] = list(events(TRANSFERS, ACCOUNTS, seed=7))
    balances = _serial_replay(backlog)[0]
    rich = max(balances, key=lambda account: (balances[account], account))
    other = min(account for account in balances if account != rich)
    backlog += [
        Transfer(rich, other, balances[rich]),
        Transfer(rich, rich, 1),
        Transfer(rich, other, 1),
    ]
    values = [msgspec.msgpack.encode(event) for event in backlog]
    values.insert(50, msgspec.msgpack.encode(Deposit("alice", 5)))  # not an account key
    return backlog, values


def _read(kafka: KafkaClients, topics: list[str], count: int) -> dict[str, list[bytes]]:
    """The committed values of one-partition ``topics``: ``count`` of them in all, or what came
    in 30 s, and any extra that comes within 0.5 s more."""
    reader = kafka.consumer(
        **{"isolation.level": "read_committed", "group.id": f"{topics[0]}.read"}
    )
    reader.assign([TopicPartition(topic, 0, 0) for topic in topics])
    received: dict[str, list[bytes]] = {topic: [] for topic in topics}
    deadline = time.monotonic() + 30
    try:
        while sum(map(len, received.values())) < count and time.monotonic() < deadline:
            for message in reader.consume(num_messages=1000, timeout=0.2):
                assert message.error() is None, message.error()
                received[message.topic() or ""].append(message.value() or b"")
        for message in reader.consume(num_messages=1000, timeout=0.5):
            received[message.topic() or ""].append(message.value() or b"")
    finally:
        reader.close()
    return received


def test_plain_bank_equals_a_serial_replay_exactly_once(kafka: KafkaClients) -> None:
    name = f"baseline{uuid.uuid4().hex[:8]}"
    source, out, errors = f"{name}.in", f"{name}.out.receipts", f"{name}.out.errors"
    kafka.create_topics([source, out, errors])
    backlog, values = _backlog()
    producer = kafka.producer()
    for value in values:
        producer.produce(source, value)
    assert producer.flush(30) == 0

    stop = threading.Event()
    ran: list[PlainBank] = []
    group = f"{name}.group"

    def run() -> None:
        bootstrap, tx = kafka.config.bootstrap_servers, f"{name}.tx"
        bank = plain_bank(bootstrap, source, out, errors, transactional_id=tx, group=group,
                          stop=stop, batch=64)  # fmt: skip
        ran.append(bank)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        received = _read(kafka, [out, errors], count=TRANSFERS + 3)
    finally:
        stop.set()
        thread.join(30)
    assert ran, "the plain bank did not stop cleanly"

    balance, receipts, aborted = _serial_replay(backlog)
    got = [msgspec.msgpack.decode(v, type=Receipt) for v in received[out]]
    assert [(r.source, r.target, r.amount, r.source_balance, r.target_balance) for r in got] == (
        receipts
    )
    reports = [msgspec.msgpack.decode(v, type=Aborted) for v in received[errors]]
    assert [(a.source, a.target, a.amount) for a in reports] == aborted
    # the edges and the reasons: the whole balance moved, then the two aborts
    assert len(receipts) > 100 and len(aborted) > 2 and receipts[-1][3] == 0
    assert [a.reason for a in reports[-2:]] == [
        f"transfer from {aborted[-2][0]} to itself",
        "'balance >= 0' violated",
    ]
    assert {a.reason for a in reports[:-2]} == {"'balance >= 0' violated"}
    assert ran[0].balances == balance
    assert sum(balance.values()) == ACCOUNTS * 1_000
    assert ran[0].invalid == 1

    # the input offsets were committed with the outputs: a restart would not redo them
    checker = kafka.consumer(**{"group.id": group})
    try:
        [committed] = checker.committed([TopicPartition(source, 0)], timeout=10)
    finally:
        checker.close()
    assert committed.offset == len(values)
