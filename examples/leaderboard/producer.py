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

from examples.feed import common_flags, send

__all__ = ["Vote", "main", "votes"]

TOPIC = "leaderboard.in.votes"


class Vote(msgspec.Struct, frozen=True):
    phone: str
    candidate: int


def votes(
    count: int, phones: int, candidates: int, seed: int, invalid: float = 0.01
) -> Iterator[Vote]:
    """``count`` votes from ``phones`` distinct 10-digit numbers, a share ``invalid`` of them
    for no candidate; deterministic per seed."""
    rng = random.Random(seed)
    pool = [f"{n:010d}" for n in rng.sample(range(10**10), phones)]
    ids = list(range(1, candidates + 1))
    for _ in range(count):
        if rng.random() < invalid:
            candidate = rng.choice([0, candidates + 1])  # no such candidate: refused
        else:
            candidate = rng.choices(ids, weights=ids)[0]
        yield Vote(rng.choice(pool), candidate)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_flags(parser, TOPIC)
    parser.set_defaults(count=50_000)
    parser.add_argument("--phones", type=int, default=30_000, help="size of the phone pool")
    parser.add_argument("--candidates", type=int, default=9, help="candidates (app default 9)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    chosen = votes(args.count, args.phones, args.candidates, args.seed)
    return send(args, ((vote.phone, vote) for vote in chosen))


if __name__ == "__main__":
    sys.exit(main())
