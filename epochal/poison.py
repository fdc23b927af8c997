"""Poison inputs as the supervisor sees them: what a worker a handler stopped leaves behind.

A worker whose handler crashed (:data:`~epochal.actors.context.CRASHED_AT`) or hung
(:mod:`epochal.actors.watchdog`) writes one :class:`FailedAt` to
``<run-dir>/<app>/failed-worker-<w>.json`` as it dies. The supervisor reads it before the next
generation, which then snapshots the epoch before the failed one (the last good state survives
the loop).
"""

from __future__ import annotations

import enum
from pathlib import Path

import msgspec

from epochal.actors.plan import Invocation

__all__ = ["Cause", "FailedAt", "failed_worker_file"]


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
