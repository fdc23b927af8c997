"""The state one worker owns: canonical bytes per actor, and each partition's digest share.

Values are the canonical msgpack of :mod:`epochal.schemas.canonical`: immutable, so nothing a
handler holds can change the store, every participant of a transaction decodes the same bytes,
reads go to other workers without re-encoding, and digests hash them directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from epochal.actors.digest import DigestSum
from epochal.schemas.commands import KeyRef, PartitionId

__all__ = ["StateStore"]


class StateStore:
    """Actors of some partitions: ``values[ref]`` is canonical bytes; absent means no actor.

    >>> store = StateStore([PartitionId(0), PartitionId(1)])
    >>> store.apply(KeyRef("Account", "a"), PartitionId(1), b"\\x81\\xa7balance\\x05")
    """

    def __init__(self, partitions: Iterable[PartitionId], track_digest: bool = True) -> None:
        self.values: dict[KeyRef, bytes] = {}
        self.digests: dict[PartitionId, DigestSum] | None = (
            {p: DigestSum() for p in partitions} if track_digest else None
        )

    def apply(self, ref: KeyRef, partition: PartitionId, value: bytes | None) -> None:
        """Write (or delete, with None) one actor of ``partition``."""
        old = self.values.pop(ref, None) if value is None else self.values.get(ref)
        if value is not None:
            self.values[ref] = value
        if self.digests is not None:
            self.digests[partition].replace(ref, old, value)

    def items(self) -> Iterator[tuple[KeyRef, bytes]]:
        return iter(self.values.items())

    def digest_total(self) -> int | None:
        """The sum of this store's digest shares, or None when digests are not tracked."""
        if self.digests is None:
            return None
        return sum(share.total for share in self.digests.values())
