"""Records epochal writes to egress topics (``<app>.out.<name>``)."""

from __future__ import annotations

import msgspec

__all__ = ["EgressRecord"]


class EgressRecord(msgspec.Struct, frozen=True):
    """One output of a transaction, with its timestamp ``(epoch, seq)`` and outcome.

    ``value`` is the msgpack of the record the handler produced; for an aborted transaction that
    reports to an egress topic it is empty and ``reason`` says why.
    """

    epoch: int
    seq: int
    handler: str
    committed: bool
    value: bytes = b""
    reason: str = ""
