"""State digests: one hash over sorted ``(actor type, key, encoded state)``.

Engines, the oracle and replay are compared by digest (DESIGN §2.3): equal digests, equal state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import msgspec

from epochal.schemas.codec import encode
from epochal.schemas.commands import KeyRef

__all__ = ["state_digest"]


def state_digest(items: Iterable[tuple[KeyRef, msgspec.Struct]]) -> str:
    digest = hashlib.sha256()
    for ref, value in sorted(items, key=lambda item: item[0]):
        digest.update(encode((ref.actor_type, ref.key)))
        digest.update(encode(value))
    return digest.hexdigest()
