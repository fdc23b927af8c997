"""Status records: what each process of a running cluster says about itself, every second.

The supervisor, the sequencer and each worker write one to the compacted topic
``<app>.status``, keyed by :attr:`ProcessStatus.key`, so the latest record of every process
survives and ``epochal status`` can read the cluster from any shell or host. A record carries
its own rates (per second over its last interval), so one read is enough to show throughput.
Records are tagged by role (``"role"`` in JSON) and decode as :data:`AnyStatus`.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from epochal.schemas.commands import ActorKey

__all__ = [
    "AnyStatus",
    "KeyRange",
    "PartitionStatus",
    "ProcessState",
    "ProcessStatus",
    "SequencerStatus",
    "SupervisorStatus",
    "WorkerStatus",
]


class ProcessState(StrEnum):
    """RUNNING while a process writes records; STOPPED is its last record after a clean stop.
    A process killed outright writes no last record: its records just stop coming."""

    RUNNING = "running"
    STOPPED = "stopped"


class KeyRange(msgspec.Struct, frozen=True):
    """The keys of one actor type a partition owns: ``[low, high)``, None for unbounded."""

    actor_type: str
    low: ActorKey | None
    high: ActorKey | None


class PartitionStatus(msgspec.Struct, frozen=True):
    """One partition a worker runs, its key ranges and how many actors it holds."""

    partition: int
    ranges: tuple[KeyRange, ...]
    actors: int = 0


class ProcessStatus(msgspec.Struct, frozen=True, kw_only=True, tag_field="role"):
    """What every process says: who and where it is, in which run and generation, when.

    ``time_ms`` is the wall-clock time of the record (readers judge staleness by it), and
    ``started_ms`` when the process started."""

    run_id: str
    generation: int
    pid: int
    host: str
    time_ms: int
    started_ms: int
    state: ProcessState = ProcessState.RUNNING

    @property
    def key(self) -> bytes:
        """The record's key on ``<app>.status``: one per process slot (``worker:1``)."""
        raise NotImplementedError


class SupervisorStatus(ProcessStatus, frozen=True, kw_only=True, tag="supervisor"):
    """The cluster as the supervisor runs it: its shape, rollbacks so far, the child pids and
    its metrics endpoint (``""``: none)."""

    workers: int
    partitions: int
    recovery: str
    rollbacks: int
    sequencer_pid: int | None = None
    worker_pids: tuple[int, ...] = ()
    metrics: str = ""

    @property
    def key(self) -> bytes:
        return b"supervisor"


class SequencerStatus(ProcessStatus, frozen=True, kw_only=True, tag="sequencer"):
    """The last epoch logged (-1: none yet by this process), counters since it started with
    their rates, and the input records not yet sequenced per ``topic:partition``."""

    epoch: int
    epochs: int
    transactions: int
    dead_letters: int
    epochs_per_s: float
    transactions_per_s: float
    input_lag: dict[str, int] = {}
    metrics: str = ""

    @property
    def key(self) -> bytes:
        return b"sequencer"


class WorkerStatus(ProcessStatus, frozen=True, kw_only=True, tag="worker"):
    """One worker: its partitions and key ranges, the last epoch it executed (-1: none yet),
    its counters since it started with their rates, and its query and metrics endpoints."""

    worker: int
    partitions: tuple[PartitionStatus, ...]
    epoch: int
    epochs: int
    committed: int
    aborted: int
    epochs_per_s: float
    transactions_per_s: float
    query: str = ""
    metrics: str = ""

    @property
    def key(self) -> bytes:
        return f"worker:{self.worker}".encode()


AnyStatus = SupervisorStatus | SequencerStatus | WorkerStatus
