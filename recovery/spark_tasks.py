"""What the strong-recovery Spark job (:mod:`epochal.recovery.spark_recovery`) runs on its
executors: stitching command-log slices into epochs, grouping transactions by key, routing
epochs and actors to tasks, and a task's replay, which writes its snapshot parts with delta-rs.

Every function here is pickled into the job by reference: executors import this module (and the
app, by its spec), never a closure over driver objects other than small records.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import os
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from epochal.actors.api import App, load_app, named
from epochal.actors.engine import Engine
from epochal.actors.lifecycle import collecting_less
from epochal.actors.outcome import Emitted
from epochal.actors.store import Change
from epochal.config import SnapshotConfig
from epochal.errors import RecoveryError
from epochal.log.amendments import Amendments
from epochal.log.command_log import EpochChunk
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import ActorKey, EpochRecord, KeyRef, PartitionId
from epochal.schemas.snapshots import SnapshotPart

__all__ = [
    "CHUNK",
    "EPOCH",
    "EpochInfo",
    "KeyGroups",
    "ProgressServer",
    "RecoveryProgress",
    "TaskResult",
    "TaskSetup",
    "assemble",
    "copy_state",
    "replay_task",
    "route_log",
    "route_state",
    "summarize",
]

EPOCH, CHUNK, STATE, ARCHIVE = 0, 1, 2, 3  # kinds of rows between the stages
StateFile = tuple[str, str]  # (actor type, URI of a Parquet file of its state table)
_ARCHIVER = 100_000  # "worker" numbers of the parts archiving commands (file names only)


@dataclass(frozen=True)
class RecoveryProgress:
    """Where a recovery stands: ``phase`` (reading, replaying, committing) and ``done`` of
    ``total`` (command-log records, transactions, snapshots)."""

    phase: str
    done: int
    total: int


class KeyGroups:
    """Union-find over actor keys: transactions whose declared key sets share a key, directly or
    through others, fall in one group; a group's weight counts its transactions.

    >>> groups = KeyGroups(); groups.link([a, b]); groups.link([b, c]); len(groups.groups())
    1
    """

    def __init__(self) -> None:
        self.parent: dict[KeyRef, KeyRef] = {}
        self.weight: dict[KeyRef, int] = {}

    def find(self, ref: KeyRef) -> KeyRef:
        parent = self.parent.setdefault(ref, ref)
        while parent != ref:
            grand = self.parent[parent]
            self.parent[ref] = grand  # path halving
            ref, parent = parent, grand
        return ref

    def link(self, refs: Sequence[KeyRef], weight: int = 1) -> None:
        root = self.find(refs[0])
        for ref in refs[1:]:
            other = self.find(ref)
            if other != root:
                self.parent[other] = root
                self.weight[root] = self.weight.get(root, 0) + self.weight.pop(other, 0)
        self.weight[root] = self.weight.get(root, 0) + weight

    def groups(self) -> list[tuple[list[KeyRef], int]]:
        """Each group's keys and weight."""
        members: dict[KeyRef, list[KeyRef]] = {}
        for ref in self.parent:
            members.setdefault(self.find(ref), []).append(ref)
        return [(refs, self.weight.get(root, 0)) for root, refs in members.items()]


class EpochInfo(msgspec.Struct, frozen=True, array_like=True):
    """What the driver keeps of one epoch: where it is, its clock, positions and size."""

    position: int
    epoch: int
    now_ms: int
    seed: int
    code_hash: str
    next_offsets: dict[str, int]
    txns: int

    def header(self) -> EpochRecord:
        """The epoch without its transactions."""
        return EpochRecord(self.epoch, self.now_ms, self.seed, self.code_hash, (),
                           self.next_offsets)  # fmt: skip


@dataclass(frozen=True)
class TaskSetup:
    """What every executor task is given: the app by its spec, the tables it writes parts of
    (under the app name ``tables``), where replay starts, the snapshot boundaries, and where to
    report progress."""

    app_spec: str
    app_name: str
    tables: str
    snapshots: SnapshotConfig
    partitions: int
    import_roots: tuple[str, ...]
    base_epoch: int
    carried: tuple[Emitted, ...]
    boundaries: tuple[int, ...]
    progress: tuple[str, int] | None
    amendments: Amendments = dataclasses.field(default_factory=Amendments)

    def load(self) -> tuple[App, DeltaSnapshots]:
        """On an executor: the app, and the snapshots it writes parts of."""
        if os.environ.get("PYTHONHASHSEED") != "0":
            raise RecoveryError(
                "Spark's Python workers must run with PYTHONHASHSEED=0 (docs/concepts.md): "
                "set it in the executors' environment"
            )
        for root in self.import_roots:  # where the driver imported the app from (local mode)
            if root not in sys.path and os.path.isdir(root):
                sys.path.insert(0, root)
        app = named(load_app(self.app_spec), self.app_name)
        return app, DeltaSnapshots(named(app, self.tables), self.snapshots, self.partitions)


@dataclass(frozen=True)
class TaskResult:
    """A task's snapshot parts (one per boundary, and task 0 the command archive's), the interior
    transactions left at each boundary (one ordered task only), the transactions it replayed."""

    task: int
    parts: list[SnapshotPart]
    carried: dict[int, list[Emitted]]
    transactions: int


# --- reading the log ---------------------------------------------------------------------------


def assemble(rows: Iterable[Any]) -> Iterator[tuple[int, int, bytes]]:
    """A slice of the log (rows with ``offset`` and ``value``, in order): its whole epochs as
    ``(EPOCH, position, record msgpack)``, the chunks of epochs its ends cut as
    ``(CHUNK, offset, chunk)``, to be stitched on the driver."""
    held: list[tuple[int, bytes]] = []
    data: list[bytes] = []
    whole = False
    for row in rows:
        offset, value = int(row.offset), bytes(row.value)
        chunk = decode(value, EpochChunk)
        if chunk.index == 0:
            yield from ((CHUNK, o, v) for o, v in held)  # the end of an epoch begun before
            held, data, whole = [], [], True
        held.append((offset, value))
        data.append(chunk.data)
        if chunk.final:
            if whole:
                yield EPOCH, offset, b"".join(data)
            else:
                yield from ((CHUNK, o, v) for o, v in held)
            held, data, whole = [], [], False
    yield from ((CHUNK, o, v) for o, v in held)


def summarize(link: bool) -> Callable[[Iterable[tuple[int, bytes]]], Iterator[Any]]:
    """Per slice of epochs: an :class:`EpochInfo` of each and their key groups (if ``link``)."""

    def run(logged: Iterable[tuple[int, bytes]]) -> Iterator[Any]:
        infos, groups = [], KeyGroups()
        for position, data in logged:
            record = decode(data, EpochRecord)
            infos.append(EpochInfo(
                position, record.epoch, record.now_ms, record.seed, record.code_hash,
                record.next_offsets, len(record.txns),
            ))  # fmt: skip
            for txn in record.txns if link else ():
                if txn.keys:  # one without keys joins no group: it changes no state
                    groups.link(txn.keys)
        yield infos, groups.groups()

    return run


# --- routing to tasks ---------------------------------------------------------------------------


def route_log(
    setup: TaskSetup, task_of: Any
) -> Callable[[int, Iterable[tuple[int, bytes]]], Iterator[Any]]:
    """Each epoch's transactions to the task of their group (those without keys, which change
    no state but have an outcome, to task 0), as ``(task, (EPOCH, epoch, record msgpack))``;
    every epoch whole to task 0 when ``task_of`` (a broadcast) is None. The slice's epochs are
    archived in the ``commands`` table under the snapshot that closes them, as the cluster's
    worker 0 does (the tasks that replay them report their outcomes); those parts go to task 0
    as ``(0, (ARCHIVE, part))``."""

    def run(index: int, logged: Iterable[tuple[int, bytes]]) -> Iterator[Any]:
        tasks = None if task_of is None else task_of.value
        closing: dict[int, list[EpochRecord]] = {}
        for _, read in logged:
            record = setup.amendments.apply(decode(read, EpochRecord))
            data = read if not record.skipped else encode(record)
            ssid = setup.boundaries[bisect.bisect_left(setup.boundaries, record.epoch)]
            closing.setdefault(ssid, []).append(record)
            if tasks is None:
                yield 0, (EPOCH, record.epoch, data)
                continue
            by_task: dict[int, list[Any]] = {}
            for txn in record.txns:
                by_task.setdefault(tasks[txn.keys[0]] if txn.keys else 0, []).append(txn)
            for task, txns in by_task.items():
                part = msgspec.structs.replace(record, txns=tuple(txns), next_offsets={})
                yield task, (EPOCH, record.epoch, encode(part))
        if closing:
            _, snapshots = setup.load()
            for ssid, records in closing.items():
                archived = snapshots.write(ssid, _ARCHIVER + index, [], commands=records)
                yield 0, (ARCHIVE, archived)

    return run


def _actors_in(file: StateFile) -> Iterator[tuple[ActorKey, bytes]]:
    """``(key, canonical state)`` of every actor in one Parquet file of a state table."""
    filesystem, path = pafs.FileSystem.from_uri(file[1])
    table = pq.read_table(path, columns=["_key", "_state"], filesystem=filesystem)
    yield from zip(table.column("_key").to_pylist(), table.column("_state").to_pylist(),
                   strict=True)  # fmt: skip


def route_state(task_of: Any) -> Callable[[Iterable[StateFile]], Iterator[Any]]:
    """The actors in some state files to the task that replays them (all to task 0 when
    ``task_of`` is None), batched: ``(task, (STATE, actor_type, [(key, state), ...]))``."""

    def run(files: Iterable[StateFile]) -> Iterator[Any]:
        tasks = None if task_of is None else task_of.value
        for file in files:
            batches: dict[int, list[tuple[ActorKey, bytes]]] = {}
            for key, state in _actors_in(file):
                task = 0 if tasks is None else tasks.get(KeyRef(file[0], key))
                if task is not None:
                    batches.setdefault(task, []).append((key, state))
            yield from ((task, (STATE, file[0], batch)) for task, batch in batches.items())

    return run


def copy_state(setup: TaskSetup, ssid: int) -> Callable[[int, Iterable[StateFile]], Iterator[Any]]:
    """Some state files of the starting snapshot, written as a part of its copy at ``ssid``."""

    def run(index: int, files: Iterable[StateFile]) -> Iterator[SnapshotPart]:
        _, snapshots = setup.load()
        changes = [Change(KeyRef(file[0], key), PartitionId(0), None, state)
                   for file in files for key, state in _actors_in(file)]  # fmt: skip
        yield snapshots.write(ssid, index + 1, changes)

    return run


# --- a task's replay ----------------------------------------------------------------------------


def replay_task(setup: TaskSetup) -> Callable[[int, Iterable[Any]], Iterator[TaskResult]]:
    """One task: load its actors, replay its epochs in order, write a part at each boundary,
    with the outcomes of the transactions it replayed (and the rows of the interior ones)."""

    def run(task: int, rows: Iterable[Any]) -> Iterator[TaskResult]:
        actors: dict[str, list[tuple[ActorKey, bytes]]] = {}
        logged: list[tuple[int, bytes]] = []
        result = TaskResult(task, [], {}, 0)
        for _, (kind, *item) in rows:
            if kind == STATE:
                actors.setdefault(item[0], []).extend(item[1])
            elif kind == ARCHIVE:
                result.parts.append(item[0])
            else:
                logged.append((item[0], item[1]))
        if not logged and not actors:
            yield result
            return
        app, snapshots = setup.load()
        engine = Engine(app, 1, track_digest=False, snapshots=True)
        engine.load(actors, setup.base_epoch, list(setup.carried))
        records = _with_boundaries(sorted(logged), setup.boundaries)
        sender = _ProgressSender(setup.progress)

        async def replay() -> int:
            done = 0
            for record in records:
                epoch = await engine.run_epoch(record)
                sender.add(len(record.txns))
                done += len(record.txns)
                if epoch.changes is not None:
                    part = snapshots.write(record.epoch, task + 1, epoch.changes,
                                           reported=engine.take_reported())  # fmt: skip
                    result.parts.append(part)
                    result.carried[record.epoch] = list(engine.carried)
            return done

        try:
            with collecting_less():  # a Python worker Spark may reuse: as it was, after
                replayed = asyncio.run(replay())
            yield dataclasses.replace(result, transactions=replayed)
        finally:
            sender.close()

    return run


def _with_boundaries(logged: list[tuple[int, bytes]], boundaries: Sequence[int]) -> list[Any]:
    """A task's epochs in order, each marked for a snapshot if it is a boundary, plus an empty
    epoch at each boundary the task has no transaction in (it still writes its part there)."""
    wanted = set(boundaries)
    records = []
    for _, data in logged:
        record = decode(data, EpochRecord)
        records.append(msgspec.structs.replace(record, snapshot=record.epoch in wanted))
    missing = wanted - {r.epoch for r in records}
    records += [EpochRecord(epoch, 0, 0, "", (), {}, True) for epoch in missing]
    return sorted(records, key=lambda r: r.epoch)


# --- progress -----------------------------------------------------------------------------------


class _ProgressSender:
    """An executor's side of the progress channel; silent if the driver cannot be reached."""

    def __init__(self, address: tuple[str, int] | None) -> None:
        self._socket: socket.socket | None = None
        self._pending, self._sent_at = 0, time.monotonic()
        if address is not None:
            try:
                self._socket = socket.create_connection(address, timeout=2)
            except OSError:
                self._socket = None

    def add(self, transactions: int) -> None:
        self._pending += transactions
        if time.monotonic() - self._sent_at >= 0.2:
            self._flush()

    def _flush(self) -> None:
        if self._socket is not None and self._pending:
            try:
                self._socket.sendall(f"{self._pending}\n".encode())
            except OSError:
                self._socket = None
        self._pending, self._sent_at = 0, time.monotonic()

    def close(self) -> None:
        self._flush()
        if self._socket is not None:
            self._socket.close()


class ProgressServer(socketserver.ThreadingTCPServer):
    """The driver's side: adds up what executors report and passes it on to ``report``, on its
    own threads, until closed.

    >>> with ProgressServer("127.0.0.1", total, report) as server: ... server.server_address
    """

    daemon_threads = True

    def __init__(self, host: str, total: int, report: Callable[[RecoveryProgress], None]) -> None:
        super().__init__((host, 0), _ProgressHandler)
        self.total, self.report, self.done = total, report, 0
        self._lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server_address[:2]
        return str(host), int(port)

    def add(self, transactions: int) -> None:
        with self._lock:
            self.done += transactions
            self.report(RecoveryProgress("replaying", self.done, self.total))

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        super().__exit__(*exc)


class _ProgressHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, ProgressServer)
        for line in self.rfile:
            server.add(int(line))
