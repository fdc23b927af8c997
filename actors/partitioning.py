"""Key ranges: which partition owns which actor, and how the ranges are learned.

A partition owns one contiguous range of keys of every actor type (range, not hash, so that
ranges can split and range scans stay local). The layout (the partition count and each type's
split points) is data: the cluster records it with its egress positions and with each snapshot,
and keeps it from one start to the next.

A new app starts from each type's declared ``key_sample`` (an optional hint: equal-count
quantiles), else a default: int keys split evenly over [0, 2**20), str keys over the characters
keys most often start with (digits and lower-case letters; a default cannot know that all of an
app's keys share a prefix). Once a snapshot exists, the split points can be *learned* from the
keys it holds (:meth:`KeyRanges.learned`: equal-count quantiles of each type's keys), and the
supervisor moves a cluster whose partitions hold skewed shares of the actors to them
(:func:`rebalance_worth_it`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence

from epochal.actors.api import ActorType, App
from epochal.schemas.commands import ActorKey, KeyRef, PartitionId

__all__ = [
    "SKEW_FACTOR",
    "KeyRanges",
    "quantile_points",
    "rebalance_worth_it",
    "skewed",
    "split_points",
]

_DEFAULT_INT_SPAN = 2**20
_STR_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"  # what keys most often start with
_LEGACY_PRINTABLE = (0x20, 0x7F)  # the str default of layouts recorded without split points

SKEW_FACTOR = 2.0
"""A layout is skewed when its fullest partition holds more than this many times the mean (or,
with so few partitions that this is out of reach, more than half-way from the mean to all)."""

_BETTER = 0.75
"""A learned layout is worth a rebalance when its fullest partition holds at most this fraction
of what the current layout's fullest holds: a layout no better than the one in force is never
applied, so rebalances cannot follow one another."""


def split_points(actor_type: ActorType, partitions: int) -> tuple[ActorKey, ...]:
    """``partitions - 1`` ascending split points (the declared sample's quantiles, else the
    default); partition i owns [point[i-1], point[i])."""
    if partitions <= 1:
        return ()
    sample = actor_type.key_sample
    if sample:
        return tuple(sample[len(sample) * i // partitions] for i in range(1, partitions))
    if actor_type.key_type is int:
        return tuple(_DEFAULT_INT_SPAN * i // partitions for i in range(1, partitions))
    n = len(_STR_ALPHABET)
    return tuple(_STR_ALPHABET[n * i // partitions] for i in range(1, partitions))


def _legacy_points(actor_type: ActorType, partitions: int) -> tuple[ActorKey, ...]:
    """The split points of a layout recorded before layouts carried them (str keys by their
    first character over printable ASCII): that layout must still be finished exactly."""
    if partitions <= 1 or actor_type.key_sample or actor_type.key_type is int:
        return split_points(actor_type, partitions)
    low, high = _LEGACY_PRINTABLE
    return tuple(chr(low + (high - low) * i // partitions) for i in range(1, partitions))


def quantile_points(keys: Iterable[ActorKey], partitions: int) -> tuple[ActorKey, ...]:
    """Split points that give each partition an equal count of ``keys`` (as near as distinct
    keys allow): at most ``partitions - 1``, strictly ascending."""
    ordered = sorted(set(keys))
    if partitions <= 1 or not ordered:
        return ()
    points: list[ActorKey] = []
    for i in range(1, partitions):
        point = ordered[len(ordered) * i // partitions]
        if not points or point > points[-1]:  # type: ignore[operator]
            points.append(point)
    return tuple(points)


def skewed(shares: Sequence[int], factor: float = SKEW_FACTOR) -> bool:
    """Whether the fullest partition holds more than ``factor`` times the mean: of 2
    partitions, one can hold at most twice the mean, so the bar is never above ``(1 + P) / 2``
    times it (of 2 partitions, one holding over 3/4 is skewed)."""
    total = sum(shares)
    bar = min(factor, (1 + len(shares)) / 2)
    return total > 0 and max(shares) > bar * total / len(shares)


_MIN_ACTORS = 10
"""Actors per partition (on average) below which shares say too little to rebalance on: split
points learned from a handful of keys would soon be skewed again."""


def rebalance_worth_it(
    current: Sequence[int], learned: Sequence[int], factor: float = SKEW_FACTOR
) -> bool:
    """Move from a layout whose partitions hold ``current`` actors to one where they would hold
    ``learned``? Only if the current one is skewed, the learned one materially better, and there
    are enough actors to tell."""
    enough = sum(current) >= _MIN_ACTORS * len(current)
    return enough and skewed(current, factor) and max(learned) <= _BETTER * max(current)


class KeyRanges:
    """The range map of one cluster layout: ``partition_of(KeyRef)``.

    >>> ranges = KeyRanges.even(app, partitions=4)
    >>> ranges.partition_of(KeyRef("Account", "acct-0042"))
    """

    def __init__(self, partitions: int, points: Mapping[str, Sequence[ActorKey]]) -> None:
        self.partitions = partitions
        self._points = {name: list(p) for name, p in points.items()}

    @classmethod
    def even(cls, app: App, partitions: int) -> KeyRanges:
        """The layout of a new app: declared samples, else the defaults."""
        return cls(
            partitions,
            {name: split_points(t, partitions) for name, t in app.actor_types.items()},
        )

    @classmethod
    def of(
        cls, app: App, partitions: int, points: Mapping[str, Sequence[ActorKey]] | None
    ) -> KeyRanges:
        """A recorded layout: ``points`` None is one recorded before layouts carried their
        split points; a type it does not name (new since) gets the new app's points."""
        if points is None:
            return cls(
                partitions, {n: _legacy_points(t, partitions) for n, t in app.actor_types.items()}
            )
        even = cls.even(app, partitions).points
        return cls(partitions, {name: points.get(name, even[name]) for name in app.actor_types})

    @classmethod
    def learned(
        cls, app: App, partitions: int, keys: Mapping[str, Sequence[ActorKey]]
    ) -> KeyRanges:
        """Equal-count quantiles of the keys seen, per type (a type with fewer distinct keys
        than partitions keeps the new app's points)."""
        even = cls.even(app, partitions).points
        points: dict[str, Sequence[ActorKey]] = {}
        for name in app.actor_types:
            seen = quantile_points(keys.get(name, ()), partitions)
            points[name] = seen if len(seen) == partitions - 1 else even[name]
        return cls(partitions, points)

    @property
    def points(self) -> Mapping[str, Sequence[ActorKey]]:
        """Each actor type's split points."""
        return self._points

    def recorded(self) -> dict[str, list[ActorKey]]:
        """The split points as a record holds them."""
        return {name: list(p) for name, p in sorted(self._points.items())}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyRanges):
            return NotImplemented
        return self.partitions == other.partitions and self._points == other._points

    def __hash__(self) -> int:
        return hash((self.partitions, tuple(sorted(self._points))))

    def __repr__(self) -> str:
        return f"KeyRanges({self.partitions}, {self.recorded()!r})"

    def partition_of(self, ref: KeyRef) -> PartitionId:
        return PartitionId(bisect.bisect_right(self._points[ref.actor_type], ref.key))

    def partitions_of_keys(self, keys: Sequence[KeyRef]) -> tuple[PartitionId, ...]:
        """The partition of each key, in the keys' order: what every transaction of an epoch
        asks, so in one call (a call and a ``PartitionId`` per key were a tenth of planning).
        One or two keys, most transactions' count, without a comprehension's frame: half the
        time."""
        points, owner = self._points, bisect.bisect_right
        if len(keys) == 2:
            a, b = keys
            return (owner(points[a.actor_type], a.key), owner(points[b.actor_type], b.key))  # type: ignore[return-value]
        if len(keys) == 1:
            return (owner(points[keys[0].actor_type], keys[0].key),)  # type: ignore[return-value]
        return tuple([owner(points[ref.actor_type], ref.key) for ref in keys])  # type: ignore[misc]

    def participants(self, keys: Sequence[KeyRef]) -> tuple[PartitionId, ...]:
        """The partitions a transaction touches, ascending; partition 0 for one without keys."""
        if not keys:
            return (PartitionId(0),)
        return tuple(sorted({self.partition_of(ref) for ref in keys}))

    def shares(self, keys: Mapping[str, Iterable[ActorKey]]) -> list[int]:
        """How many of ``keys`` (per type) each partition would own."""
        counts = [0] * self.partitions
        for name, type_keys in keys.items():
            points = self._points.get(name)
            if points is None:
                continue
            for key in type_keys:
                counts[bisect.bisect_right(points, key)] += 1
        return counts
