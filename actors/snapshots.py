"""A worker's part in snapshots (docs/recovery.md), whatever stores them.

At the end of an epoch the sequencer marked, every worker takes the changes of its partitions
since the last snapshot (O(changed actors), on the event loop: :meth:`Engine.run_epoch`), and
:class:`SnapshotTaker` has them written off the loop, on a thread. The written part goes to
worker 0, whose :class:`SnapshotCommitter` commits the snapshot, on a thread of its own, once
every worker's part is in. Epochs go on meanwhile: a snapshot never stalls the loop. In a
cluster both threads only wait: the work itself is done by the worker's snapshot process
(:mod:`epochal.actors.snapshot_process`), outside its GIL.

Where snapshots are stored is a :class:`Snapshots` (``recovery/`` keeps them in Delta Lake);
the engine never needs to know. With each part goes what the worker's transactions did since the
last snapshot (:class:`Reported`), for the ``commands`` archive: each worker archives the
transactions it reported, with their outcomes, so the archive is built by all workers and needs
no join at the commit.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import msgspec

from epochal.actors.api import App
from epochal.actors.outcome import Emitted
from epochal.actors.plan import interior_seqs
from epochal.actors.store import Change
from epochal.schemas.canonical import encode_canonical
from epochal.schemas.commands import ActorKey, EpochRecord
from epochal.schemas.snapshots import Manifest, OutboxRow, SnapshotPart

__all__ = [
    "Reported",
    "Restored",
    "SnapshotCommitter",
    "SnapshotTaker",
    "Snapshots",
    "carried_of",
    "migrations_named",
    "with_log_position",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Restored:
    """A complete snapshot to resume from: its manifest row and every actor, as canonical bytes,
    and per actor type whose schema changed since, the migration to run over each value (the
    new bytes, or None to drop the actor)."""

    manifest: Manifest
    actors: dict[str, list[tuple[ActorKey, bytes]]]
    migrations: Mapping[str, Callable[[bytes], bytes | None]] = field(default_factory=dict)


def migrations_named(
    app: App, actor_types: Iterable[str]
) -> dict[str, Callable[[bytes], bytes | None]]:
    """The app's migration of each of ``actor_types``, as a restore runs it over each value."""
    return {name: functools.partial(app.migrated, name) for name in actor_types}


@dataclass(frozen=True, slots=True)
class Reported:
    """What the transactions one worker reported in one epoch did (taken on the event loop, so
    kept small): their seqs in order, the reason of each that aborted, and the event each
    interior one ran, as its parent emitted it (interior transactions are never logged, so the
    archive has them from here). ``now_ms``, ``seed``, ``code_hash`` are the epoch's.
    """

    epoch: int
    now_ms: int
    seed: int
    code_hash: str
    seqs: list[int]
    aborted: dict[int, str]
    interior: dict[int, Emitted]

    @classmethod
    def of(
        cls,
        record: EpochRecord,
        seqs: list[int],
        aborted: dict[int, str],
        carried: Sequence[Emitted],
    ) -> Reported:
        """From the seqs of an epoch's reported outcomes (in order), the reasons of those that
        aborted, and the interior transactions it started with (``carried``)."""
        interior: dict[int, Emitted] = {}
        if carried and seqs and seqs[0] < 0:
            emitted = dict(interior_seqs(carried))
            interior = {seq: emitted[seq] for seq in seqs if seq < 0}
        return cls(record.epoch, record.now_ms, record.seed, record.code_hash, seqs, aborted,
                   interior)  # fmt: skip


class Snapshots(Protocol):
    """Where an app's snapshots live."""

    def ensure_tables(self, code_hash: str) -> None:
        """Create what storing snapshots needs (once, at start, by the committer)."""

    def restore(self) -> Restored | None:
        """The newest complete snapshot that reads back whole, or None."""

    def write(
        self,
        ssid: int,
        worker: int,
        changes: Sequence[Change],
        *,
        commands: Sequence[EpochRecord] = (),
        outbox: Sequence[OutboxRow] = (),
        reported: Sequence[Reported] = (),
        archived: Sequence[msgspec.Raw] = (),
    ) -> SnapshotPart:
        """Store one worker's changes for snapshot ``ssid``, not yet visible (any thread), with
        the egress and dead letters it holds (weak mode) and what its transactions did since
        the last snapshot (``reported``). The epochs it closes go to the archive either as the
        transactions of ``reported`` among ``archived`` (each worker, each epoch's msgpack: with
        their outcomes) or
        whole (``commands``, one part: the outcomes every part reports are joined on at the
        commit)."""

    def outbox(
        self, manifest: Manifest, partitions: Sequence[int], from_epoch: int
    ) -> list[OutboxRow]:
        """Weak mode: the egress and dead letters of ``partitions`` held by the snapshots up to
        ``manifest``, from epoch ``from_epoch`` on, in order."""

    def commit(self, parts: Sequence[SnapshotPart], epoch: int) -> Manifest:
        """Make snapshot ``epoch`` visible from every worker's part, idempotently (one thread),
        the archived epochs with the outcomes the parts report."""

    def retain(self, latest: Manifest) -> None:
        """After ``latest`` was committed: forget snapshots no longer kept, and the records of
        the logs that only those needed (same thread as ``commit``)."""


def with_log_position(
    part: SnapshotPart, record: EpochRecord, next_position: int, carried: Sequence[Emitted]
) -> SnapshotPart:
    """Worker 0's part says where the log stood after the snapshot's epoch: the command-log
    position to replay from, the input positions, the epoch's time, and the interior
    transactions that run first after it."""
    return msgspec.structs.replace(
        part, time_ms=record.now_ms, command_log_position=next_position,
        input_positions=dict(record.next_offsets), carried=encode_canonical(list(carried)),
    )  # fmt: skip


def carried_of(manifest: Manifest) -> list[Emitted]:
    """The interior transactions a snapshot says run first after it."""
    return msgspec.msgpack.decode(manifest.carried, type=list[Emitted]) if manifest.carried else []


MAX_PENDING_PARTS = 2
"""Parts a worker hands its snapshot process before it waits: one being written, one next."""


class _Background:
    """One thread doing one kind of work in order, and the first error it met.

    Once closed it takes no more work and hands no more results back: a worker that stops
    drops what its snapshot threads were still doing, as a crash would (a part written but
    never committed is never seen). ``close`` may run on any thread while the loop goes on
    delivering what finished before it, so the closed flag is read and set under a lock.
    """

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._closed = False
        self.error: BaseException | None = None
        self.pending = 0
        self._finished: asyncio.Future[None] | None = None  # what ``room`` waits on

    async def room(self, limit: int) -> None:
        """Wait, on the loop, until fewer than ``limit`` pieces of work are queued or running."""
        while self.pending >= limit:
            self._finished = asyncio.get_running_loop().create_future()
            await self._finished

    def run(self, work: Callable[[], T], then: Callable[[T], None]) -> None:
        """``work()`` on the thread, then ``then(result)`` back on the loop (neither once
        closed)."""
        loop = asyncio.get_running_loop()

        def done(future: Future[T]) -> None:
            def on_loop() -> None:
                self.pending -= 1
                if self._finished is not None and not self._finished.done():
                    self._finished.set_result(None)
                if future.exception() is not None:
                    self.error = self.error or future.exception()
                elif not self._closed:
                    then(future.result())

            loop.call_soon_threadsafe(on_loop)

        with self._lock:
            if self._closed:
                return
            self.pending += 1
            self._pool.submit(work).add_done_callback(done)

    def check(self) -> None:
        """Raise the thread's error on the loop, where it stops the worker (and rolls back)."""
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Take no more work, and wait for what the thread is doing."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=False)


class SnapshotTaker:
    """Writes this worker's changes of each snapshot on a thread, then hands the part on.

    ``deliver(part, seconds)`` runs back on the loop once the part is written.
    """

    def __init__(
        self, snapshots: Snapshots, worker: int, deliver: Callable[[SnapshotPart, float], None]
    ) -> None:
        self.snapshots = snapshots
        self.worker = worker
        self.deliver = deliver
        self._writer = _Background("snapshot-writer")

    def take(
        self,
        ssid: int,
        changes: Sequence[Change],
        head: Callable[[SnapshotPart], SnapshotPart],
        *,
        archived: Sequence[msgspec.Raw] = (),
        outbox: Sequence[OutboxRow] = (),
        reported: Sequence[Reported] = (),
    ) -> None:
        """Write ``changes`` (and the log rows of what this worker reported) off the loop;
        ``head`` adds what worker 0 says of the log."""

        def work() -> tuple[SnapshotPart, float]:
            started = time.perf_counter()
            written = self.snapshots.write(ssid, self.worker, changes, archived=archived,
                                           outbox=outbox, reported=reported)  # fmt: skip
            part = head(written)
            return part, time.perf_counter() - started

        self._writer.run(work, lambda done: self.deliver(*done))

    async def room(self) -> None:
        """Wait while :data:`MAX_PENDING_PARTS` parts are still being written: a snapshot
        process that falls behind slows its worker, where each part waiting would hold a
        snapshot interval's changes in the worker's memory."""
        await self._writer.room(MAX_PENDING_PARTS)

    def check(self) -> None:
        self._writer.check()

    def close(self) -> None:
        self._writer.close()


class SnapshotCommitter:
    """Worker 0: collects every worker's part of a snapshot and commits it, in ssid order."""

    def __init__(
        self,
        snapshots: Snapshots,
        workers: int,
        committed: Callable[[Manifest, float], None] = lambda manifest, seconds: None,
    ) -> None:
        self.snapshots = snapshots
        self.workers = workers
        self.committed = committed
        self._parts: dict[int, dict[int, SnapshotPart]] = {}
        self._committer = _Background("snapshot-committer")

    def receive(self, part: SnapshotPart) -> None:
        """A worker's part (worker 0's own included); commit once the snapshot is whole."""
        parts = self._parts.setdefault(part.ssid, {})
        parts[part.worker] = part
        if len(parts) < self.workers:
            return
        del self._parts[part.ssid]
        ordered = [parts[w] for w in sorted(parts)]
        ssid = part.ssid

        def work() -> tuple[Manifest, float]:
            started = time.perf_counter()
            manifest = self.snapshots.commit(ordered, ssid)
            seconds = time.perf_counter() - started
            self.snapshots.retain(manifest)
            return manifest, seconds

        self._committer.run(work, lambda done: self.committed(*done))

    @property
    def pending(self) -> int:
        return self._committer.pending

    def check(self) -> None:
        self._committer.check()

    def close(self) -> None:
        self._committer.close()
