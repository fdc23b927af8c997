"""Feed ``bank.in.transfers``: an opening deposit into every account, then random transfers.

A plain confluent-kafka producer that does not import epochal: any Kafka client that writes
msgpack (or JSON, with ``--json``) records of the right shape can drive an epochal app. The
structs below mirror ``examples/bank/app.py`` field for field; the tag (``"type"``) tells the
app which transaction a record invokes.

    python -m examples.bank.producer --count 100000 --accounts 1000
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator, Sequence

import msgspec

from examples.feed import common_flags, send

__all__ = ["Deposit", "Transfer", "events", "main"]

TOPIC = "bank.in.transfers"
OPENING_BALANCE = 1_000


class Deposit(msgspec.Struct, frozen=True, tag=True):
    account: str
    amount: int


class Transfer(msgspec.Struct, frozen=True, tag=True):
    source: str
    target: str
    amount: int


def events(count: int, accounts: int, seed: int) -> Iterator[Deposit | Transfer]:
    """Opening deposits, then ``count`` transfers; some overdraw on purpose (they abort)."""
    rng = random.Random(seed)
    # spread over the whole key space (acct-0000..acct-9999), so over every partition's range
    keys = [f"acct-{i * 10_000 // accounts:04d}" for i in range(accounts)]
    for key in keys:
        yield Deposit(key, OPENING_BALANCE)
    for _ in range(count):
        source, target = rng.sample(keys, 2)
        yield Transfer(source, target, rng.randrange(1, OPENING_BALANCE // 2))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_flags(parser, TOPIC)
    parser.add_argument("--accounts", type=int, default=1_000, help="accounts (at most 10,000)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 2 <= args.accounts <= 10_000:
        print("--accounts must be between 2 and 10,000", file=sys.stderr)
        return 2
    keyed = (
        (event.account if isinstance(event, Deposit) else event.source, event)
        for event in events(args.count, args.accounts, args.seed)
    )
    return send(args, keyed)


if __name__ == "__main__":
    sys.exit(main())
