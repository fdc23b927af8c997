"""SIGTERM and Ctrl-C held while a process is started, so whatever stops it has its handle.

``epochal demo`` and ``epochal bench`` stop what they started (a broker, a cluster) when a
SIGTERM or Ctrl-C ends them: the signal raises an exception and ``finally`` blocks stop the
children. A signal that lands inside ``subprocess.Popen`` (the child forked, the parent waiting
for its ``exec``) raises before the ``Popen`` object is returned: the child runs on and nothing
has its pid. Held for the few milliseconds of the start, the signal acts as soon as the handle
is stored. A Spark session's start is held whole (``analytics/spark.py``): its JVM outlives a
start interrupted half-way, and nothing here has its handle at all.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["interrupts_held"]

_HELD = (signal.SIGTERM, signal.SIGINT)

_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """A SIGTERM or SIGINT arriving in the block takes effect when it ends, through the handler
    there before it, or the one the block installed (a handler's exception is raised as the
    block ends). A second one of the same kind acts at once: a block that hangs can be ended.

    A Ctrl-C waits for the block: hold only what must not be cut in two. Off the main thread
    (which cannot set signal handlers, and which signals do not interrupt) it holds nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if signum not in arrived:
            arrived.append(signum)
            return
        arrived.remove(signum)  # the second: now, as if nothing were held
        signal.signal(signum, _settable(previous[signal.Signals(signum)]))
        signal.raise_signal(signum)

    previous: dict[signal.Signals, _Handler] = {sig: signal.signal(sig, hold) for sig in _HELD}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is hold:  # else the block installed its own: it stays
                signal.signal(sig, _settable(handler))
        for signum in arrived:  # in the order they came
            signal.raise_signal(signum)


def _settable(handler: _Handler) -> _Handler:
    """A handler ``signal.signal`` gave back, as it can be set again: None (one set outside
    Python) as the default."""
    return signal.SIG_DFL if handler is None else handler
