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
from confluent_kafka import Producer

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
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    parser.add_argument("--count", type=int, default=10_000, help="transfers to send")
    parser.add_argument("--accounts", type=int, default=1_000, help="accounts (at most 10,000)")
    parser.add_argument("--json", action="store_true", help="send JSON instead of msgpack")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the workload")
    parser.add_argument("--topic", default=TOPIC, help="input topic (for an app run with --name)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 2 <= args.accounts <= 10_000:
        print("--accounts must be between 2 and 10,000", file=sys.stderr)
        return 2
    encode = msgspec.json.encode if args.json else msgspec.msgpack.encode
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5})
    failed: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failed.append(str(error))

    sent = 0
    for event in events(args.count, args.accounts, args.seed):
        # keyed by the source account, so one account's records keep their order in Kafka
        key = event.account if isinstance(event, Deposit) else event.source
        while True:
            try:
                producer.produce(args.topic, encode(event), key.encode(), on_delivery=delivered)
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
    print(f"sent {sent} records to {args.topic} ({'JSON' if args.json else 'msgpack'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
