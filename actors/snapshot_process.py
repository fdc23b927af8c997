"""Snapshot parts written, and snapshots committed, in a process of their own beside a worker.

Building a part (the Parquet of the changed actors, the ``commands`` archive's rows: an event
rendered as JSON and a canonical transaction per row) is Python work, and on a thread of the
worker it took the GIL from the epoch loop for a third of the worker's time. In a process forked
from the worker before its Kafka clients start threads, the same :class:`Snapshots` does that work
on the other core (the worker pins itself to one CPU only after the fork), and the worker hands
it each cut as msgpack, a few epochs a message (:data:`STAGE_EPOCHS`): a few hundred nanoseconds
a transaction, where building the rows cost several microseconds.

The process serves three lanes, each a socket with a thread at either end: the parts
(:meth:`ForkedSnapshots.write`, from the worker's snapshot-writer thread), the commits
(``ensure_tables``, ``commit``, ``retain``, from worker 0's committer), so a long commit never
holds back the next part, and the reads of a start (``restore``, ``outbox``). Reading a
snapshot back with delta-rs left its runtime, its threads and the pages it touched in the
worker for good: 40 MB of a worker's RSS for an empty warehouse, 64 MB for a snapshot of a
few actors. Here they stay in the process; the worker gets the actors' bytes, in one message
(the process yields the cores only once the start is over: :func:`_yield_cores`).

The process dies with the worker (``PR_SET_PDEATHSIG``), and leaves on its own when the worker
closes the lanes; it ignores SIGINT and SIGTERM, which are for its worker (a Ctrl-C stops the
worker at a savepoint, and the savepoint's part is written here).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import threading
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import msgspec

from epochal.actors.api import App
from epochal.actors.lifecycle import die_with_parent, give_back_heap, set_title
from epochal.actors.snapshots import Reported, Restored, Snapshots, migrations_named
from epochal.actors.store import Change, ChangedSince, ChangeEnds
from epochal.schemas.commands import ActorKey, EpochRecord
from epochal.schemas.snapshots import Manifest, OutboxRow, SnapshotPart

__all__ = ["ForkedSnapshots", "SnapshotProcessError", "snapshots_beside"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


class SnapshotProcessError(RuntimeError):
    """The snapshot process is gone (killed, out of memory), or failed in a way that cannot
    be carried back as the exception it raised."""


class _Stage(msgspec.Struct, tag="stage", frozen=True):
    """The next epochs of the part about to be written: their writes and their msgpack."""

    epochs: list[ChangeEnds]
    archived: list[msgspec.Raw]


class _Write(msgspec.Struct, tag="write", frozen=True):
    """A part to write, its epochs' msgpack staged ahead of it. The changes come as they were
    handed over: a :class:`ChangedSince`'s writes of each epoch, staged too (``staged``:
    merging them, comparing each actor's first and last value, happens there), or, from any
    other sequence, the changes themselves."""

    ssid: int
    worker: int
    staged: bool
    changes: list[Change]
    commands: list[EpochRecord]
    outbox: list[OutboxRow]
    reported: list[Reported]


class _EnsureTables(msgspec.Struct, tag="ensure_tables", frozen=True):
    code_hash: str


class _Commit(msgspec.Struct, tag="commit", frozen=True):
    parts: list[SnapshotPart]
    epoch: int


class _Retain(msgspec.Struct, tag="retain", frozen=True):
    latest: Manifest


class _Restore(msgspec.Struct, tag="restore", frozen=True):
    pass


class _Outbox(msgspec.Struct, tag="outbox", frozen=True):
    manifest: Manifest
    partitions: list[int]
    from_epoch: int


class _Restored(msgspec.Struct, frozen=True):
    """A :class:`Restored` as it crosses (no manifest: no snapshot), the actor types to
    migrate by name."""

    manifest: Manifest | None = None
    actors: dict[str, list[tuple[ActorKey, bytes]]] = {}
    migrated: list[str] = []


_Call = _Stage | _Write | _EnsureTables | _Commit | _Retain | _Restore | _Outbox
STAGE_EPOCHS = 4
"""Epochs of a part sent per message ahead of it: a snapshot interval's writes in one message
were tens of megabytes the worker built and held at once (its RSS peaked with them)."""
_OK, _RAISED = b"\x00", b"\x01"
_ASK, _TELL = b"?", b"!"  # the first byte of a message: whether it wants an answer
NICENESS = 10
"""How much less CPU the process claims than the epoch loops when the cores are busy, where
Linux's idle class (:func:`_yield_cores`) is not to be had."""


def _yield_cores() -> None:
    """Run this process's threads (those it starts later inherit it) only on cores the epoch
    loops, the broker and the sequencer leave idle: a commit (delta-rs merges on a thread per
    core) would otherwise take both cores for its length, and every transaction in flight would
    wait. At niceness 10 it still preempted them: two workers at 18,000 transfers/s had a p99
    of 180-360 ms, against 130-275 ms in the idle class. Under a sustained overload its
    snapshots lag (``epochal_snapshot_lag_epochs``) until its worker waits for it.

    Done once the worker hands over its first part, not before: until then the process only
    serves its worker's start (the snapshot read back, the tables checked), which the worker
    waits for; in the idle class, on cores busy with other work, a start waited with it. Every
    thread already running (delta-rs's, Arrow's, started by those reads) yields too."""
    for tid in _threads():
        with contextlib.suppress(OSError):  # a thread that just ended
            nice = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(nice + NICENESS, 19))
            if hasattr(os, "SCHED_IDLE"):
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))


def _threads() -> list[int]:
    """This process's threads, by id (only the calling one where ``/proc`` cannot tell)."""
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def snapshots_beside(snapshots: Snapshots, title: str, app: App) -> Snapshots:
    """``snapshots`` run by a process of their own, or, where the fork is not safe (the app
    started threads of its own when it was imported: numpy's, say), by the worker's threads,
    as said in one warning."""
    threads = _native_threads()
    if threads:
        logger.warning(
            "snapshots are written by threads of the worker, not by a process of their own: "
            "%d threads that Python did not start run in it (the app's imports started them), "
            "and a fork could copy a lock one of them holds",
            threads,
        )
        return snapshots
    return ForkedSnapshots(snapshots, title, app)


class ForkedSnapshots:
    """``snapshots``, run by a forked process: writes, commits, and the reads of a start.

    Create it before the worker's Kafka clients or Arrow start threads: the fork copies only
    the calling thread, and a lock another thread held at that moment would stay held in the
    child for ever.
    """

    def __init__(self, snapshots: Snapshots, title: str, app: App) -> None:
        if _native_threads():
            raise RuntimeError("fork the snapshot process before a Kafka client or Arrow starts")
        self.app = app
        ends = [socket.socketpair() for _ in range(3)]
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: serve until the worker closes the lanes, then leave
            for mine, _ in ends:
                mine.close()
            lanes = [Connection(theirs.detach()) for _, theirs in ends]
            _serve(snapshots, lanes, parent, title)
        for _, theirs in ends:
            theirs.close()
        self.pid = pid
        self._parts, self._commits, self._reads = (
            _Lane(Connection(mine.detach()), pid) for mine, _ in ends
        )

    def restore(self) -> Restored | None:
        restored = self._reads.call(_Restore(), _Restored)
        if restored.manifest is None:
            return None
        migrations = migrations_named(self.app, restored.migrated)
        return Restored(restored.manifest, restored.actors, migrations)

    def outbox(
        self, manifest: Manifest, partitions: Sequence[int], from_epoch: int
    ) -> list[OutboxRow]:
        return self._reads.call(_Outbox(manifest, list(partitions), from_epoch), list[OutboxRow])

    def ensure_tables(self, code_hash: str) -> None:
        self._commits.call(_EnsureTables(code_hash), None)

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
        listed: list[Change] = []
        if isinstance(changes, ChangedSince):  # each epoch's writes: merged over there
            for chunk in changes.column_chunks(STAGE_EPOCHS):
                self._parts.tell(_Stage(chunk, []))
        else:
            listed = list(changes)
        for start in range(0, len(archived), STAGE_EPOCHS):
            self._parts.tell(_Stage([], list(archived[start : start + STAGE_EPOCHS])))
        staged = isinstance(changes, ChangedSince)
        call = _Write(ssid, worker, staged, listed, list(commands), list(outbox), list(reported))
        return self._parts.call(call, SnapshotPart)

    def commit(self, parts: Sequence[SnapshotPart], epoch: int) -> Manifest:
        return self._commits.call(_Commit(list(parts), epoch), Manifest)

    def retain(self, latest: Manifest) -> None:
        self._commits.call(_Retain(latest), None)

    def close(self) -> None:
        """Close the lanes (the process leaves once it has answered what it was doing) and
        reap it."""
        self._parts.close()
        self._commits.close()
        self._reads.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


class _Lane:
    """One caller's socket to the process: a call is one message each way; what is told (a
    part's staged epochs) goes one way, and is not waited for."""

    def __init__(self, connection: Connection, pid: int) -> None:
        self.connection = connection
        self.pid = pid
        self._lock = threading.Lock()
        self._encoder = msgspec.msgpack.Encoder()

    def call(self, call: _Call, returns: type[T] | None) -> T:
        with self._lock:
            self._send(_ASK, call)
            try:
                answer = self.connection.recv_bytes()
            except (EOFError, OSError) as exc:
                raise self._gone(exc) from exc
        if answer[:1] == _RAISED:
            raise pickle.loads(answer[1:])
        return msgspec.msgpack.decode(answer[1:], type=returns)

    def tell(self, call: _Stage) -> None:
        with self._lock:
            self._send(_TELL, call)

    def _send(self, kind: bytes, call: _Call) -> None:
        message = bytearray(kind)
        self._encoder.encode_into(call, message, 1)
        try:
            self.connection.send_bytes(message)
        except OSError as exc:
            raise self._gone(exc) from exc

    def _gone(self, exc: BaseException) -> SnapshotProcessError:
        return SnapshotProcessError(
            f"the snapshot process (pid {self.pid}) is gone: {exc or 'it closed its end'}"
        )

    def close(self) -> None:
        with self._lock:
            self.connection.close()


def _serve(snapshots: Snapshots, lanes: list[Connection], parent: int, title: str) -> None:
    """The child's life: a thread per lane, each answering its calls in order; leave (without
    running anything the worker would at exit) once every lane is closed."""
    code = 0
    try:
        die_with_parent(parent)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        set_title(title)
        yielded = threading.Event()  # one lane yields the cores for all, once
        threads = [
            threading.Thread(target=_answer, args=(snapshots, lane, yielded), name=f"lane-{i}")
            for i, lane in enumerate(lanes)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except BaseException:
        logger.exception("the snapshot process failed")
        code = 1
    finally:
        logging.shutdown()
        os._exit(code)


class _Staged:
    """What a lane was sent ahead of the part it writes next."""

    def __init__(self) -> None:
        self.epochs: list[ChangeEnds] = []
        self.archived: list[msgspec.Raw] = []
        self.failed: bytes | None = None  # the answer a staging that failed would have had

    def take(self) -> tuple[list[ChangeEnds], list[msgspec.Raw]]:
        taken = self.epochs, self.archived
        self.epochs, self.archived = [], []
        return taken


def _answer(snapshots: Snapshots, lane: Connection, yielded: threading.Event) -> None:
    decoder = msgspec.msgpack.Decoder(_Call)
    encoder = msgspec.msgpack.Encoder()
    staged = _Staged()
    while True:
        try:
            message = lane.recv_bytes()
        except (EOFError, OSError):
            return
        call: _Call | None = None
        try:
            call = decoder.decode(memoryview(message)[1:])
            if isinstance(call, _Stage | _Write) and not yielded.is_set():  # the start is over
                yielded.set()
                _yield_cores()
            if isinstance(call, _Write) and staged.failed is not None:  # what it needs is not in
                staged.take()
                answer, staged.failed = staged.failed, None
            else:
                answer = _OK + encoder.encode(_run(snapshots, call, staged))
        except Exception as exc:  # carried back: the worker raises it where it waits
            exc.add_note("in the snapshot process:\n" + traceback.format_exc().rstrip())
            answer = _RAISED + _pickled(exc)
        if message[:1] == _TELL:  # nobody waits: what failed fails the part it was for
            staged.failed = staged.failed or (None if answer[:1] == _OK else answer)
            continue
        try:
            lane.send_bytes(answer)
        except OSError:
            return
        if isinstance(call, _Write | _Commit | _Restore):  # after answering: the worker waits
            message = answer = b""
            call = None
            give_back_heap()


def _run(snapshots: Snapshots, call: _Call, staged: _Staged) -> Any:
    match call:
        case _Stage():
            staged.epochs += call.epochs
            staged.archived += call.archived
            return None
        case _Write():
            epochs, archived = staged.take()
            changes: Sequence[Change] = call.changes
            if call.staged:
                changes = ChangedSince.of_columns(epochs)
            return snapshots.write(
                call.ssid,
                call.worker,
                changes,
                commands=call.commands,
                outbox=call.outbox,
                reported=call.reported,
                archived=archived,
            )
        case _EnsureTables():
            return snapshots.ensure_tables(call.code_hash)
        case _Commit():
            return snapshots.commit(call.parts, call.epoch)
        case _Retain():
            return snapshots.retain(call.latest)
        case _Restore() | _Outbox():
            return _read(snapshots, call)


def _read(snapshots: Snapshots, call: _Restore | _Outbox) -> _Restored | list[OutboxRow]:
    """A start's reads: the newest complete snapshot, as it crosses to the worker, or the
    outbox rows it asks for."""
    if isinstance(call, _Outbox):
        return snapshots.outbox(call.manifest, call.partitions, call.from_epoch)
    restored = snapshots.restore()
    if restored is None:
        return _Restored()
    return _Restored(restored.manifest, restored.actors, sorted(restored.migrations))


def _native_threads() -> int:
    """Threads of this process that Python did not start (a Kafka client's, Arrow's): their
    locks are what a fork could copy held (Python re-creates its own after a fork, logging's
    included). 0 where ``/proc`` cannot tell."""
    try:
        return len(os.listdir("/proc/self/task")) - threading.active_count()
    except OSError:
        return 0


def _pickled(exc: Exception) -> bytes:
    """``exc`` as the worker will raise it, or, if it does not pickle, what it said."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return data
    except Exception:
        return pickle.dumps(SnapshotProcessError(f"{type(exc).__name__}: {exc}"))
