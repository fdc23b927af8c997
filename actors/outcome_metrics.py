"""What a worker counts of the transactions it reports: outcomes and aborts by reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from epochal.actors.outcome import TxnOutcome
from epochal.metrics import Metrics

__all__ = ["count_outcomes"]


def count_outcomes(metrics: Metrics, outcomes: Sequence[TxnOutcome]) -> None:
    """An epoch's transactions by outcome, and its aborts by handler and reason, added to
    ``metrics`` once per series (not once per transaction: this runs on the epoch loop)."""
    aborts: Counter[tuple[str, str]] = Counter()
    for outcome in outcomes:
        if not outcome.committed:
            aborts[outcome.handler, outcome.abort_label] += 1
    aborted = sum(aborts.values())
    if len(outcomes) > aborted:
        metrics.inc("epochal_transactions_total", len(outcomes) - aborted, outcome="committed")
    if aborted:
        metrics.inc("epochal_transactions_total", aborted, outcome="aborted")
    for (handler, reason), count in aborts.items():
        metrics.inc("epochal_aborts_total", count, handler=handler, reason=reason)
