"""A migration defined apart from the app it is registered with."""

from __future__ import annotations

from typing import Any


def to_ledger(old: dict[str, Any]) -> None:
    return None
