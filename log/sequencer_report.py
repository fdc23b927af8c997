"""The sequencer's status record (``schemas/status.py``), built on the status thread.

It reads what the sequencer's loop already keeps: its metrics, the last epoch it logged and the
input lag it measured after that epoch (a dict the loop replaces whole, never mutates).
"""

from __future__ import annotations

from epochal.log.sequencer import Sequencer
from epochal.log.status import ProcessIdentity, Rates
from epochal.schemas.status import ProcessState, SequencerStatus

__all__ = ["SequencerReport"]


class SequencerReport:
    """``report()``: the sequencer's record now.

    >>> publisher = StatusPublisher(clients, app.name, SequencerReport(sequencer, run_id))
    """

    def __init__(self, sequencer: Sequencer, run_id: str) -> None:
        self.sequencer = sequencer
        self.run_id = run_id
        self.identity = ProcessIdentity()
        self.rates = Rates()

    def __call__(self, state: ProcessState = ProcessState.RUNNING) -> SequencerStatus:
        sequencer = self.sequencer
        metrics, config = sequencer.metrics, sequencer.config
        epochs = int(metrics.get("epochal_epochs_total"))
        transactions = int(metrics.get("epochal_sequenced_total"))
        rates = self.rates.of(epochs=epochs, transactions=transactions)
        return SequencerStatus(
            **self.identity.fields(self.run_id, config.generation, state),
            epoch=sequencer.last_epoch,
            epochs=epochs,
            transactions=transactions,
            dead_letters=int(metrics.get("epochal_dead_letters_total")),
            epochs_per_s=rates["epochs"],
            transactions_per_s=rates["transactions"],
            input_lag=dict(sequencer.input_lag),
            metrics=f"127.0.0.1:{config.metrics_port}" if config.metrics_port else "",
        )
