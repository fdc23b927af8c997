"""The state one worker owns: canonical bytes per actor, and what each epoch since a floor wrote.

Values are the canonical msgpack of :mod:`epochal.schemas.canonical`: immutable, so nothing a
handler holds can change the store, every participant of a transaction decodes the same bytes,
reads go to other workers without re-encoding, and digests hash them directly.

One versioned store serves both snapshots and consistent reads. For every epoch since the
**floor** that wrote something it keeps an :class:`EpochWrites`: each actor's value before the
epoch's first write to it and after its last. A write costs a few operations on that epoch's
small dicts (a list of versions per actor cost a probe of a dict of every actor changed since
the floor, cold in the cache, and an object per write). A snapshot at epoch e takes the epochs
up to e whole, in O(epochs), and raises the floor to e; the snapshot process merges them into
each changed actor's value at the floor and at e. A read "as of epoch c", c >= floor, finds the
value before the first epoch after c that wrote the actor, else the newest: the query server's
``COMMITTED`` reads (a read is answered at once, on the loop, so the floor never moves under
it). Range scans use a sorted index of each type's keys, rebuilt only after the set of actors
changed.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import msgspec

from epochal.actors.digest import DigestSum, item_hash
from epochal.schemas.commands import ActorKey, KeyRef, PartitionId

__all__ = [
    "Change",
    "ChangeEnds",
    "ChangedSince",
    "EpochWrites",
    "StateStore",
    "TypeChanges",
    "changes_by_type",
]


class EpochWrites(msgspec.Struct, gc=False):
    """What one epoch wrote: each actor's value before the epoch's first write to it (None: no
    actor) and after its last, and its partition.

    Dicts of keys and bytes, which the cycle collector never tracks, in an untracked struct:
    kept for every epoch until the next snapshot, they give it nothing to walk."""

    before: dict[KeyRef, bytes | None]
    after: dict[KeyRef, bytes | None]
    partitions: dict[KeyRef, PartitionId]

    def columns(self) -> ChangeEnds:
        """These writes as columns, copied in C without hashing a key: the three dicts were
        filled in the order of the epoch's first writes, so their keys line up."""
        return ChangeEnds(
            list(self.before),
            list(self.partitions.values()),
            list(self.before.values()),
            list(self.after.values()),
        )


@dataclass(frozen=True, slots=True)
class Change:
    """An actor changed since the floor: its partition, value then and value now."""

    ref: KeyRef
    partition: PartitionId
    before: bytes | None
    after: bytes | None


class ChangeEnds(msgspec.Struct, frozen=True):
    """Actors' values before and after a stretch of epochs, and their partitions, as columns:
    one epoch's writes (what crosses to the snapshot process), or those merged since the floor.
    Columns of untracked items, not a tuple and a list per actor: those were 30,000 objects at
    every snapshot of 10,000 changed actors for the cycle collector to walk."""

    refs: list[KeyRef]
    partitions: list[PartitionId]
    before: list[bytes | None]
    after: list[bytes | None]


class TypeChanges(msgspec.Struct, gc=False):
    """The changed actors of one type, as columns: ``after[i]`` is ``keys[i]``'s value now,
    ``before[i]`` its value at the floor (None: no actor)."""

    keys: list[ActorKey]
    before: list[bytes | None]
    after: list[bytes | None]


def changes_by_type(changes: Sequence[Change]) -> dict[str, TypeChanges]:
    """:meth:`ChangedSince.by_type` of any sequence of changes."""
    if isinstance(changes, ChangedSince):
        return changes.by_type()
    split: dict[str, TypeChanges] = {}
    for change in changes:
        columns = split.get(change.ref.actor_type)
        if columns is None:
            columns = split[change.ref.actor_type] = TypeChanges([], [], [])
        columns.keys.append(change.ref.key)
        columns.before.append(change.before)
        columns.after.append(change.after)
    return split


_KEY = operator.attrgetter("key")
_ACTOR_TYPE = operator.attrgetter("actor_type")


class ChangedSince(Sequence[Change]):
    """The changes a snapshot takes, worked out where they are first read: the epoch loop only
    hands over what the epochs since the floor wrote (no walk over the changed actors, which
    for 100k of them paused the loop for a quarter of a second at every snapshot). The worker
    sends each epoch's writes as :meth:`columns` (copies, no hashing) and the snapshot process
    merges them into each actor's first and last value, on the other core: merged on the
    worker's snapshot thread, 10,000 changed actors took the loop's core for 9 ms a snapshot,
    100,000 for 36 to 92 ms."""

    def __init__(self, epochs: Sequence[EpochWrites]) -> None:
        self._epochs = epochs  # no longer the store's: nothing changes them any more
        self._columns: list[ChangeEnds] | None = None
        self._ends: ChangeEnds | None = None

    @classmethod
    def of_columns(cls, columns: list[ChangeEnds]) -> ChangedSince:
        """The changes again, from the :meth:`columns` another process sent."""
        made = cls([])
        made._columns = columns
        return made

    def columns(self) -> list[ChangeEnds]:
        """What each epoch wrote, oldest first."""
        if self._columns is None:
            self._columns = [writes.columns() for writes in self._epochs]
        return self._columns

    def column_chunks(self, size: int) -> Iterator[list[ChangeEnds]]:
        """:meth:`columns` ``size`` epochs at a time, made as they are taken (unless made
        already): one chunk of copies at a time."""
        if self._columns is not None:
            columns = self._columns
            yield from (columns[start : start + size] for start in range(0, len(columns), size))
            return
        epochs = self._epochs
        for start in range(0, len(epochs), size):
            yield [writes.columns() for writes in epochs[start : start + size]]

    def ends(self) -> ChangeEnds:
        """Each actor's value at the floor and at the snapshot (all a change needs), and its
        partition, in the order the actors were first written: dict merges and copies in C,
        no Python step per actor."""
        if self._ends is None:
            refs, before, after = self._merged
            partition_of: dict[KeyRef, PartitionId] = {}
            for e in self.columns():  # the keys of ``last``, in its order: the values line up
                partition_of.update(zip(e.refs, e.partitions, strict=True))
            self._ends = ChangeEnds(refs, list(partition_of.values()), before, after)
        return self._ends

    @functools.cached_property
    def _merged(self) -> tuple[list[KeyRef], list[bytes | None], list[bytes | None]]:
        """The actors in the order they were first written, their values at the floor and at
        the snapshot. ``last`` keeps each key where it first came (an update does not move it),
        so its keys and values line up; each pass over the writes hashes every key once (10 ms
        for 70,000 writes), so :meth:`by_type`, which needs no partitions, makes three."""
        epochs = self.columns()
        first: dict[KeyRef, bytes | None] = {}
        for e in reversed(epochs):  # the oldest epoch's value wins
            first.update(zip(e.refs, e.before, strict=True))
        last: dict[KeyRef, bytes | None] = {}
        for e in epochs:
            last.update(zip(e.refs, e.after, strict=True))
        refs = list(last)
        return refs, list(map(first.__getitem__, refs)), list(last.values())

    def by_type(self) -> dict[str, TypeChanges]:
        """The actors whose value changed, as columns per actor type (what a snapshot part
        writes and hashes), selected and split in C."""
        every, at_floor, now = self._merged
        changed = list(map(operator.ne, at_floor, now))
        refs = list(itertools.compress(every, changed))
        before = list(itertools.compress(at_floor, changed))
        after = list(itertools.compress(now, changed))
        keys = list(map(_KEY, refs))
        types = list(map(_ACTOR_TYPE, refs))
        names = dict.fromkeys(types)
        if len(names) <= 1:
            return {name: TypeChanges(keys, before, after) for name in names}
        split: dict[str, TypeChanges] = {}
        for name in names:
            mine = list(map(name.__eq__, types))
            split[name] = TypeChanges(
                list(itertools.compress(keys, mine)),
                list(itertools.compress(before, mine)),
                list(itertools.compress(after, mine)),
            )
        return split

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
    actor), and, when ``versioned``, what each epoch since ``floor`` wrote.

    >>> store = StateStore([PartitionId(0), PartitionId(1)])
    >>> store.apply(KeyRef("Account", "a"), PartitionId(1), b"\\x81\\xa7balance\\x05", epoch=3)

    Writes come in epoch order (an epoch's own writes in any order).
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
        self._epochs: dict[int, EpochWrites] = {}  # ascending: the epochs since the floor
        self._last: EpochWrites | None = None  # the newest of them
        self._newest = floor  # its epoch
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
        writes = self._last
        if writes is None or epoch != self._newest:
            writes = self._begin(epoch)
        if ref not in writes.before:
            writes.before[ref] = old
            writes.partitions[ref] = partition
        writes.after[ref] = value

    def _begin(self, epoch: int) -> EpochWrites:
        """The writes of a new epoch (the first since the floor may be the floor's own: a
        migration at a restore)."""
        if epoch < self._newest:
            raise ValueError(f"a write in epoch {epoch} after one in epoch {self._newest}")
        writes = self._last = self._epochs[epoch] = EpochWrites({}, {}, {})
        self._newest = epoch
        return writes

    def load(self, ref: KeyRef, partition: PartitionId, value: bytes) -> None:
        """Put an actor back as a snapshot had it (recovery): no version, it is the floor."""
        if ref not in self.values:
            self.actors[partition] += 1
        self.values[ref] = value
        self._index = None
        if self.digest is not None:
            self.digest.replace(ref, None, value)

    def value_at(self, ref: KeyRef, epoch: int) -> bytes | None:
        """The actor's value at the end of ``epoch`` (which must not be below the floor): its
        value before the first later epoch that wrote it, else the newest. Newest epoch first:
        a read at the last epoch run (the usual cut) looks at none."""
        value = self.values.get(ref)
        for written, writes in reversed(self._epochs.items()):
            if written <= epoch:
                break
            before = writes.before
            if ref in before:
                value = before[ref]
        return value

    def take_changes(self, epoch: int) -> Sequence[Change]:
        """The changes since the floor, for a snapshot at the end of ``epoch``; the floor rises
        to ``epoch``. The writes of the epochs up to it are handed over whole, in O(epochs):
        :class:`ChangedSince` merges them where it is read."""
        taken = [writes for written, writes in self._epochs.items() if written <= epoch]
        self.raise_floor(epoch)
        return ChangedSince(taken)

    def raise_floor(self, epoch: int) -> None:
        """Forget the writes of epochs up to ``epoch``, which no reader needs any more."""
        self._epochs = {e: writes for e, writes in self._epochs.items() if e > epoch}
        if self._last is not None and self._newest <= epoch:
            self._last = None
        self.floor = epoch
        self._index = None  # actors deleted before the floor leave the index

    def keys_from(self, actor_type: str, lo: ActorKey | None) -> tuple[list[ActorKey], int]:
        """The sorted keys of ``actor_type`` that exist now or did since the floor, and the
        index of the first one at or after ``lo`` (None: the first)."""
        if self._index is None:
            index: dict[str, list[ActorKey]] = {}
            written = (ref for writes in self._epochs.values() for ref in writes.before)
            for ref in {*self.values, *written}:
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
