"""What a worker counts of the transactions it reports: outcomes and aborts by reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from epochal.actors.outcome import TxnOutcome
from epochal.metrics import Metrics

__all__ = ["abort_category", "count_outcomes"]


def abort_category(reason: str) -> str:
    """A label of few values for an abort reason: a broken rule of the contract, or the
    exception's type name (which the app's code chooses, so the set stays small)."""
    for prefix, label in _ABORT_LABELS:
        if reason.startswith(prefix):
            return label
    head = reason.split(":", 1)[0]
    return head if head.isidentifier() else "other"


_ABORT_LABELS = (  # the prefixes of the reasons epochal itself gives
    ("constraint ", "constraint"),
    ("undeclared key", "undeclared_key"),
    ("key function", "key_function"),
    ("key ", "key_type"),
    ("ill-typed", "ill_typed"),
    ("not an actor type", "ill_typed"),
    ("no transaction handles", "ill_typed"),
    ("egress ", "egress"),
    ("event no longer decodes", "event_decode"),
)


def count_outcomes(metrics: Metrics, outcomes: Sequence[TxnOutcome]) -> None:
    """An epoch's transactions by outcome, and its aborts by handler and reason, added to
    ``metrics`` once per series (not once per transaction: this runs on the epoch loop)."""
    aborts: Counter[tuple[str, str]] = Counter()
    for outcome in outcomes:
        if not outcome.committed:
            aborts[outcome.handler, abort_category(outcome.reason)] += 1
    aborted = sum(aborts.values())
    if len(outcomes) > aborted:
        metrics.inc("epochal_transactions_total", len(outcomes) - aborted, outcome="committed")
    if aborted:
        metrics.inc("epochal_transactions_total", aborted, outcome="aborted")
    for (handler, reason), count in aborts.items():
        metrics.inc("epochal_aborts_total", count, handler=handler, reason=reason)
