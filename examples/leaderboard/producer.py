"""Feed ``leaderboard.in.votes`` with random votes from a pool of phones.

A plain confluent-kafka producer that does not import epochal. Popularity is skewed (candidate
``c`` is drawn with weight ``c``), phones repeat (so some votes are refused as duplicates) and
about one vote in a hundred names a candidate that does not exist.

    python -m examples.leaderboard.producer --count 50000 --phones 30000
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator, Sequence

import msgspec
from confluent_kafka import Producer

__all__ = ["Vote", "main", "votes"]

TOPIC = "leaderboard.in.votes"


class Vote(msgspec.Struct, frozen=True):
    phone: str
    candidate: int


def votes(count: int, phones: int, candidates: int, seed: int) -> Iterator[Vote]:
    """``count`` votes from ``phones`` distinct 10-digit numbers; deterministic per seed."""
    rng = random.Random(seed)
    pool = [f"{n:010d}" for n in rng.sample(range(10**10), phones)]
    ids = list(range(1, candidates + 1))
    for _ in range(count):
        if rng.random() < 0.01:
            candidate = rng.choice([0, candidates + 1])  # no such candidate: refused
        else:
            candidate = rng.choices(ids, weights=ids)[0]
        yield Vote(rng.choice(pool), candidate)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    parser.add_argument("--count", type=int, default=50_000, help="votes to send")
    parser.add_argument("--phones", type=int, default=30_000, help="size of the phone pool")
    parser.add_argument("--candidates", type=int, default=9, help="candidates (app default 9)")
    parser.add_argument("--json", action="store_true", help="send JSON instead of msgpack")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the workload")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    encode = msgspec.json.encode if args.json else msgspec.msgpack.encode
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5})
    failed: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failed.append(str(error))

    sent = 0
    for vote in votes(args.count, args.phones, args.candidates, args.seed):
        while True:
            try:
                producer.produce(TOPIC, encode(vote), vote.phone.encode(), on_delivery=delivered)
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
    print(f"sent {sent} votes to {TOPIC} ({'JSON' if args.json else 'msgpack'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
