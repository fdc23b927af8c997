"""Where a worker stands: its start's phases, its position in the command log, and its catching
up after a (re)start."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from epochal.actors.query_server import QueryServer
from epochal.metrics import Metrics
from epochal.schemas.snapshots import Manifest

__all__ = ["CatchUp", "Progress", "StartPhases"]

logger = logging.getLogger(__name__)


class StartPhases:
    """Seconds of each step of a worker's start, for its ``worker started`` line: where a
    rollback's time goes. ``fence``: the egress writers opened, which fences the last
    generation's; ``positions``: where each resumes read; ``amendments``: the operator's
    amendments read (strong mode); ``snapshot``: the latest loaded; ``peers``: the other
    workers connected, the command log or epoch feed opened. The fence, the amendments and (in
    strong mode) the snapshot's read begin as the worker process starts: each counts what it
    took beyond the steps before it."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self._seconds: dict[str, float] = {}

    def done(self, phase: str) -> None:
        now = time.perf_counter()
        self._seconds[phase], self._last = now - self._last, now

    def __str__(self) -> str:
        return ",".join(f"{phase}:{s:.2f}" for phase, s in self._seconds.items())


@dataclass
class Progress:
    """Where this worker stands in the command log."""

    next: int  # the command-log position after the last epoch executed
    epoch: int  # the epoch that must come next
    final: int | None = None  # the final epoch of a clean stop, once executed

    @classmethod
    def after(cls, resumed: Manifest | None) -> Progress:
        if resumed is None:
            return cls(0, 0)
        return cls(resumed.command_log_position, resumed.epoch + 1)


class CatchUp:
    """A (re)started worker until it has replayed the command log as far as it reached at the
    start (or the log goes idle): how much is left, and how long catching up took."""

    def __init__(
        self, metrics: Metrics, worker: int, start: int, head: int, *, started: float,
        resumed: Manifest | None, queries: QueryServer | None = None,
    ) -> None:  # fmt: skip
        self.metrics = metrics
        self.queries = queries  # answers once caught up
        self.worker = worker
        self.start = start
        self.head = head  # the log's end at the start: a transaction marker follows the last epoch
        self.started = started
        self.ssid = resumed.ssid if resumed else -1
        self.done = False
        self._logged = started
        self.metrics.set("epochal_recovery_remaining_records", max(0, head - 1 - start))

    def after_poll(self, next_position: int, got_epochs: bool) -> None:
        if self.done:
            return
        self.metrics.set("epochal_recovery_replayed_records", next_position - self.start)
        self.metrics.set(
            "epochal_recovery_remaining_records", max(0, self.head - 1 - next_position)
        )
        if got_epochs and next_position < self.head - 1:
            now = time.perf_counter()
            if now - self._logged >= 2.0:  # a long replay says how far it is
                self._logged = now
                logger.info("recovering worker=%d replayed_records=%d of=%d", self.worker,
                            next_position - self.start, self.head - 1 - self.start)  # fmt: skip
            return
        self.done = True
        if self.queries is not None:
            self.queries.ready = True
        seconds = time.perf_counter() - self.started
        self.metrics.set("epochal_recovery_seconds", seconds)
        self.metrics.set("epochal_recovery_remaining_records", 0)
        logger.info("recovered worker=%d from_ssid=%d from_position=%d replayed_records=%d "
                    "seconds=%.3f", self.worker, self.ssid, self.start,
                    next_position - self.start, seconds)  # fmt: skip
