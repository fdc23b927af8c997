"""Worker 0's ticks: an epoch asked of the sequencer when interior transactions wait and the
input is idle."""

from __future__ import annotations

import time
from typing import Any

from epochal.actors.api import App
from epochal.config import WorkerConfig
from epochal.log.client import KafkaClients
from epochal.schemas.codec import encode
from epochal.schemas.commands import ClientRequest

__all__ = ["InteriorTicker"]


class InteriorTicker:
    """Asks the sequencer for an epoch when interior transactions wait and the input is idle.

    Interior transactions emitted in epoch e run at the start of e+1; the sequencer logs an
    epoch only when something arrives. Worker 0 (every worker derives the same pending set)
    sends one tick per epoch: a request with an empty handler name, which the sequencer turns
    into an epoch without transactions.
    """

    def __init__(self, clients: KafkaClients, app: App, config: WorkerConfig) -> None:
        self.enabled = config.worker == 0
        self.after_s = config.interior_tick_ms / 1000
        self.topic = app.topics.requests
        self.clients = clients
        self._producer: Any = None
        self._last_epoch_at = time.monotonic()
        self._ticked: int | None = None

    def after_poll(self, got_epochs: bool, last_epoch: int, pending: bool) -> None:
        now = time.monotonic()
        if got_epochs:
            self._last_epoch_at = now
        if not (self.enabled and pending) or self._ticked == last_epoch:
            return
        if now - self._last_epoch_at < self.after_s:
            return
        if self._producer is None:
            self._producer = self.clients.producer(**{"enable.idempotence": True})
        self._producer.produce(self.topic, encode(ClientRequest.tick(last_epoch)))
        self._producer.flush(10)
        self._ticked = last_epoch

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
