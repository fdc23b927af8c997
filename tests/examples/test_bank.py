"""The bank example: money is conserved, never negative, and the engine equals the oracle.

It runs on the test harness (``epochal.testing``): the producer's records through the
sequencer's ordering into epochs, on a four-partition engine in this process.
"""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from epochal.actors.oracle import SerialOracle
from epochal.schemas.codec import decode
from epochal.testing import AppTest
from examples.bank import producer
from examples.bank.app import Account, Deposit, Receipt, Transfer, app
from tests.examples.support import summary

ACCOUNTS = 200
TRANSFERS = 5_000
EPOCH_SIZE = 500
INPUT_PARTITIONS = 3


def _values() -> list[bytes]:
    """The producer's own records: every seventh as JSON, as another client would send them."""
    events = producer.events(TRANSFERS, ACCOUNTS, seed=11)
    return [
        msgspec.json.encode(e) if i % 7 == 0 else msgspec.msgpack.encode(e)
        for i, e in enumerate(events)
    ]


@pytest.fixture(scope="module")
def bank() -> AppTest:
    """The records spread over three input partitions, an epoch per 500, on four partitions."""
    t = AppTest(app, partitions=4)
    for i, value in enumerate(_values()):
        t.send("transfers", value, partition=i % INPUT_PARTITIONS)
        if i % EPOCH_SIZE == EPOCH_SIZE - 1:
            t.run()
    t.run()
    return t


def test_json_and_msgpack_records_route_to_their_transactions() -> None:
    json = b'{"type":"Transfer","source":"acct-0001","target":"acct-0002","amount":5}'
    routed = app.route("bank.in.transfers", json)
    assert routed.handler == "transfer"
    assert [ref.key for ref in routed.keys] == ["acct-0001", "acct-0002"]
    deposit = msgspec.msgpack.encode(producer.Deposit("acct-0042", 7))
    assert app.route("transfers", deposit).handler == "deposit"
    assert decode(app.route("transfers", deposit).event, Deposit) == Deposit("acct-0042", 7)
    assert app.handlers["transfer"].client and app.handlers["transfer"].aborts_to == "errors"


def test_invalid_records_go_to_the_dead_letters_not_into_epochs() -> None:
    bad = [
        b'{"type":"Transfer","source":"acct-0001","target":"acct-0002","amount":0}',
        b'{"type":"Deposit","account":"alice","amount":5}',
        b'{"type":"Withdrawal","account":"acct-0001","amount":5}',
        b"\xc1",
    ]
    good = b'{"type":"Deposit","account":"acct-0001","amount":5}'
    t = AppTest(app)
    for value in [*bad, good]:
        t.send("transfers", value)
    t.run()
    assert [txn.handler for r in t.command_log for txn in r.txns] == ["deposit"]
    assert t.state(Account) == {"acct-0001": Account(5)}
    reasons = [d.reason for d in t.dead_letters]
    assert len(reasons) == 4
    assert ">= 1" in reasons[0] and "acct-" in reasons[1] and "unknown event type" in reasons[2]
    assert [d.offset for d in t.dead_letters] == [0, 1, 2, 3]


def test_money_is_conserved_and_never_negative_on_four_partitions(bank: AppTest) -> None:
    balances = {k: v.balance for k, v in bank.state(Account).items()}
    assert len(balances) == ACCOUNTS
    assert sum(balances.values()) == ACCOUNTS * producer.OPENING_BALANCE
    assert min(balances.values()) >= 0
    # the accounts really are spread: every partition owns some, so transfers cross partitions
    ranges = bank.engine.ranges
    refs = [ref for ref in bank.engine.store.values if ref.actor_type == "Account"]
    owners = Counter(int(ranges.partition_of(ref)) for ref in refs)
    assert sorted(owners) == [0, 1, 2, 3]

    done = [o for o in bank.outcomes if o.handler == "transfer"]
    assert len(done) == TRANSFERS
    committed = [o for o in done if o.committed]
    overdrafts = [o for o in done if "'balance >= 0' violated" in o.reason]
    assert 2_000 < len(committed) < TRANSFERS and overdrafts
    assert all(not o.writes and not o.egress for o in done if not o.committed)
    # what the cluster writes: a receipt per committed transfer, an abort report per other
    assert len(bank.egress("receipts", Receipt)) == len(committed)
    assert [r.reason for r in bank.egress_records("errors")] == [
        o.reason for o in done if not o.committed
    ]


def test_receipts_match_a_plain_serial_replay_of_the_log(bank: AppTest) -> None:
    balance: dict[str, int] = {}
    events = [decode(t.event, Deposit | Transfer) for r in bank.command_log for t in r.txns]
    for event, outcome in zip(events, bank.outcomes, strict=True):
        if isinstance(event, Deposit):
            balance[event.account] = balance.get(event.account, 0) + event.amount
            continue
        assert isinstance(event, Transfer)
        ok = event.source != event.target and balance.get(event.source, 0) >= event.amount
        assert outcome.committed == ok, (event, outcome.reason)
        if ok:
            balance[event.source] -= event.amount
            balance[event.target] = balance.get(event.target, 0) + event.amount
            [(name, data)] = outcome.egress
            receipt = decode(data, Receipt)
            assert name == "receipts"
            assert (receipt.source_balance, receipt.target_balance) == (
                balance[event.source],
                balance[event.target],
            )
    final = {k: v.balance for k, v in bank.state(Account).items()}
    assert final == balance


def test_engine_equals_the_serial_oracle_and_every_partition_count(bank: AppTest) -> None:
    assert len(bank.command_log) == (ACCOUNTS + TRANSFERS + EPOCH_SIZE - 1) // EPOCH_SIZE
    assert summary(bank.results) == summary(SerialOracle(app).run(bank.command_log))
    bank.check_determinism(partitions=(1, 2))
