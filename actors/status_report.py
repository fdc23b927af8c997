"""A worker's status record (``schemas/status.py``), built off the epoch loop.

The record is built on the status publisher's thread from what the loop already keeps: its
metrics (counters and per-partition actors, single dict reads) and the epoch it expects next.
Nothing here is called by the loop itself.
"""

from __future__ import annotations

from collections.abc import Callable

from epochal.actors.partitioning import KeyRanges
from epochal.config import WorkerConfig
from epochal.log.status import ProcessIdentity, Rates
from epochal.metrics import Metrics
from epochal.schemas.commands import PartitionId
from epochal.schemas.status import KeyRange, PartitionStatus, ProcessState, WorkerStatus

__all__ = ["WorkerReport", "partition_ranges"]


def partition_ranges(ranges: KeyRanges, partition: int) -> tuple[KeyRange, ...]:
    """The key range of every actor type that ``partition`` owns under ``ranges``.

    >>> partition_ranges(KeyRanges(2, {"Account": [512]}), 1)
    (KeyRange(actor_type='Account', low=512, high=None),)
    """
    out = []
    for actor_type, points in sorted(ranges.points.items()):
        low = points[partition - 1] if 0 < partition <= len(points) else None
        high = points[partition] if partition < len(points) else None
        out.append(KeyRange(actor_type, low, high))
    return tuple(out)


class WorkerReport:
    """``report()``: the worker's record now. ``next_epoch()`` is the epoch the loop expects
    next (an int attribute read: safe from another thread).

    >>> report = WorkerReport(config, metrics, ranges, partitions, lambda: progress.epoch)
    """

    def __init__(
        self,
        config: WorkerConfig,
        metrics: Metrics,
        ranges: KeyRanges,
        partitions: tuple[PartitionId, ...],
        next_epoch: Callable[[], int],
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.ranges = ranges
        self.partitions = partitions
        self.next_epoch = next_epoch
        self.identity = ProcessIdentity()
        self.rates = Rates()

    def __call__(self, state: ProcessState = ProcessState.RUNNING) -> WorkerStatus:
        config, metrics = self.config, self.metrics
        committed = int(metrics.get("epochal_transactions_total", outcome="committed"))
        aborted = int(metrics.get("epochal_transactions_total", outcome="aborted"))
        epochs = int(metrics.get("epochal_epochs_total"))
        rates = self.rates.of(epochs=epochs, transactions=committed + aborted)
        port = config.metrics_port + config.worker if config.metrics_port else 0
        return WorkerStatus(
            **self.identity.fields(config.run_id, config.generation, state),
            worker=config.worker,
            partitions=tuple(
                PartitionStatus(
                    p,
                    partition_ranges(self.ranges, p),
                    int(metrics.get("epochal_partition_actors", partition=str(p))),
                )
                for p in self.partitions
            ),
            epoch=self.next_epoch() - 1,
            epochs=epochs,
            committed=committed,
            aborted=aborted,
            epochs_per_s=rates["epochs"],
            transactions_per_s=rates["transactions"],
            query=config.query[config.worker] if config.query else "",
            metrics=f"127.0.0.1:{port}" if port else "",
        )
