"""What the examples' tests compare between the harness's engine and the serial oracle."""

from __future__ import annotations

from collections.abc import Sequence

from epochal.actors.engine import EpochResult

__all__ = ["summary"]


def summary(results: Sequence[EpochResult]) -> list[tuple[object, ...]]:
    """What must be equal between engine and oracle: digests, outcomes, reasons and egress."""
    return [
        (r.epoch, r.digest, [(o.seq, o.committed, o.reason, o.egress) for o in r.outcomes])
        for r in results
    ]
