"""The partitions of one worker on one asyncio loop, executing command-log epochs in order.

Partition ``p`` of ``P`` belongs to worker ``p * W // P`` (contiguous blocks, so neighbouring
key ranges share a process). A transaction runs once, on the worker of the lowest partition it
touches (:mod:`epochal.actors.executor`); the values of its keys on other workers arrive there
over TCP (:mod:`epochal.actors.transport`) as canonical bytes, and its writes to them go back.
At the end of each epoch every worker announces the events its transactions emitted and waits
for the others', so that all derive the same interior transactions for the next epoch.

:class:`LocalEngine` is the one-worker case: all partitions in this process, no network.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from epochal.actors.api import App
from epochal.actors.digest import DigestSum
from epochal.actors.executor import EpochExecutor, share_slices
from epochal.actors.outcome import BY_EMIT_ORDER, BY_SEQ, Emitted, TxnOutcome
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import EpochClock, emitted_by, plan_slices
from epochal.actors.snapshots import Reported
from epochal.actors.store import Change, StateStore
from epochal.actors.transport import (
    DoneFrame,
    PartFrame,
    PeerFrame,
    Peers,
    ReadsFrame,
    TransportError,
    TxnValues,
    WritesFrame,
)
from epochal.errors import RecoveryError, SchemaError
from epochal.schemas.canonical import decode_canonical
from epochal.schemas.commands import ActorKey, EpochRecord, KeyRef, PartitionId
from epochal.schemas.snapshots import SnapshotPart

__all__ = ["Engine", "EpochResult", "LocalEngine", "OnReported", "owner_of", "partitions_of"]

T = TypeVar("T")

VERSION_WINDOW_EPOCHS = 32
"""Without snapshots, a store that serves ``COMMITTED`` reads keeps versions back this many
epochs at most (with snapshots, back to the last one): a read at an older cut is refused and the
client asks again at a newer one."""


def owner_of(partition: int, partitions: int, workers: int) -> int:
    """The worker that runs a partition."""
    return partition * workers // partitions


def partitions_of(worker: int, partitions: int, workers: int) -> tuple[PartitionId, ...]:
    """The partitions a worker runs."""
    return tuple(
        PartitionId(p) for p in range(partitions) if owner_of(p, partitions, workers) == worker
    )


def _migrated(migrate: Callable[[bytes], bytes | None], ref: KeyRef, value: bytes) -> bytes | None:
    """A restored value through its type's migration; one that fails stops the start (no
    restart can help), naming the actor."""
    try:
        return migrate(value)
    except SchemaError as exc:
        raise RecoveryError(
            f"{exc.message}; fix the migration and start again",
            actor_type=ref.actor_type, key=ref.key,
        ) from exc  # fmt: skip


@dataclass(frozen=True)
class EpochResult:
    """The outcomes this worker reports for one epoch, in timestamp order, and its digest after.

    ``by_partition`` says which partition reported which outcomes (each commits its own egress).
    At an epoch that ends with a snapshot, ``changes`` are this worker's actors changed since
    the last one (only if the engine takes snapshots).
    """

    epoch: int
    outcomes: tuple[TxnOutcome, ...]
    digest: str
    by_partition: dict[PartitionId, list[TxnOutcome]] = field(default_factory=dict)
    changes: Sequence[Change] | None = None  # at a snapshot epoch: this worker's changed actors


OnReported = Callable[[Mapping[PartitionId, list[TxnOutcome]]], None]
"""Takes the outcomes a slice of an epoch reported, by partition, each partition's in
timestamp order."""


class _Reporting:
    """What an epoch's reported outcomes leave, slice by slice: all of them, or, when they go
    to ``on_reported``, only those that emitted; and with ``archived`` (snapshots), their
    seqs and abort reasons."""

    def __init__(
        self, partitions: Iterable[PartitionId], on_reported: OnReported | None, archived: bool
    ) -> None:
        self.on_reported = on_reported
        self.archived = archived
        self.outcomes: list[TxnOutcome] = []  # in timestamp order
        self.by_partition: dict[PartitionId, list[TxnOutcome]] = (
            {p: [] for p in partitions} if on_reported is None else {}
        )
        self.seqs: list[int] = []
        self.aborted: dict[int, str] = {}

    def add(self, reported: dict[PartitionId, list[TxnOutcome]]) -> None:
        """One slice's outcomes: slices come in timestamp order."""
        outcomes = sorted(itertools.chain.from_iterable(reported.values()), key=BY_SEQ)
        if self.archived:
            self.seqs += [o.seq for o in outcomes]
            self.aborted.update((o.seq, o.reason) for o in outcomes if not o.committed)
        if self.on_reported is not None:
            self.on_reported(reported)
            self.outcomes += [o for o in outcomes if o.emits]
            return
        self.outcomes += outcomes
        for partition, part in reported.items():
            self.by_partition[partition] += part


class Engine:
    """One worker's partitions; give it :class:`Peers` when there are several workers.

    >>> engine = Engine(app, partitions=4, worker=0, workers=2, peers=peers)
    >>> result = await engine.run_epoch(record)

    ``ranges`` is the cluster's layout (its split points); by default a new app's.
    """

    def __init__(
        self,
        app: App,
        partitions: int,
        worker: int = 0,
        workers: int = 1,
        peers: Peers | None = None,
        *,
        track_digest: bool = True,
        snapshots: bool = False,
        queries: bool = False,
        ranges: KeyRanges | None = None,
    ) -> None:
        if workers > 1 and peers is None:
            raise ValueError("several workers need peers to exchange with")
        self.app = app
        self.worker = worker
        self.workers = workers
        self.total = partitions
        if ranges is not None and ranges.partitions != partitions:
            raise ValueError(f"a layout of {ranges.partitions} partitions, not {partitions}")
        self.ranges = ranges if ranges is not None else KeyRanges.even(app, partitions)
        self.worker_of = tuple(owner_of(p, partitions, workers) for p in range(partitions))
        self.partitions = partitions_of(worker, partitions, workers)
        self.ran: dict[PartitionId, int] = dict.fromkeys(self.partitions, 0)
        """Transactions each partition took part in (ran on a key of it), since the start."""
        self.snapshots = snapshots
        self.store = StateStore(self.partitions, track_digest, versioned=snapshots or queries)
        self.executed = -1  # the last epoch this worker has run (its writes are all applied)
        self.completed = -1  # the last epoch every worker has run: a consistent cut
        self.executor = EpochExecutor(app, worker, self.partitions, self.store)
        self.peers = peers
        if peers is not None:
            peers.on_frame = self.on_frame
        self.carried: list[Emitted] = []
        self._reported: list[Reported] = []  # with snapshots: since the last take_reported()
        self.on_part: Callable[[SnapshotPart], None] = lambda part: None  # worker 0's committer
        self.on_committed: Callable[[int], None] = lambda ssid: None  # worker 0 said: committed
        self._done: dict[int, dict[int, list[Emitted]]] = {}
        self._done_arrived = asyncio.Event()
        self._reads_out: dict[tuple[int, int], list[TxnValues]] = {}  # by (peer, epoch)
        self._writes_out: dict[tuple[int, int], list[TxnValues]] = {}
        self._alone = all(w == worker for w in self.worker_of)  # owns every partition

    # --- the Exchange protocol ---------------------------------------------------------------

    def send_reads(
        self, to: int, epoch: int, seq: int, refs: tuple[KeyRef, ...], values: list[bytes | None]
    ) -> None:
        """Buffered until :meth:`flush`: one frame per peer per exchange round."""
        self._reads_out.setdefault((to, epoch), []).append(TxnValues(seq, refs, values))

    def send_writes(
        self, to: int, epoch: int, seq: int, refs: tuple[KeyRef, ...], values: list[bytes | None]
    ) -> None:
        """Buffered until :meth:`flush`, as :meth:`send_reads`."""
        self._writes_out.setdefault((to, epoch), []).append(TxnValues(seq, refs, values))

    async def flush(self) -> None:
        if self.peers is not None:
            generation = self.peers.generation
            for (to, epoch), txns in self._reads_out.items():
                self.peers.send(to, ReadsFrame(generation, epoch, txns))
            for (to, epoch), txns in self._writes_out.items():
                self.peers.send(to, WritesFrame(generation, epoch, txns))
            self._reads_out.clear()
            self._writes_out.clear()
            await self.peers.flush()
        await asyncio.sleep(0)  # let the receivers run

    def on_frame(self, frame: PeerFrame) -> None:
        """Frames from other workers (the transport calls this)."""
        if isinstance(frame, ReadsFrame | WritesFrame):
            executor, epoch = self.executor, frame.epoch
            receive = (
                executor.receive_reads if isinstance(frame, ReadsFrame) else executor.receive_writes
            )
            for txn in frame.txns:
                receive(epoch, txn.seq, txn.refs, txn.values)
        elif isinstance(frame, DoneFrame):
            self._done.setdefault(frame.epoch, {})[frame.worker] = frame.emits
            self._done_arrived.set()
        elif isinstance(frame, PartFrame):
            self.on_part(frame.part)
        else:
            self.on_committed(frame.ssid)

    # --- epochs ----------------------------------------------------------------------------

    async def run_epoch(
        self, record: EpochRecord, on_reported: OnReported | None = None
    ) -> EpochResult:
        """Run one epoch a slice at a time (its objects stay in cache while the slice runs).

        ``on_reported`` takes each slice's reported outcomes, by partition, as soon as the
        slice has run (while they are still in cache; a worker encodes their egress then), and
        the result then holds only those that emitted: what the next epoch needs.
        """
        clock = EpochClock.of(record)
        carried = self.carried
        taken = _Reporting(self.partitions, on_reported, archived=self.snapshots)
        if self._alone:
            for plan in plan_slices(self.app, record, carried):
                taken.add(self.executor.run_alone(clock, plan, self.ranges, self.ran))
        else:
            slices = share_slices(
                self.app, record, carried, self.ranges, worker_of=self.worker_of, worker=self.worker
            )
            for steps in slices:
                running = self.executor.run_epoch(clock, steps, self, self.ran)
                taken.add(await self._unless_peers_fail(running))
        self.executed = record.epoch
        if self.snapshots:
            self._reported.append(Reported.of(record, taken.seqs, taken.aborted, carried))
        emitted = emitted_by(taken.outcomes)
        if self.peers is not None:
            emitted += await self._exchange_emits(record.epoch, emitted)
            if self.executor.unanswered:  # each runner sends its writes before its DoneFrame
                raise TransportError(
                    "every worker ended the epoch, but writes of transactions this worker lent "
                    "its reads to did not come", worker=self.worker, epoch=record.epoch,
                    missing=self.executor.unanswered,
                )  # fmt: skip
        self.carried = sorted(emitted, key=BY_EMIT_ORDER)
        self.completed = record.epoch  # every other worker announced its end of this epoch
        changes = None
        if record.snapshot and self.snapshots:
            changes = self.store.take_changes(record.epoch)
        elif (
            not self.snapshots
            and self.store.versioned
            and record.epoch - self.store.floor >= VERSION_WINDOW_EPOCHS
        ):
            self.store.raise_floor(record.epoch - 1)  # queries only: keep a few epochs' versions
        return EpochResult(
            record.epoch, tuple(taken.outcomes), self.digest(), taken.by_partition, changes
        )

    def take_reported(self) -> list[Reported]:
        """With snapshots: what the transactions this worker reported did since the last call
        (or the load), for the snapshot that closes these epochs."""
        reported, self._reported = self._reported, []
        return reported

    def load(
        self, actors: Mapping[str, Iterable[tuple[ActorKey, bytes]]], epoch: int,
        carried: list[Emitted],
        migrations: Mapping[str, Callable[[bytes], bytes | None]] | None = None,
    ) -> None:  # fmt: skip
        """Start from a snapshot taken at the end of ``epoch``: keep the actors of this worker's
        partitions, and the interior transactions that were to run next. ``migrations`` turn
        the values of their actor types into the new schema's: changes since the snapshot, so
        the next one holds them."""
        mine = set(self.partitions)
        migrated: list[tuple[KeyRef, PartitionId, bytes | None]] = []
        for actor_type, rows in actors.items():
            migrate = (migrations or {}).get(actor_type)
            for key, value in rows:
                ref = KeyRef(actor_type, key)
                partition = self.ranges.partition_of(ref)
                if partition in mine:
                    self.store.load(ref, partition, value)
                    if migrate is not None:
                        migrated.append((ref, partition, _migrated(migrate, ref, value)))
        self.store.floor = epoch
        for ref, partition, new in migrated:
            self.store.apply(ref, partition, new, epoch)
        self.executed = self.completed = epoch
        self.carried = list(carried)
        self._reported = []

    async def _exchange_emits(self, epoch: int, mine: list[Emitted]) -> list[Emitted]:
        """Announce this worker's emits for ``epoch`` and collect every other worker's."""
        assert self.peers is not None
        self.peers.broadcast(DoneFrame(self.peers.generation, epoch, self.worker, mine))
        await self.peers.flush()
        while len(self._done.get(epoch, {})) < self.workers - 1:
            self._done_arrived.clear()
            await self._unless_peers_fail(self._done_arrived.wait())
        theirs = self._done.pop(epoch)
        return [emitted for items in theirs.values() for emitted in items]

    async def _unless_peers_fail(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable``, or raise the transport's error as soon as a peer is lost."""
        task = asyncio.ensure_future(awaitable)
        if self.peers is None:
            return await task
        watched: list[asyncio.Future[Any]] = [task, self.peers.failed]
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            self.peers.failed.result()  # raises the transport's error
        return task.result()

    async def run(self, records: Iterable[EpochRecord]) -> list[EpochResult]:
        return [await self.run_epoch(record) for record in records]

    def items(self) -> Iterator[tuple[KeyRef, msgspec.Struct]]:
        """This worker's actors, decoded."""
        types = self.app.actor_types
        for ref, data in self.store.items():
            yield ref, decode_canonical(data, types[ref.actor_type].state)

    def digest(self) -> str:
        """The digest of this worker's partitions (all of them for a one-worker engine).

        Empty when digests are not tracked. Add the ``total`` of each worker's share
        (``DigestSum``) to get a cluster's digest.
        """
        total = self.store.digest_total()
        return "" if total is None else DigestSum(total).hex()


class LocalEngine(Engine):
    """All partitions in this process: ``asyncio.run(LocalEngine(app, 4).run(records))``."""

    def __init__(self, app: App, partitions: int, *, track_digest: bool = True) -> None:
        super().__init__(app, partitions, track_digest=track_digest)
