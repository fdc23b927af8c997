"""Snapshot records: what each worker reports of a snapshot, and the manifest row that makes it.

A snapshot ``ssid`` is the state of every partition at the end of epoch ``ssid``. Each worker
writes the changes of its partitions as Parquet files and reports them (:class:`SnapshotPart`);
once every worker has, one committer adds them to the Delta tables and appends the
:class:`Manifest` row **last**: no manifest row, no snapshot (docs/recovery.md).
"""

from __future__ import annotations

import msgspec

from epochal.schemas.actor_schemas import ActorSchema
from epochal.schemas.commands import ActorKey

__all__ = ["ChangeFile", "LogFile", "Manifest", "OutboxRow", "Outcomes", "SnapshotPart"]


class ChangeFile(msgspec.Struct, frozen=True, array_like=True):
    """A Parquet file of change rows, written into ``changes/<actor_type>`` but not committed."""

    actor_type: str
    path: str  # relative to the table's root
    size: int
    rows: int


class LogFile(msgspec.Struct, frozen=True, array_like=True):
    """A Parquet file of log rows for the append-only table ``table`` (``commands``: the
    epochs since the last snapshot; ``outbox``: egress a weak-mode snapshot releases), written
    but not committed."""

    table: str
    path: str  # relative to the table's root
    size: int
    rows: int


class OutboxRow(msgspec.Struct, frozen=True, array_like=True):
    """One record held until its snapshot commits (weak mode): an egress record, or a dead
    letter (on ``<app>.dlq``, with its Kafka ``key``); a partition's rows keep their order."""

    epoch: int
    partition: int
    topic: str
    value: bytes
    key: bytes | None = None


class Outcomes(msgspec.Struct, frozen=True, array_like=True):
    """What the transactions a worker reported since the last snapshot did, column by column:
    the transaction at ``(epoch[i], seq[i])`` committed if ``committed[i]``, else aborted for
    ``reason[i]`` ("" when committed). The committer joins them onto the ``commands`` archive.
    """

    epoch: list[int] = []
    seq: list[int] = []
    committed: list[bool] = []
    reason: list[str] = []


class SnapshotPart(msgspec.Struct, frozen=True):
    """One worker's share of snapshot ``ssid``: its change files and what they add to the digest.

    ``digest_delta`` is the change of the state digest its actors make, mod 2**256 (hex).
    Worker 0 also tells where the log stood: the command-log position after the epoch, the
    input positions, the epoch's time, and the interior transactions still to run.
    ``outcomes`` is the msgpack of the :class:`Outcomes` this worker reported since the last
    snapshot (bytes, so that worker 0's event loop does not decode them: its committer does).
    ``partition_actors`` counts the actors of each of its partitions; worker 0's part also
    carries the split points of the layout the snapshot was taken under (``points``).
    """

    ssid: int
    worker: int
    files: tuple[ChangeFile, ...]
    digest_delta: str
    changed: int
    time_ms: int = 0
    command_log_position: int = 0
    input_positions: dict[str, int] = {}
    carried: bytes = b""
    logs: tuple[LogFile, ...] = ()
    outcomes: bytes = b""
    partition_actors: dict[int, int] = {}
    points: dict[str, list[ActorKey]] = {}


class Manifest(msgspec.Struct, frozen=True):
    """One complete snapshot: ``<app>/snapshots`` holds a row per ssid.

    ``state_versions`` / ``change_versions`` give, per actor type, the Delta version of
    ``state/<type>`` and ``changes/<type>`` that holds this snapshot (a Delta version is not an
    ssid: map one to the other here). ``actors`` counts each type's actors, ``digest`` is the
    state digest (:mod:`epochal.actors.digest`), ``carried`` the interior transactions emitted
    in the snapshot's epoch (msgpack), to run first after it. ``log_versions`` gives the Delta
    version of ``commands`` and ``outbox`` that holds this snapshot's rows; ``recovery`` the
    mode (``strong`` or ``weak``) the snapshot was taken in: in weak mode
    ``command_log_position`` is the next epoch's number (there is no command log).
    ``points`` are each type's split points of the layout the snapshot was taken under (empty:
    a snapshot older than layouts that carry them) and ``partition_actors`` the actors each of
    its partitions held (empty when not known): how even the layout was. ``schemas`` are the
    actor schemas of the code that took it (:mod:`epochal.schemas.actor_schemas`; empty: a
    snapshot of an older epochal), which the next start checks its own against.
    """

    ssid: int
    epoch: int
    time_ms: int
    command_log_position: int
    input_positions: dict[str, int]
    state_versions: dict[str, int]
    change_versions: dict[str, int]
    actors: dict[str, int]
    digest: str
    carried: bytes
    partitions: int
    code_hash: str
    log_versions: dict[str, int] = {}
    recovery: str = "strong"
    points: dict[str, list[ActorKey]] = {}
    partition_actors: list[int] = []
    schemas: dict[str, ActorSchema] = {}
