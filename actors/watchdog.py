"""A watchdog that names a handler hanging its worker, as a crash is named.

A handler that never returns (``while True: pass`` on one input) blocks its worker's loop and
raises nothing: the cluster only sees a silent worker, rolls back, replays, and hangs at the
same input again, for ever, with nothing naming the handler. So the executor notes the
invocation it runs in :data:`RUNNING` (two attribute stores per transaction, no clock), and a
daemon thread of the worker process looks at it ten times per bound (at most once a second):
one invocation seen running for longer than the bound is hung. The thread logs one line naming
it (:func:`~epochal.actors.context.hang_line`, the format of a crash's line) and hands it to
``on_hang``, which records its epoch for the next generation and ends the process: a thread
cannot portably interrupt a Python loop, nor a handler blocked in C.

The bound must end before the cluster fails a worker whose loop is blocked, or the worker is
killed before it says why: :class:`~epochal.config.FailureConfig` holds that line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from epochal.actors.context import hang_line
from epochal.actors.plan import Invocation

__all__ = ["RUNNING", "Hang", "HangJudge", "HangWatch", "Running"]

logger = logging.getLogger(__name__)


class Running:
    """The handler invocation this process runs now, None between them.

    One per process (a worker is one process): the executor sets it, the watchdog reads it.
    """

    __slots__ = ("invocation",)

    def __init__(self) -> None:
        self.invocation: Invocation | None = None


RUNNING = Running()


@dataclass(frozen=True)
class Hang:
    """An invocation seen running for ``seconds`` (at least: it may have started a look before)."""

    invocation: Invocation
    seconds: float


class HangJudge:
    """Successive looks at what runs, and the one that has run for longer than ``bound_s``.

    >>> judge = HangJudge(bound_s=3.0)
    >>> judge.look(inv, now=0.0), judge.look(inv, now=2.9)
    (None, None)
    >>> judge.look(inv, now=3.5).seconds
    3.5
    """

    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        self._seen: Invocation | None = None
        self._since = 0.0

    def look(self, running: Invocation | None, now: float) -> Hang | None:
        if running is not self._seen:  # another one (each invocation runs once per process)
            self._seen, self._since = running, now
            return None
        if running is None or now - self._since <= self.bound_s:
            return None
        return Hang(running, now - self._since)


class HangWatch:
    """The daemon thread that looks at ``running`` and reports the first hang, once.

    >>> watch = HangWatch(bound_ms=3000, on_hang=lambda hang: os._exit(4))
    >>> watch.start(); ...; watch.stop()
    """

    def __init__(
        self,
        bound_ms: int,
        on_hang: Callable[[Hang], None],
        running: Running = RUNNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.judge = HangJudge(bound_ms / 1000)
        self.interval_s = min(1.0, bound_ms / 1000 / 10)
        self.on_hang = on_hang
        self.running = running
        self.clock = clock
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hang-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _watch(self) -> None:
        while not self._stopping.wait(self.interval_s):
            hang = self.judge.look(self.running.invocation, self.clock())
            if hang is not None:
                logger.error("%s", hang_line(hang.invocation, hang.seconds, self.judge.bound_s))
                self.on_hang(hang)
                return
