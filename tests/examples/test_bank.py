"""The bank example: money is conserved, never negative, and the engine equals the oracle."""

from __future__ import annotations

import msgspec
import pytest

from epochal.schemas.codec import decode
from examples.bank import producer
from examples.bank.app import Account, Deposit, Receipt, Transfer, app
from tests.examples.support import Log, command_log, outcomes, run_engine, run_oracle, summary

ACCOUNTS = 200
TRANSFERS = 5_000


def _values() -> list[bytes]:
    """The producer's own records: every seventh as JSON, as another client would send them."""
    events = producer.events(TRANSFERS, ACCOUNTS, seed=11)
    return [
        msgspec.json.encode(e) if i % 7 == 0 else msgspec.msgpack.encode(e)
        for i, e in enumerate(events)
    ]


@pytest.fixture(scope="module")
def log() -> Log:
    return command_log(app, "transfers", _values(), epoch_size=500)


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
    log = command_log(app, "transfers", [*bad, good], input_partitions=1)
    assert [t.handler for r in log.records for t in r.txns] == ["deposit"]
    reasons = [d.reason for d in log.dead]
    assert len(reasons) == 4
    assert ">= 1" in reasons[0] and "acct-" in reasons[1] and "unknown event type" in reasons[2]


def test_money_is_conserved_and_never_negative_on_four_partitions(log: Log) -> None:
    run = run_engine(app, log, partitions=4)
    balances = {k: v.balance for k, v in run.state("Account").items() if isinstance(v, Account)}
    assert len(balances) == ACCOUNTS
    assert sum(balances.values()) == ACCOUNTS * producer.OPENING_BALANCE
    assert min(balances.values()) >= 0
    # the accounts really are spread: every partition owns some, so transfers cross partitions
    assert sorted(run.keys_per_partition("Account")) == [0, 1, 2, 3]

    done = [o for o in outcomes(run.results) if o.handler == "transfer"]
    assert len(done) == TRANSFERS
    committed = [o for o in done if o.committed]
    overdrafts = [o for o in done if "'balance >= 0' violated" in o.reason]
    assert 2_000 < len(committed) < TRANSFERS and overdrafts
    assert all(not o.writes and not o.egress for o in done if not o.committed)


def test_receipts_match_a_plain_serial_replay_of_the_log(log: Log) -> None:
    run = run_engine(app, log, partitions=4)
    balance: dict[str, int] = {}
    events = log.events(Deposit | Transfer)
    for event, outcome in zip(events, outcomes(run.results), strict=True):
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
    final = {k: v.balance for k, v in run.state("Account").items() if isinstance(v, Account)}
    assert final == balance


def test_engine_equals_the_serial_oracle(log: Log) -> None:
    engine = run_engine(app, log, partitions=4).results
    assert summary(engine) == summary(run_oracle(app, log))
