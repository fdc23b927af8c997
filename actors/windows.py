"""Sliding windows as actor state (S-Store's "trending over the last 100 votes").

Windows are msgspec Structs, so they live inside an actor's state, are snapshotted with it and
change only inside transactions. Time comes from ``ctx.now()``, so replay slides them the same.

::

    @app.actor(key=str)
    class Trend(msgspec.Struct):
        last_votes: CountWindow[int] = msgspec.field(default_factory=lambda: CountWindow(100))
"""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

__all__ = ["CountWindow", "TimeWindow"]

T = TypeVar("T")


class CountWindow(msgspec.Struct, Generic[T]):
    """The last ``size`` items; it *slides* (``add`` returns True) once every ``slide`` items."""

    size: int
    slide: int = 1
    items: list[T] = msgspec.field(default_factory=list)
    since_slide: int = 0

    def add(self, item: T) -> bool:
        self.items.append(item)
        if len(self.items) > self.size:
            del self.items[: len(self.items) - self.size]
        self.since_slide += 1
        if self.since_slide >= self.slide:
            self.since_slide = 0
            return True
        return False

    @property
    def full(self) -> bool:
        return len(self.items) >= self.size


class TimeWindow(msgspec.Struct, Generic[T]):
    """Items of the last ``size_ms`` milliseconds; it slides on each ``slide_ms`` boundary.

    ``add(now, item)`` keeps items with ``time > now - size_ms`` and returns True when ``now``
    enters a new slide period (``now // slide_ms`` grew), i.e. when the window should fire.
    """

    size_ms: int
    slide_ms: int
    times: list[int] = msgspec.field(default_factory=list)
    items: list[T] = msgspec.field(default_factory=list)
    period: int = -1

    def add(self, now_ms: int, item: T) -> bool:
        self.times.append(now_ms)
        self.items.append(item)
        return self.advance(now_ms)

    def advance(self, now_ms: int) -> bool:
        """Evict what fell out of the window at ``now_ms``; True if a new slide period began."""
        horizon = now_ms - self.size_ms
        drop = 0
        while drop < len(self.times) and self.times[drop] <= horizon:
            drop += 1
        if drop:
            del self.times[:drop], self.items[:drop]
        period = now_ms // self.slide_ms
        slid = period > self.period
        self.period = max(self.period, period)
        return slid
