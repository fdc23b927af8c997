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
from confluent_kafka import Producer

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
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    parser.add_argument("--count", type=int, default=10_000, help="transfers to send")
    parser.add_argument("--keys", type=int, default=1_000, help="accounts and assets (<= 10,000)")
    parser.add_argument("--json", action="store_true", help="send JSON instead of msgpack")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the workload")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 2 <= args.keys <= 10_000:
        print("--keys must be between 2 and 10,000", file=sys.stderr)
        return 2
    encode = msgspec.json.encode if args.json else msgspec.msgpack.encode
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5})
    failed: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failed.append(str(error))

    sent = 0
    for event in events(args.count, args.keys, args.seed):
        # keyed by the source account, so an account's deposit precedes its outgoing transfers
        key = event.account if isinstance(event, Deposit) else event.src_account
        while True:
            try:
                producer.produce(TOPIC, encode(event), key.encode(), on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)
        sent += 1
    left = producer.flush(30)
    if left or failed:
        reason = failed[0] if failed else "timed out"
        print(f"{left + len(failed)} of {sent} records not delivered: {reason}", file=sys.stderr)
        return 1
    print(f"sent {sent} records to {TOPIC} ({'JSON' if args.json else 'msgpack'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
