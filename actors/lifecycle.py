"""What every process of a cluster does first: die with its supervisor, say what it is, and
log the way the others do.

A child that outlives its supervisor keeps executing and committing beside the children of the
next ``epochal run`` (seen in a chaos run: two sequencers logging the same epoch numbers). On
Linux the kernel kills it when the parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``); elsewhere
a watchdog thread notices that the parent is gone. Workers and the sequencer are forked by the
supervisor's fork server, which lives as long as any of them: they watch the supervisor itself
too. Either way a parent that died before the child got that far is caught at once.

Process titles make ``ps`` tell the roles apart: ``epochal: worker 1 of bank (generation 3)``,
and let a new supervisor tell the processes an earlier run of its app left behind (a hung
supervisor and its children) from whatever has their pids now: :func:`kill_earlier`.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import json
import logging
import os
import re
import select
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import setproctitle

from epochal.config import LogFormat

__all__ = [
    "LOG_FORMAT_ENV",
    "JsonLines",
    "child_logging",
    "collect_less",
    "collecting_less",
    "die_with_parent",
    "give_back_heap",
    "is_title_of",
    "kill_earlier",
    "process_title",
    "set_title",
    "steady_heap",
    "system_heap_for_arrow",
]

logger = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1
_WATCH_INTERVAL_S = 0.5


def die_with_parent(parent_pid: int) -> None:
    """Arrange for this process to be killed when ``parent_pid`` (the supervisor) dies.

    The process's own parent is the supervisor, or the fork server the supervisor started
    (which exits when the supervisor does): the kernel's signal, or the watch thread, follows
    that parent; a supervisor already gone is caught here."""
    direct = os.getppid()
    if not (sys.platform.startswith("linux") and _kill_me_with_parent()):
        threading.Thread(
            target=_watch_parent, args=(direct,), name="parent-watch", daemon=True
        ).start()
    if os.getppid() != direct:  # the parent died before the signal was armed
        _die()
    if direct != parent_pid:  # forked by the fork server, which its children keep alive
        if process_title(parent_pid) is None:
            _die()  # the supervisor died meanwhile
        threading.Thread(
            target=_watch_supervisor, args=(parent_pid,), name="supervisor-watch", daemon=True
        ).start()


_FEWER_COLLECTIONS = (50_000, 20, 100)
"""A young collection per 50,000 allocations instead of 700, a full one a tenth as often."""


def collect_less() -> None:
    """Once a worker or sequencer has started (its imports and app loaded): what exists now lives
    as long as the process, so Python's cycle collector stops walking it (``gc.freeze``), and
    it collects far less often (``_FEWER_COLLECTIONS``). The hot path allocates many
    short-lived objects and few cycles (an aborted transaction's exception), so collections
    were spent walking what never dies."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_FEWER_COLLECTIONS)


@contextlib.contextmanager
def collecting_less() -> Iterator[None]:
    """:func:`collect_less` for one block of a process that goes on after it (a replay: its
    collections were a quarter of its time): what exists at the start is not walked, and the
    collector is as it was again at the end."""
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count() > 0
    if not frozen:
        gc.freeze()
    gc.set_threshold(*_FEWER_COLLECTIONS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if not frozen:
            gc.unfreeze()


LOG_FORMAT_ENV = "EPOCHAL_LOG_FORMAT"
"""The log format of a cluster's processes: ``epochal run --log-format`` sets it for its
children (it is also that flag's default)."""
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def child_logging(level: int = logging.INFO) -> None:
    """How every process of a cluster logs, the supervisor included: ``level`` and up on
    stderr, as text (time, level, logger, message) or as JSON lines (:class:`JsonLines`), as
    ``$EPOCHAL_LOG_FORMAT`` says."""
    handler = logging.StreamHandler()
    json_lines = os.environ.get(LOG_FORMAT_ENV, LogFormat.TEXT) == LogFormat.JSON
    handler.setFormatter(JsonLines() if json_lines else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)


class JsonLines(logging.Formatter):
    """One JSON object a record: ``time`` (UTC, ms), ``level``, ``logger``, ``message``,
    ``pid``, ``process`` (its title: ``epochal: worker 0 of bank (generation 2)``), and an
    exception's traceback as ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        entry = {
            "time": when.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
            "process": setproctitle.getproctitle(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def set_title(title: str) -> None:
    """What ``ps`` and ``top`` show for this process."""
    setproctitle.setproctitle(title)


def is_title_of(title: str, app: str) -> bool:
    """True if ``title`` is that of a process of ``app``'s cluster (see :func:`set_title`).

    >>> is_title_of("epochal: worker 1 of bank (generation 3)", "bank")
    True
    >>> is_title_of("epochal: worker 1 of bank2 (generation 3)", "bank")
    False
    """
    roles = r"supervisor|sequencer|watch|worker \d+|snapshots of worker \d+"
    pattern = rf"epochal: ({roles}) of {re.escape(app)}"
    return re.fullmatch(rf"{pattern}( \(generation \d+\))?", title) is not None


def kill_earlier(pids: Iterable[int], app: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL those of ``pids`` whose title says they are processes of ``app``'s cluster (a pid
    reused by another program is left alone), and wait until they are gone; returns them."""
    ours = {os.getpid(), os.getppid()}
    killed = []
    for pid in pids:
        title = process_title(pid)
        if pid not in ours and title is not None and is_title_of(title, app):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.append(pid)
    deadline = time.monotonic() + timeout_s
    while any(process_title(pid) is not None for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed


def process_title(pid: int) -> str | None:
    """What ``ps`` shows for ``pid``, or None once it is gone (a zombie shows nothing)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.split(b"\0")[0].decode(errors="replace").strip() or None


_M_MMAP_THRESHOLD = -3  # mallopt's parameter, glibc's malloc.h
MMAP_THRESHOLD = 256 * 1024


def steady_heap(threshold: int = MMAP_THRESHOLD) -> bool:
    """Have glibc map every buffer of ``threshold`` bytes or more on its own and unmap it when
    freed; False where libc has no ``mallopt`` (musl, macOS).

    By default glibc raises that threshold to the largest mapped buffer freed (up to 32 MB), so
    after a worker's first snapshot messages of a few megabytes the later ones came from its
    heap, fragmented it, and the worker's RSS crept up over a long run. A fixed threshold
    turns the dynamic one off. Set in a worker once its snapshot process has forked: there,
    Arrow and Parquet buffers of a few megabytes come and go all the time, and paying fresh
    pages for each slowed it down."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))


def give_back_heap() -> bool:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim``); False where libc
    has none (musl, macOS).

    A snapshot process builds each part's Arrow and Parquet buffers and has delta-rs commit
    them: tens of megabytes a second that come and go, in chunks under glibc's (dynamic) mmap
    threshold, so they are freed into its heaps, where pages between live chunks stay
    resident. Over a 4M-transfer long run a trim after each commit gave back 30-60 MB in a few
    milliseconds. Called there after each part and each commit."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    return bool(trim(0))


def system_heap_for_arrow() -> None:
    """Have Arrow allocate from the C library's heap (the one :func:`steady_heap` tunes), not
    from the mimalloc its wheels bundle and use by default, which keeps what each thread frees
    for that thread: over a 5M-transfer long run a second worker stayed near 160 MB instead
    of 230, and the snapshot processes' peaks came down by a tenth. Set in a worker before its
    snapshot process forks, so both use it (buffers allocated before stay with their pool)."""
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def _kill_me_with_parent() -> bool:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)``; False if libc does not have it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            return True
        logger.warning("prctl(PR_SET_PDEATHSIG) failed errno=%d", ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        logger.warning("prctl(PR_SET_PDEATHSIG) unavailable: %s", exc)
    return False


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(_WATCH_INTERVAL_S)
    _die()


def _watch_supervisor(pid: int) -> None:
    """Die when process ``pid`` exits (a zombie counts as gone): woken by the kernel through
    a pidfd where there is one, else by looking every half second."""
    try:
        descriptor = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here, or the supervisor is gone already
        while process_title(pid) is not None:
            time.sleep(_WATCH_INTERVAL_S)
        _die()
    select.select([descriptor], [], [])
    _die()


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
