"""Key ranges: which partition owns which actor.

A partition owns one contiguous range of keys of every actor type (range, not hash, so that
ranges can split and range scans stay local). The split points of a type come from its declared
``key_sample`` (equal-count quantiles); without one, int keys are split evenly over [0, 2**20)
and str keys by their first character over printable ASCII. Declare a sample for balance.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from epochal.actors.api import ActorType, App
from epochal.schemas.commands import ActorKey, KeyRef, PartitionId

__all__ = ["KeyRanges", "split_points"]

_DEFAULT_INT_SPAN = 2**20
_PRINTABLE = (0x20, 0x7F)


def split_points(actor_type: ActorType, partitions: int) -> tuple[ActorKey, ...]:
    """``partitions - 1`` ascending split points; partition i owns [point[i-1], point[i])."""
    if partitions <= 1:
        return ()
    sample = actor_type.key_sample
    if sample:
        return tuple(sample[len(sample) * i // partitions] for i in range(1, partitions))
    if actor_type.key_type is int:
        return tuple(_DEFAULT_INT_SPAN * i // partitions for i in range(1, partitions))
    low, high = _PRINTABLE
    return tuple(chr(low + (high - low) * i // partitions) for i in range(1, partitions))


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
        return cls(
            partitions,
            {name: split_points(t, partitions) for name, t in app.actor_types.items()},
        )

    @property
    def points(self) -> Mapping[str, Sequence[ActorKey]]:
        """Each actor type's split points."""
        return self._points

    def partition_of(self, ref: KeyRef) -> PartitionId:
        return PartitionId(bisect.bisect_right(self._points[ref.actor_type], ref.key))

    def participants(self, keys: Sequence[KeyRef]) -> tuple[PartitionId, ...]:
        """The partitions a transaction touches, ascending; partition 0 for one without keys."""
        if not keys:
            return (PartitionId(0),)
        return tuple(sorted({self.partition_of(ref) for ref in keys}))
