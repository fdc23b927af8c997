"""State digests: a sum, mod 2**256, of one hash per ``(actor type, key, canonical state)``.

Engines, the oracle and replay are compared by digest (docs/concepts.md): equal digests, equal
state.
A sum of item hashes does not depend on order, so each worker keeps its own share up to date
on every write (two hashes per write, instead of hashing all state every epoch), and the digest
of a cluster is the sum of its workers' shares. A replay, which needs only the digest at its end,
hashes each actor once then instead. States are hashed as their canonical bytes
(:mod:`epochal.schemas.canonical`), embedded as they are in the msgpack of the item.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import msgspec

from epochal.schemas.codec import encode
from epochal.schemas.commands import ActorKey, KeyRef

__all__ = ["DigestSum", "hash_sum", "item_hash", "state_digest"]

_MODULUS = 2**256


def item_hash(ref: KeyRef, value: bytes) -> int:
    data = encode((ref.actor_type, ref.key, msgspec.Raw(value)))
    return int.from_bytes(hashlib.blake2b(data, digest_size=32).digest(), "big")


def hash_sum(actor_type: str, keys: Iterable[ActorKey], values: Iterable[bytes | None]) -> int:
    """The sum of :func:`item_hash` over the actors of one type that have a value (None: no
    actor), not reduced: the item's msgpack is the array header, the type's name and the key
    before the value, so a snapshot's changed actors hash without a tuple, a ``Raw`` and an
    encode of the name each."""
    prefix = b"\x93" + encode(actor_type)  # a fixarray of the three
    blake2b, from_bytes, total = hashlib.blake2b, int.from_bytes, 0
    for key, value in zip(keys, values, strict=True):
        if value is not None:
            digest = blake2b(prefix + encode(key) + value, digest_size=32).digest()
            total += from_bytes(digest, "big")
    return total


class DigestSum:
    """A running digest of a changing set of items."""

    def __init__(self, total: int = 0) -> None:
        self.total = total % _MODULUS

    def replace(self, ref: KeyRef, old: bytes | None, new: bytes | None) -> None:
        if old is not None:
            self.total -= item_hash(ref, old)
        if new is not None:
            self.total += item_hash(ref, new)
        self.total %= _MODULUS

    def hex(self) -> str:
        return f"{self.total:064x}"


def state_digest(items: Iterable[tuple[KeyRef, bytes]]) -> str:
    """The digest of a whole state (canonical bytes per actor), from scratch."""
    running = DigestSum()
    for ref, value in items:
        running.replace(ref, None, value)
    return running.hex()
