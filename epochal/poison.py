"""Poison inputs as the supervisor sees them: what a worker a handler stopped leaves behind, and
the line that names a crash loop.

A worker whose handler crashed (:data:`~epochal.actors.context.CRASHED_AT`) or hung
(:mod:`epochal.actors.watchdog`) writes one :class:`FailedAt` to
``<run-dir>/<app>/failed-worker-<w>.json`` as it dies. The supervisor reads it before the next
generation, which then snapshots the epoch before the failed one (the last good state survives
the loop), and :class:`CrashLoop` counts the rollbacks in a row that one worker failed at the
same transaction, for one WARNING line per rollback that names it and the ways out.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path

import msgspec

from epochal.actors.plan import Invocation

__all__ = ["Cause", "CrashLoop", "FailedAt", "crash_loop_line", "failed_worker_file"]


class Cause(enum.Enum):
    """How a handler stopped its worker."""

    CRASH = "crash"
    HANG = "hang"


class FailedAt(msgspec.Struct, frozen=True):
    """The transaction whose handler stopped ``worker`` of ``generation`` (seq -1, handler
    empty: written by an older version, which recorded the epoch only)."""

    generation: int
    epoch: int
    worker: int = -1
    seq: int = -1
    handler: str = ""
    cause: Cause = Cause.CRASH

    @classmethod
    def of(cls, inv: Invocation, generation: int, worker: int, cause: Cause) -> FailedAt:
        return cls(generation, inv.epoch, worker, inv.seq, inv.handler.name, cause)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(msgspec.json.encode(self))

    @classmethod
    def read(cls, path: Path) -> FailedAt | None:
        """The record at ``path``, which is removed; None if there is none, or it is unreadable."""
        try:
            data = path.read_bytes()
            path.unlink()
            return msgspec.json.decode(data, type=cls)
        except (OSError, msgspec.DecodeError):
            return None


def failed_worker_file(run_dir: Path, app: str, worker: int) -> Path:
    """Where worker ``worker`` says which transaction a handler stopped it at."""
    return run_dir / app / f"failed-worker-{worker}.json"


class CrashLoop:
    """How many rollbacks in a row each worker failed at the same transaction.

    >>> loop = CrashLoop()
    >>> [n for _, n in loop.observe([FailedAt(1, 812, worker=1, seq=4)])]
    [1]
    >>> [n for _, n in loop.observe([FailedAt(2, 812, worker=1, seq=4)])]
    [2]

    A rollback with no record (another failure) ends every streak.
    """

    def __init__(self) -> None:
        self._streaks: dict[int, tuple[FailedAt, int]] = {}

    def observe(self, failed: Sequence[FailedAt]) -> list[tuple[FailedAt, int]]:
        """The records of one rollback, each with its worker's failures in a row there."""
        streaks: dict[int, tuple[FailedAt, int]] = {}
        for record in failed:
            last = self._streaks.get(record.worker)
            same = last is not None and (last[0].epoch, last[0].seq) == (record.epoch, record.seq)
            streaks[record.worker] = (record, last[1] + 1 if same and last else 1)
        self._streaks = streaks
        return [streaks[w] for w in sorted(streaks)]


def crash_loop_line(record: FailedAt, times: int) -> str:
    """One line for a worker that failed ``times`` rollbacks in a row at one transaction."""
    handler = f"handler {record.handler!r}, seq {record.seq}" if record.handler else "seq unknown"
    how = "hung" if record.cause is Cause.HANG else "crashed"
    seq = record.seq if record.seq >= 0 else "SEQ"
    return (
        f"generation {record.generation}: worker {record.worker} failed {times} times in a row "
        f"at epoch {record.epoch} ({handler}; its handler {how}): deploy a fixed version or "
        f"skip it with epochal skip APP --epoch {record.epoch} --seq {seq}"
    )
