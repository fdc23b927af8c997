"""Where a benchmark's runs keep their files, and the local broker they share.

A full ``epochal bench all`` writes gigabytes: the broker's log segments, every cluster's
warehouse and log. They all go under one folder per invocation, removed when the invocation ends
well and kept, and named once, when it fails, so its logs can be read. Nested mains (``all``
runs the bank's) share the folder; the outermost one decides.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, ParamSpec

from epochal.config import CacheConfig, LocalBrokerConfig, cache_dir_from_env
from epochal.jvm import JarSet, fetch_jars
from epochal.log.local_broker import LocalBroker

__all__ = ["Broker", "broker_unless", "cleans_up", "scratch_dir"]

P = ParamSpec("P")


class _Scratch:
    """This process's folder of scratch folders, made at the first run that needs one, and how
    many mains are running (only the outermost one removes it)."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self.depth = 0

    def new(self, prefix: str) -> Path:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="epochal-bench-"))
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.root))

    def end(self, ok: bool) -> None:
        self.depth -= 1
        if self.depth > 0 or self.root is None:
            return
        if ok:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            print(f"the runs' files (logs, warehouses) are kept in {self.root}", file=sys.stderr)
        self.root = None


_SCRATCH = _Scratch()


def scratch_dir(prefix: str) -> Path:
    """A new folder for one run, under this invocation's."""
    return _SCRATCH.new(prefix)


def cleans_up(main: Callable[P, int]) -> Callable[P, int]:
    """``main``, whose scratch folders go when it returns 0 and stay, named on stderr, when it
    fails (an exception or another exit code)."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> int:
        _SCRATCH.depth += 1
        code = 1
        try:
            code = main(*args, **kwargs)
            return code
        finally:
            _SCRATCH.end(code == 0)

    return run


class Broker(NamedTuple):
    """The broker a benchmark runs on, and the pid of its JVM when the run started it."""

    bootstrap: str
    pid: int | None


@contextlib.contextmanager
def broker_unless(bootstrap: str | None, port: int) -> Iterator[Broker]:
    """``bootstrap`` if given, else a local broker on ``port`` for as long as the block runs,
    its data in a scratch folder (removed as soon as the block ends well: a full run's later
    benchmarks need not share the disk with it)."""
    if bootstrap is not None:
        yield Broker(bootstrap, None)
        return
    jars = fetch_jars(CacheConfig(cache_dir_from_env()), JarSet.KAFKA_BROKER)
    data = scratch_dir("broker-")
    broker = LocalBroker(LocalBrokerConfig(port=port, data_dir=data, jar_dir=jars))
    try:  # from before the start: a SIGTERM just after it still stops the broker
        broker.start()
        yield Broker(broker.config.bootstrap, broker.status().pid)
    finally:
        broker.stop_if_launched()
    shutil.rmtree(data, ignore_errors=True)  # gigabytes of log that nothing reads once it stops
