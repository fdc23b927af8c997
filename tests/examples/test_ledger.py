"""The ledger example: engine == oracle on 1, 2 and 4 partitions; both totals are conserved.

It runs on the test harness (``epochal.testing``).
"""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from epochal.actors.oracle import SerialOracle
from epochal.testing import AppTest
from examples.ledger import producer
from examples.ledger.app import Account, Asset, Transfer, app
from tests.examples.support import summary

KEYS = 100
TRANSFERS = 3_000
EPOCH_SIZE = 400


def _ledger(partitions: int) -> AppTest:
    """The producer's records (every fifth as JSON) over three input partitions, an epoch per
    400."""
    events = producer.events(TRANSFERS, KEYS, seed=3)
    t = AppTest(app, partitions)
    for i, e in enumerate(events):
        value = msgspec.json.encode(e) if i % 5 == 0 else msgspec.msgpack.encode(e)
        t.send("ledger", value, partition=i % 3)
        if i % EPOCH_SIZE == EPOCH_SIZE - 1:
            t.run()
    t.run()
    return t


@pytest.fixture(scope="module")
def oracle() -> list[tuple[object, ...]]:
    return summary(SerialOracle(app).run(_ledger(1).command_log))


@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_engine_equals_the_oracle_and_both_totals_are_conserved(
    oracle: list[tuple[object, ...]], partitions: int
) -> None:
    t = _ledger(partitions)
    assert summary(t.results) == oracle
    for cls in (Account, Asset):
        balances = [v.balance for v in t.state(cls).values()]
        assert len(balances) == KEYS
        assert sum(balances) == KEYS * producer.OPENING_BALANCE
        assert min(balances) >= 0
        refs = [ref for ref in t.engine.store.values if ref.actor_type == cls.__name__]
        owners = Counter(int(t.engine.ranges.partition_of(ref)) for ref in refs)
        assert sorted(owners) == list(range(partitions))


def test_a_transfer_moves_both_ledgers_or_neither() -> None:
    t = _ledger(4)
    transfers = [o for o in t.outcomes if o.handler == "transfer"]
    assert len(transfers) == TRANSFERS
    committed = [o for o in transfers if o.committed]
    short = {o.reason.split()[1] for o in transfers if "holds" in o.reason}
    assert 500 < len(committed) < TRANSFERS and short == {"Account", "Asset"}
    assert all(len(o.writes) == 4 for o in committed)  # the producer never self-transfers
    assert all(not o.writes for o in transfers if not o.committed)


def test_a_self_transfer_changes_nothing_and_cannot_overdraw() -> None:
    deposit = b'{"type":"Deposit","account":"acct-0001","asset":"asset-0001",'
    deposit += b'"account_amount":10,"asset_amount":10}'
    t = AppTest(app, partitions=2)
    t.send("ledger", deposit)
    t.send("ledger", Transfer("acct-0001", "acct-0001", "asset-0001", "asset-0002", 10))
    t.send("ledger", Transfer("acct-0001", "acct-0001", "asset-0002", "asset-0001", 11))
    t.run()
    assert [o.committed for o in t.outcomes] == [True, True, False]
    assert [a.reason for a in t.aborts] == ["InsufficientFunds: Account acct-0001 holds 10 < 11"]
    assert t.state(Account) == {"acct-0001": Account(10)}
    assert t.state(Asset) == {"asset-0001": Asset(0), "asset-0002": Asset(10)}
