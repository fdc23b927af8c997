"""A worker's snapshot threads: a stop while they work drops what they did, quietly."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from epochal.actors.snapshots import SnapshotCommitter, SnapshotTaker
from epochal.schemas.snapshots import Manifest, SnapshotPart
from tests.unit.actors.snapshot_twins import SlowSnapshots


def test_a_part_written_while_the_worker_stops_is_dropped_without_an_error() -> None:
    """The worker closes its taker, then its committer, off the loop; a part the taker
    finishes meanwhile reaches the loop after the committer closed. It once went on to the
    closed committer and raised "cannot schedule new futures after shutdown" (a traceback in
    a clean stop, seen in CI)."""
    snapshots = SlowSnapshots()
    errors: list[dict[str, Any]] = []
    committed: list[Manifest] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: errors.append(context))
        committer = SnapshotCommitter(snapshots, 1, lambda m, _: committed.append(m))  # type: ignore[arg-type]
        taker = SnapshotTaker(snapshots, 0, lambda part, _: committer.receive(part))  # type: ignore[arg-type]
        taker.take(1, [], lambda part: part)
        await loop.run_in_executor(None, snapshots.writing.wait, 10)

        def close() -> None:  # as the worker does: taker first, then committer
            threading.Timer(0.05, snapshots.go.set).start()
            taker.close()
            committer.close()

        closing = loop.run_in_executor(None, close)
        while not closing.done():  # the loop goes on delivering what the threads finish
            await asyncio.sleep(0.01)
        await closing
        await asyncio.sleep(0.05)
        committer.receive(SnapshotPart(2, 0, (), "0", 0))  # a peer's part, after the stop
        taker.check()
        committer.check()

    asyncio.run(main())
    assert errors == []
    assert snapshots.committed == [] and committed == []


def test_a_worker_waits_while_its_snapshot_process_holds_two_parts() -> None:
    """A snapshot process behind its worker slows the worker: each part waiting holds a
    snapshot interval's changes in the worker, so a third part waits for room."""
    snapshots = SlowSnapshots()
    delivered: list[int] = []

    async def main() -> None:
        taker = SnapshotTaker(snapshots, 0, lambda part, _: delivered.append(part.ssid))  # type: ignore[arg-type]
        for ssid in (1, 2):
            await asyncio.wait_for(taker.room(), 1)  # room for one writing and one next
            taker.take(ssid, [], lambda part: part)
        third = asyncio.ensure_future(taker.room())
        await asyncio.sleep(0.1)
        waited = not third.done()
        snapshots.go.set()
        await asyncio.wait_for(third, 5)
        assert waited, "a third part went in while two were still being written"
        taker.take(3, [], lambda part: part)
        while len(delivered) < 3:
            await asyncio.sleep(0.01)
        taker.close()

    asyncio.run(main())
    assert delivered == [1, 2, 3]
