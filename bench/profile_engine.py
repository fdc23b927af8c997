"""Profile the hot path without Kafka: sequencer ordering and epoch execution of bank transfers.

python -m bench.profile_engine --transfers 100000 --partitions 2
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time

import msgspec

from epochal.actors.engine import Engine
from epochal.log.ordering import EpochStamp, order
from epochal.schemas.commands import EpochRecord, InputRecord
from examples.bank.app import app
from examples.bank.producer import events


def _command_log(transfers: int, per_epoch: int) -> list[EpochRecord]:
    values = [msgspec.msgpack.encode(e) for e in events(transfers, 10_000, seed=1)]
    records = []
    for epoch, start in enumerate(range(0, len(values), per_epoch)):
        inputs = [
            InputRecord("bank.in.transfers", 0, start + i, v)
            for i, v in enumerate(values[start : start + per_epoch])
        ]
        records.append(order(app, EpochStamp(epoch, epoch, epoch, "x"), inputs).record)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transfers", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--per-epoch", type=int, default=2000)
    parser.add_argument("--digest", action="store_true", help="track state digests")
    args = parser.parse_args()

    started = time.perf_counter()
    log = _command_log(args.transfers, args.per_epoch)
    ordered = time.perf_counter() - started
    txns = sum(len(r.txns) for r in log)
    print(f"order(): {txns / ordered:,.0f} records/s")

    engine = Engine(app, args.partitions, track_digest=args.digest)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    asyncio.run(engine.run(log))
    profiler.disable()
    elapsed = time.perf_counter() - started
    rate = txns / elapsed
    print(
        f"engine ({args.partitions} partitions, one process, profiled): {rate:,.0f} transactions/s"
    )
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
