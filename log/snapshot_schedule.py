"""When the workers snapshot: the sequencer marks the epochs at whose end they cut.

A snapshot is due every ``interval_ms`` of the epochs' own clock (``now_ms``), or every
``every_epochs`` epochs, whichever comes first (0 turns either off; both 0: no snapshots). The
sequencer decides, and logs the decision in the epoch, so that every worker cuts at the same
epoch boundary without talking to the others (the Chandy-Lamport marker is the epoch itself).
When the input stops after some activity, one empty epoch closes the last snapshot: the latest
changes do not wait for the next record to become durable.

    >>> schedule = SnapshotSchedule(interval_ms=1000)
    >>> schedule.due(now_ms=500), schedule.due(now_ms=1200)
    (False, True)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SnapshotSchedule"]


@dataclass
class SnapshotSchedule:
    interval_ms: int = 1000
    every_epochs: int = 0
    last_ms: int = 0
    epochs_since: int = 0

    @property
    def enabled(self) -> bool:
        return self.interval_ms > 0 or self.every_epochs > 0

    def due(self, now_ms: int) -> bool:
        """Whether the epoch about to be logged at ``now_ms`` ends with a snapshot."""
        if not self.enabled:
            return False
        by_time = self.interval_ms > 0 and now_ms - self.last_ms >= self.interval_ms
        by_count = self.every_epochs > 0 and self.epochs_since + 1 >= self.every_epochs
        return by_time or by_count

    def idle_due(self, now_ms: int) -> bool:
        """Whether to log an empty epoch only to snapshot what changed since the last one."""
        return self.epochs_since > 0 and self.due(now_ms)

    def logged(self, now_ms: int, snapshot: bool) -> None:
        """An epoch was logged (with a snapshot or not)."""
        if snapshot:
            self.last_ms, self.epochs_since = now_ms, 0
        else:
            self.epochs_since += 1
