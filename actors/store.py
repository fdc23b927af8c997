"""The state one worker owns: canonical bytes per actor, versioned by epoch since a floor.

Values are the canonical msgpack of :mod:`epochal.schemas.canonical`: immutable, so nothing a
handler holds can change the store, every participant of a transaction decodes the same bytes,
reads go to other workers without re-encoding, and digests hash them directly.

One versioned store serves both snapshots and consistent reads: for every actor
written since the **floor** epoch the store keeps its value at the floor and at the end of each
epoch that wrote it. A snapshot at epoch e takes the actors changed since the last snapshot —
exactly those with versions — with their values at e and at the floor (their digest delta) in
O(changed actors), then raises the floor to e. A read "as of epoch c", c >= floor, finds the last
version at or before c: the query server's ``COMMITTED`` reads (a read is answered at once, on the
loop, so the floor never moves under it). Range scans use a sorted index of each type's keys,
rebuilt only after the set of actors changed.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import msgspec

from epochal.actors.digest import DigestSum, item_hash
from epochal.schemas.commands import ActorKey, KeyRef, PartitionId

__all__ = ["Change", "ChangeEnds", "ChangedSince", "StateStore", "Version"]


class Version(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """An actor's value at the end of ``epoch`` (None: no actor).

    Two are kept per transfer until the next snapshot: as tuples they set off more than a third
    of a worker's cycle collections (which took a tenth of its time, walking young objects); a
    struct without ``gc`` is never tracked."""

    epoch: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Change:
    """An actor changed since the floor: its partition, value then and value now."""

    ref: KeyRef
    partition: PartitionId
    before: bytes | None
    after: bytes | None

    def digest_delta(self) -> int:
        """What this change adds to the state digest (mod 2**256 when summed)."""
        delta = 0
        if self.before is not None:
            delta -= item_hash(self.ref, self.before)
        if self.after is not None:
            delta += item_hash(self.ref, self.after)
        return delta


class ChangeEnds(msgspec.Struct, frozen=True):
    """Each changed actor's value at the floor and now, as columns: what crosses to the snapshot
    process. Columns of untracked items, not a tuple and a list per actor: those were 30,000
    objects at every snapshot of 10,000 changed actors for the cycle collector to walk."""

    refs: list[KeyRef]
    partitions: list[PartitionId]
    before: list[bytes | None]
    after: list[bytes | None]


class ChangedSince(Sequence[Change]):
    """The changes a snapshot takes, worked out where they are first read: the epoch loop only
    hands over the versions it kept since the floor (no walk over the changed actors, which for
    100k of them paused the loop for a quarter of a second at every snapshot), and the snapshot
    writer's thread compares each actor's first and last version."""

    def __init__(
        self, versions: dict[KeyRef, list[Version]], partition_of: dict[KeyRef, PartitionId]
    ) -> None:
        self._versions = versions  # no longer the store's: nothing changes them any more
        self._partition_of = partition_of
        self._ends: ChangeEnds | None = None

    @classmethod
    def of_ends(cls, ends: ChangeEnds) -> ChangedSince:
        """The changes again, from the :meth:`ends` another process sent."""
        made = cls({}, {})
        made._ends = ends
        return made

    def ends(self) -> ChangeEnds:
        """Each actor's first and last version (all a change needs: the ones between, one per
        epoch that wrote the actor, were most of what crossed) and partition. Called off the
        epoch loop: it walks the changed actors."""
        if self._ends is None:
            versions, partition_of = self._versions, self._partition_of
            self._ends = ChangeEnds(
                list(versions),
                [partition_of[ref] for ref in versions],
                [kept[0].value for kept in versions.values()],
                [kept[-1].value for kept in versions.values()],
            )
        return self._ends

    @functools.cached_property
    def _changes(self) -> list[Change]:
        ends = self.ends()
        return [
            Change(ref, partition, before, after)
            for ref, partition, before, after in zip(
                ends.refs, ends.partitions, ends.before, ends.after, strict=True
            )
            if before != after
        ]

    @overload
    def __getitem__(self, index: int) -> Change: ...

    @overload
    def __getitem__(self, index: slice) -> list[Change]: ...

    def __getitem__(self, index: int | slice) -> Change | list[Change]:
        return self._changes[index]

    def __len__(self) -> int:
        return len(self._changes)


class StateStore:
    """Actors of some partitions: ``values[ref]`` is the newest canonical bytes (absent: no
    actor), and the versions since ``floor`` for the actors written after it.

    >>> store = StateStore([PartitionId(0), PartitionId(1)])
    >>> store.apply(KeyRef("Account", "a"), PartitionId(1), b"\\x81\\xa7balance\\x05", epoch=3)
    """

    def __init__(
        self,
        partitions: Iterable[PartitionId],
        track_digest: bool = True,
        versioned: bool = False,
        floor: int = -1,
    ) -> None:
        partitions = tuple(partitions)
        self.values: dict[KeyRef, bytes] = {}
        self.versioned = versioned  # without snapshots nor readers, no version is ever needed
        self.floor = floor
        self._versions: dict[KeyRef, list[Version]] = {}
        self._partition_of: dict[KeyRef, PartitionId] = {}
        self._newest = floor  # the last epoch a version was kept for
        self.digest: DigestSum | None = DigestSum() if track_digest else None
        self._index: dict[str, list[ActorKey]] | None = None  # sorted keys, per type
        self.actors: dict[PartitionId, int] = dict.fromkeys(partitions, 0)  # actors per partition

    def apply(self, ref: KeyRef, partition: PartitionId, value: bytes | None, epoch: int) -> None:
        """Write (or delete, with None) one actor of ``partition`` in ``epoch``."""
        old = self.values.pop(ref, None) if value is None else self.values.get(ref)
        if value is not None:
            self.values[ref] = value
        if (old is None) != (value is None):
            self._index = None  # an actor came or went
            self.actors[partition] += 1 if old is None else -1
        if self.digest is not None:
            self.digest.replace(ref, old, value)
        if not self.versioned:
            return
        self._newest = epoch
        versions = self._versions.get(ref)
        if versions is None:
            self._versions[ref] = [Version(self.floor, old), Version(epoch, value)]
            self._partition_of[ref] = partition
        elif versions[-1].epoch == epoch:
            versions[-1] = Version(epoch, value)
        else:
            versions.append(Version(epoch, value))

    def load(self, ref: KeyRef, partition: PartitionId, value: bytes) -> None:
        """Put an actor back as a snapshot had it (recovery): no version, it is the floor."""
        if ref not in self.values:
            self.actors[partition] += 1
        self.values[ref] = value
        self._index = None
        if self.digest is not None:
            self.digest.replace(ref, None, value)

    def value_at(self, ref: KeyRef, epoch: int) -> bytes | None:
        """The actor's value at the end of ``epoch`` (which must not be below the floor)."""
        versions = self._versions.get(ref)
        if versions is None:
            return self.values.get(ref)
        value = versions[0].value
        for version in versions:
            if version.epoch > epoch:
                break
            value = version.value
        return value

    def take_changes(self, epoch: int) -> Sequence[Change]:
        """The changes since the floor, for a snapshot at the end of ``epoch``; the floor rises
        to ``epoch``. At the end of the last epoch written (a snapshot's case) this hands the
        versions over whole, in O(1): :class:`ChangedSince` walks them where it is read."""
        if self._newest > epoch:  # versions after it stay: walk them here
            changes = list(self.changes())
            self.raise_floor(epoch)
            return changes
        taken = ChangedSince(self._versions, self._partition_of)
        self._versions, self._partition_of = {}, {}
        self.floor = epoch
        self._index = None  # actors deleted before the floor leave the index
        return taken

    def changes(self) -> Iterator[Change]:
        """Every actor changed since the floor, its value at the floor and now (the versions
        are kept: call :meth:`raise_floor` once they are no longer needed)."""
        for ref, versions in self._versions.items():
            before, after = versions[0].value, versions[-1].value
            if before != after:
                yield Change(ref, self._partition_of[ref], before, after)

    def raise_floor(self, epoch: int) -> None:
        """Forget versions before ``epoch`` that no reader needs any more (O(changed actors))."""
        for ref in list(self._versions):
            versions = self._versions[ref]
            if versions[-1].epoch <= epoch:
                del self._versions[ref], self._partition_of[ref]
            else:
                keep = [v for v in versions if v.epoch > epoch]
                self._versions[ref] = [Version(epoch, self.value_at(ref, epoch)), *keep]
        self.floor = epoch
        self._index = None  # actors deleted before the floor leave the index

    def keys_from(self, actor_type: str, lo: ActorKey | None) -> tuple[list[ActorKey], int]:
        """The sorted keys of ``actor_type`` that exist now or did since the floor, and the
        index of the first one at or after ``lo`` (None: the first)."""
        if self._index is None:
            index: dict[str, list[ActorKey]] = {}
            for ref in {*self.values, *self._versions}:
                index.setdefault(ref.actor_type, []).append(ref.key)
            for keys in index.values():
                keys.sort()
            self._index = index
        keys = self._index.get(actor_type, [])
        return keys, 0 if lo is None else bisect.bisect_left(keys, lo)

    def items(self) -> Iterator[tuple[KeyRef, bytes]]:
        return iter(self.values.items())

    def digest_total(self) -> int | None:
        """This store's share of the digest, or None when it is not tracked."""
        return None if self.digest is None else self.digest.total

    def track_digest(self) -> None:
        """Keep the digest from now on, from one hash per actor held: where only the digest at
        the end counts (a replay), that is cheaper than two hashes per write all along."""
        if self.digest is None:
            self.digest = DigestSum(sum(item_hash(ref, value) for ref, value in self.items()))
