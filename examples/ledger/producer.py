"""Feed ``ledger.in.ledger``: an opening deposit per account/asset pair, then random transfers.

A plain confluent-kafka producer that does not import epochal; the structs mirror
``examples/ledger/app.py`` and their tag (``"type"``) selects the transaction.

    python -m examples.ledger.producer --count 100000 --keys 1000
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator, Sequence

import msgspec

from examples.feed import common_flags, send

__all__ = ["Deposit", "Transfer", "events", "main"]

TOPIC = "ledger.in.ledger"
OPENING_BALANCE = 1_000


class Deposit(msgspec.Struct, frozen=True, tag=True):
    account: str
    asset: str
    account_amount: int
    asset_amount: int


class Transfer(msgspec.Struct, frozen=True, tag=True):
    src_account: str
    dst_account: str
    src_asset: str
    dst_asset: str
    amount: int


def events(count: int, keys: int, seed: int) -> Iterator[Deposit | Transfer]:
    """Opening deposits into ``keys`` accounts and assets, then ``count`` random transfers.

    Amounts go up to half the opening balance, so some transfers overdraw and abort.
    """
    rng = random.Random(seed)
    # spread over the whole key space (0000..9999), so over every partition's range
    numbers = [i * 10_000 // keys for i in range(keys)]
    for n in numbers:
        yield Deposit(f"acct-{n:04d}", f"asset-{n:04d}", OPENING_BALANCE, OPENING_BALANCE)
    for _ in range(count):
        src_account, dst_account = (f"acct-{n:04d}" for n in rng.sample(numbers, 2))
        src_asset, dst_asset = (f"asset-{n:04d}" for n in rng.sample(numbers, 2))
        amount = rng.randrange(1, OPENING_BALANCE // 2)
        yield Transfer(src_account, dst_account, src_asset, dst_asset, amount)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_flags(parser, TOPIC)
    parser.add_argument("--keys", type=int, default=1_000, help="accounts and assets (<= 10,000)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 2 <= args.keys <= 10_000:
        print("--keys must be between 2 and 10,000", file=sys.stderr)
        return 2
    keyed = (
        (event.account if isinstance(event, Deposit) else event.src_account, event)
        for event in events(args.count, args.keys, args.seed)
    )
    return send(args, keyed)


if __name__ == "__main__":
    sys.exit(main())
