"""``epochal status APP``: where an app's cluster stands, read from the cluster itself.

Every process of a running cluster writes a status record each second to ``<app>.status``
(``log/status.py``); this reads the latest of each, counts the dead letters on ``<app>.dlq``
and reads the latest snapshot's manifest row from the warehouse. Nothing here asks the
supervisor's host: it works from any shell that reaches the broker (and the warehouse).

An app is running while its supervisor's latest record is younger than :data:`STALE_S`; a
supervisor that stopped cleanly said so in its last record, and one that was killed (or whose
host went away) just stopped writing: the answer says which, and when it was last seen. A
process of a running cluster whose records stopped coming is *silent*: failed, and about to be
rolled back, or hung.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, TypeVar

import msgspec

if TYPE_CHECKING:
    from epochal.log.status import StatusReader
    from epochal.recovery.snapshots import Warehouse

from epochal.schemas.status import (
    AnyStatus,
    ProcessState,
    ProcessStatus,
    SequencerStatus,
    SupervisorStatus,
    WorkerStatus,
)

__all__ = [
    "STALE_S",
    "AppState",
    "SnapshotSummary",
    "StatusReport",
    "latest_snapshot",
    "read_report",
    "recent_snapshots",
    "summarize",
]

_S = TypeVar("_S", bound=ProcessStatus)

STALE_S = 5.0
"""A process whose latest record is older than this is not reporting (records come each
second; a loaded machine or a broker's hiccup may delay a few)."""


class AppState(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"  # its supervisor's last record says it stopped
    NOT_RUNNING = "not running"  # its supervisor's records stopped coming: killed, host gone
    NEVER_SEEN = "never seen"  # no status record at all on this broker


class SnapshotSummary(msgspec.Struct, frozen=True):
    """The latest complete snapshot: its ssid (the epoch it ends), when it was taken, the bytes
    of the state files it holds and its actors per type."""

    ssid: int
    time_ms: int
    bytes: int
    actors: dict[str, int]


class StatusReport(msgspec.Struct, frozen=True):
    """What ``epochal status`` shows, and its ``--json``.

    ``epoch`` is the latest epoch logged or executed (-1: none) and ``executed_epoch`` the last
    one every worker has executed (the gap is the backlog); ``epochs_per_s`` and
    ``transactions_per_s`` are the sequencer's (logged, sequenced: per second over its last few
    seconds), ``executed_per_s`` the workers' transactions executed per second; ``input_lag``
    the records of each input partition not yet sequenced; ``silent`` names the processes of the
    running cluster whose records stopped coming. Times are epoch milliseconds.
    """

    app: str
    state: AppState
    time_ms: int
    last_seen_ms: int | None
    generation: int | None
    epoch: int
    executed_epoch: int
    epochs_per_s: float
    transactions_per_s: float
    executed_per_s: float
    input_lag: dict[str, int]
    dead_letters: int
    rollbacks: int
    snapshot: SnapshotSummary | None
    supervisor: SupervisorStatus | None
    sequencer: SequencerStatus | None
    workers: list[WorkerStatus]
    silent: list[str]


def summarize(
    app: str,
    latest: Mapping[str, AnyStatus],
    dead_letters: int,
    snapshot: SnapshotSummary | None,
    now_ms: int | None = None,
) -> StatusReport:
    """The report for the latest record of each process slot (``StatusReader.latest``).

    >>> summarize("bank", {}, 0, None).state
    <AppState.NEVER_SEEN: 'never seen'>
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    supervisor = _of(latest.get("supervisor"), SupervisorStatus)
    run = supervisor.run_id if supervisor is not None else None
    sequencer = _of(latest.get("sequencer"), SequencerStatus)
    sequencer = sequencer if sequencer is not None and sequencer.run_id == run else None
    count = supervisor.workers if supervisor is not None else 0
    workers = [
        worker
        for worker in (_of(latest.get(f"worker:{w}"), WorkerStatus) for w in range(count))
        if worker is not None and worker.run_id == run
    ]
    state = _state(supervisor, now_ms)
    running = state is AppState.RUNNING
    epochs = [w.epoch for w in workers] + ([sequencer.epoch] if sequencer else [])
    silent = []
    if running:
        reporting = {w.worker for w in workers if _fresh(w, now_ms)}
        silent = [f"worker {w}" for w in range(count) if w not in reporting]
        if sequencer is None or not _fresh(sequencer, now_ms):
            silent.insert(0, "sequencer")
    return StatusReport(
        app=app,
        state=state,
        time_ms=now_ms,
        last_seen_ms=supervisor.time_ms if supervisor is not None else None,
        generation=supervisor.generation if supervisor is not None else None,
        epoch=max(epochs, default=-1),
        executed_epoch=min((w.epoch for w in workers), default=-1),
        epochs_per_s=sequencer.epochs_per_s if sequencer and running else 0.0,
        transactions_per_s=sequencer.transactions_per_s if sequencer and running else 0.0,
        executed_per_s=sum(w.transactions_per_s for w in workers if _fresh(w, now_ms)),
        input_lag=dict(sequencer.input_lag) if sequencer else {},
        dead_letters=dead_letters,
        rollbacks=supervisor.rollbacks if supervisor is not None else 0,
        snapshot=snapshot,
        supervisor=supervisor,
        sequencer=sequencer,
        workers=sorted(workers, key=lambda w: w.worker),
        silent=silent,
    )


def _of(record: AnyStatus | None, kind: type[_S]) -> _S | None:
    return record if isinstance(record, kind) else None


def _fresh(record: ProcessStatus, now_ms: int) -> bool:
    return record.state is ProcessState.RUNNING and now_ms - record.time_ms <= STALE_S * 1000


def _state(supervisor: SupervisorStatus | None, now_ms: int) -> AppState:
    if supervisor is None:
        return AppState.NEVER_SEEN
    if supervisor.state is ProcessState.STOPPED:
        return AppState.STOPPED
    return AppState.RUNNING if _fresh(supervisor, now_ms) else AppState.NOT_RUNNING


def read_report(reader: StatusReader, warehouse: Warehouse | None) -> StatusReport:
    """Read what is new on the status topic (``reader`` remembers where it was) and the
    latest snapshot (none without a ``warehouse``); the report as of now."""
    reader.read(timeout_s=5.0)
    snapshot = latest_snapshot(warehouse) if warehouse is not None else None
    return summarize(reader.names.app, reader.latest, reader.dead_letters, snapshot)


def latest_snapshot(warehouse: Warehouse) -> SnapshotSummary | None:
    """The latest complete snapshot in ``warehouse``, or None (none yet, or no warehouse)."""
    latest = recent_snapshots(warehouse, 1)
    return latest[-1] if latest else None


def recent_snapshots(warehouse: Warehouse, count: int) -> list[SnapshotSummary]:
    """The last ``count`` complete snapshots in ``warehouse``, oldest first."""
    from epochal.recovery.snapshots import read_manifests, snapshot_bytes

    return [
        SnapshotSummary(m.ssid, m.time_ms, snapshot_bytes(warehouse, m), dict(m.actors))
        for m in read_manifests(warehouse)[-count:]
    ]
