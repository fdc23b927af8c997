"""The engine's hot path without Kafka: sequencer ordering and epoch execution of bank transfers.

    python -m bench.profile_engine --transfers 100000 --partitions 2          # rates + profile
    python -m bench.profile_engine --checkouts ../baseline . --repeats 5      # side by side

With ``--checkouts`` each repeat runs this script, unprofiled, once per checkout of epochal (its
``epochal`` package, examples and sequencer), interleaved so that drift hits every checkout
alike, and reports the median rates and their ratio to the first checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from epochal.actors.engine import Engine
from epochal.actors.lifecycle import collect_less
from epochal.log.ordering import EpochStamp, order
from epochal.schemas.commands import EpochRecord, InputRecord
from examples.bank.app import app
from examples.bank.producer import events


def _command_log(transfers: int, per_epoch: int) -> tuple[list[EpochRecord], float]:
    """The bank's command log of ``transfers``, and the CPU seconds ``order()`` took to make it
    (as the sequencer runs it: the cycle collector tuned alike)."""
    collect_less()
    values = [msgspec.msgpack.encode(e) for e in events(transfers, 10_000, seed=1)]
    inputs = [InputRecord("bank.in.transfers", 0, i, v) for i, v in enumerate(values)]
    batches = [inputs[start : start + per_epoch] for start in range(0, len(inputs), per_epoch)]
    code = app.code_hash()  # as the sequencer logs it: workers then skip checks it made
    started = time.process_time()
    records = [order(app, EpochStamp(e, e, e, code), b).record for e, b in enumerate(batches)]
    return records, time.process_time() - started


def measure(transfers: int, partitions: int, per_epoch: int, digest: bool) -> dict[str, float]:
    """Records/s of ``order()`` and transactions/s of one engine, unprofiled, per second of
    this process's CPU (both run on one thread: on an idle machine that is the wall time, and a
    busy one does not skew it)."""
    log, ordered = _command_log(transfers, per_epoch)
    txns = sum(len(r.txns) for r in log)
    engine = _worker_like_engine(partitions, digest)
    started = time.process_time()
    asyncio.run(_drain(engine, log))
    return {"order_per_s": txns / ordered, "engine_tps": txns / (time.process_time() - started)}


def _worker_like_engine(partitions: int, digest: bool) -> Engine:
    """An engine set up as a worker's is: versions kept for queries, and Python's cycle
    collector tuned as a worker tunes it (its default walks the store's objects so often that
    it took a third of the engine's time)."""
    collect_less()
    return Engine(app, partitions, track_digest=digest, queries=True)


async def _drain(engine: Engine, log: list[EpochRecord]) -> None:
    """Run every epoch, keeping no result (``asyncio.run`` would hold them all)."""
    for record in log:
        await engine.run_epoch(record)


def _side_by_side(args: argparse.Namespace) -> None:
    flags = ["--transfers", str(args.transfers), "--partitions", str(args.partitions),
             "--per-epoch", str(args.per_epoch), "--json"]  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in args.checkouts}
    for _ in range(args.repeats):
        for checkout in args.checkouts:
            root = str(Path(checkout).resolve())
            env = {**os.environ, "PYTHONPATH": root, "PYTHONHASHSEED": "0"}
            done = subprocess.run(
                [sys.executable, __file__, *flags],
                cwd=root, env=env, check=True, capture_output=True, text=True,
            )  # fmt: skip
            runs[checkout].append(json.loads(done.stdout.splitlines()[-1]))
    first = statistics.median(r["engine_tps"] for r in runs[args.checkouts[0]])
    for checkout, results in runs.items():
        tps = [r["engine_tps"] for r in results]
        order_rate = statistics.median(r["order_per_s"] for r in results)
        median = statistics.median(tps)
        runs_text = ", ".join(f"{t:,.0f}" for t in tps)
        print(
            f"{checkout}: engine {median:,.0f} tx/s (runs {runs_text}; ratio {median / first:.2f}x)"
            f", order() {order_rate:,.0f} records/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transfers", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--per-epoch", type=int, default=2000)
    parser.add_argument("--digest", action="store_true", help="track state digests")
    parser.add_argument("--checkouts", nargs="+", help="epochal checkouts to compare")
    parser.add_argument("--repeats", type=int, default=3, help="runs per checkout (median)")
    parser.add_argument("--json", action="store_true", help="one unprofiled run, rates as JSON")
    args = parser.parse_args()
    if args.checkouts:
        _side_by_side(args)
        return
    if args.json:
        print(json.dumps(measure(args.transfers, args.partitions, args.per_epoch, args.digest)))
        return

    rates = measure(args.transfers, args.partitions, args.per_epoch, args.digest)
    print(f"order(): {rates['order_per_s']:,.0f} records/s")
    print(f"engine ({args.partitions} partitions, one process): {rates['engine_tps']:,.0f} tx/s")
    log, _ = _command_log(args.transfers, args.per_epoch)
    engine = _worker_like_engine(args.partitions, args.digest)
    profiler = cProfile.Profile()
    profiler.enable()
    asyncio.run(_drain(engine, log))
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
