"""The serial oracle: every transaction of the command log, one by one, on one dict.

It is the reference every engine test compares against (docs/concepts.md): same command log, same
state digest, same outcomes. Deliberately naive: no partitions, no exchange, no concurrency.
"""

from __future__ import annotations

from collections.abc import Iterable

from epochal.actors.api import App
from epochal.actors.context import run_transaction
from epochal.actors.digest import state_digest
from epochal.actors.engine import EpochResult
from epochal.actors.outcome import TxnOutcome
from epochal.actors.plan import Emitted, EpochClock, emitted_by, plan_epoch
from epochal.schemas.commands import EpochRecord, KeyRef

__all__ = ["SerialOracle"]


class SerialOracle:
    """``SerialOracle(app).run(records)`` gives the epoch results a correct engine must give."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.state: dict[KeyRef, bytes] = {}  # canonical bytes, as every executor keeps them
        self.carried: list[Emitted] = []

    def run_epoch(self, record: EpochRecord) -> EpochResult:
        clock = EpochClock.of(record)
        outcomes: list[TxnOutcome] = []
        for inv in plan_epoch(self.app, record, self.carried):
            reads = {ref: self.state.get(ref) for ref in inv.keys}
            outcome = run_transaction(self.app, inv, reads, clock)
            for ref, value in outcome.writes.items() if outcome.committed else ():
                if value is None:
                    self.state.pop(ref, None)
                else:
                    self.state[ref] = value
            outcomes.append(outcome)
        self.carried = emitted_by(outcomes)
        return EpochResult(record.epoch, tuple(outcomes), state_digest(self.state.items()))

    def run(self, records: Iterable[EpochRecord]) -> list[EpochResult]:
        return [self.run_epoch(record) for record in records]
