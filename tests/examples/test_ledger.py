"""The ledger example: engine == oracle on 1, 2 and 4 partitions; both totals are conserved."""

from __future__ import annotations

import msgspec
import pytest

from examples.ledger import producer
from examples.ledger.app import Account, Asset, Transfer, app
from tests.examples.support import Log, command_log, outcomes, run_engine, run_oracle, summary

KEYS = 100
TRANSFERS = 3_000


@pytest.fixture(scope="module")
def log() -> Log:
    events = producer.events(TRANSFERS, KEYS, seed=3)
    values = [
        msgspec.json.encode(e) if i % 5 == 0 else msgspec.msgpack.encode(e)
        for i, e in enumerate(events)
    ]
    return command_log(app, "ledger", values, epoch_size=400)


@pytest.fixture(scope="module")
def oracle(log: Log) -> list[tuple[object, ...]]:
    return summary(run_oracle(app, log))


@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_engine_equals_the_oracle_and_both_totals_are_conserved(
    log: Log, oracle: list[tuple[object, ...]], partitions: int
) -> None:
    run = run_engine(app, log, partitions)
    assert summary(run.results) == oracle
    for actor_type, cls in (("Account", Account), ("Asset", Asset)):
        balances = [v.balance for v in run.state(actor_type).values() if isinstance(v, cls)]
        assert len(balances) == KEYS
        assert sum(balances) == KEYS * producer.OPENING_BALANCE
        assert min(balances) >= 0
        assert sorted(run.keys_per_partition(actor_type)) == list(range(partitions))


def test_a_transfer_moves_both_ledgers_or_neither(log: Log) -> None:
    run = run_engine(app, log, 4)
    transfers = [o for o in outcomes(run.results) if o.handler == "transfer"]
    assert len(transfers) == TRANSFERS
    committed = [o for o in transfers if o.committed]
    short = {o.reason.split()[1] for o in transfers if "holds" in o.reason}
    assert 500 < len(committed) < TRANSFERS and short == {"Account", "Asset"}
    assert all(len(o.writes) == 4 for o in committed)  # the producer never self-transfers
    assert all(not o.writes for o in transfers if not o.committed)


def test_a_self_transfer_changes_nothing_and_cannot_overdraw() -> None:
    deposit = b'{"type":"Deposit","account":"acct-0001","asset":"asset-0001",'
    deposit += b'"account_amount":10,"asset_amount":10}'
    ok = Transfer("acct-0001", "acct-0001", "asset-0001", "asset-0002", 10)
    too_much = Transfer("acct-0001", "acct-0001", "asset-0002", "asset-0001", 11)
    log = command_log(
        app, "ledger", [deposit, msgspec.msgpack.encode(ok), msgspec.msgpack.encode(too_much)],
        input_partitions=1,
    )  # fmt: skip
    run = run_engine(app, log, 2)
    done = outcomes(run.results)
    assert [o.committed for o in done] == [True, True, False]
    assert done[2].reason == "InsufficientFunds: Account acct-0001 holds 10 < 11"
    accounts, assets = run.state("Account"), run.state("Asset")
    assert accounts == {"acct-0001": Account(10)}
    assert assets == {"asset-0001": Asset(0), "asset-0002": Asset(10)}
