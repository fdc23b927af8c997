"""A worker's egress released off its epoch loop, one Kafka transaction at a time.

A commit of the egress writers waits on the broker (tens of milliseconds under load, sometimes
over a hundred). The loop that awaited each one spent a third of a steady run waiting, and every
transfer that arrived meanwhile waited with it. Here the loop asks for a release and goes on
executing epochs; the commit runs on a thread, and the records staged meanwhile go out in the
next one, which starts as soon as the one in flight ends. Each commit is still one transaction
per writer with the position it covers, so a crash anywhere replays from the last position
committed and repeats nothing.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping

from epochal.log.egress import EgressWriter, Staged
from epochal.metrics import Metrics
from epochal.schemas.commands import PartitionId

__all__ = ["EgressRelease"]

Batches = dict[PartitionId, list[Staged]]


async def _commit(
    writers: Mapping[PartitionId, EgressWriter], batches: Batches, position: int
) -> None:
    """Every writer's transaction at once, each on a thread (each is its own producer: one at
    a time, the broker's round trips added up); raises the first failure once all ended."""
    loop = asyncio.get_running_loop()
    commits = [
        loop.run_in_executor(None, writer.commit_batch, batches[partition], position)
        for partition, writer in writers.items()
    ]
    if commits:
        await asyncio.wait(commits)
    for commit in commits:
        commit.result()


class EgressRelease:
    """Commits what the writers staged up to a command-log position, in the background.

    >>> release.up_to(progress.next)          # the loop goes on at once
    >>> await release.through(progress.next)  # at a stop: everything staged is out

    ``released`` is the position every writer has committed up to; ``on_released`` listeners
    hear each new one (a snapshot part waits for its epochs' egress before it is handed on).
    """

    def __init__(
        self, writers: Mapping[PartitionId, EgressWriter], metrics: Metrics | None = None
    ) -> None:
        self.writers = writers
        self.metrics = metrics  # commits and their seconds: the broker's share of the latency
        self.committed_at = time.monotonic()  # when the last commit ended (or the start)
        self.on_released: list[Callable[[int], None]] = []
        self._asked = 0
        self._flight: asyncio.Future[None] | None = None
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []  # in the order asked
        self._error: BaseException | None = None

    @property
    def released(self) -> int:
        """The command-log position every writer has committed its egress up to."""
        return min((w.covered for w in self.writers.values()), default=0)

    def up_to(self, position: int) -> None:
        """Release everything staged, recording ``position`` as released: now, or as soon as
        the commit in flight ends."""
        self.check()
        self._asked = max(self._asked, position)
        if self._flight is None:
            self._start()

    async def through(self, position: int) -> None:
        """Release up to ``position`` and wait until it is out (raises what a commit raised)."""
        self.up_to(position)
        if self.released >= position:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((position, waiter))
        await waiter

    async def settle(self) -> None:
        """Wait for the commit in flight, whatever it ends in (before the writers close)."""
        if self._flight is not None:
            await asyncio.wait([self._flight])

    def check(self) -> None:
        """Raise what a commit raised: the worker fails as if it had awaited it."""
        if self._error is not None:
            raise self._error

    def _start(self) -> None:
        position = self._asked
        batches = {p: w.take() for p, w in self.writers.items()}
        if position <= self.released and not any(batches.values()):
            self.committed_at = time.monotonic()  # nothing new: nothing to commit
            return
        self._flight = asyncio.ensure_future(_commit(self.writers, batches, position))
        self._flight.add_done_callback(functools.partial(self._ended, position, time.monotonic()))

    def _ended(self, position: int, began: float, flight: asyncio.Future[None]) -> None:
        self._flight = None
        self.committed_at = time.monotonic()
        if self.metrics is not None:
            self.metrics.inc("epochal_egress_commits_total")
            self.metrics.inc("epochal_egress_commit_seconds_sum", self.committed_at - began)
        error = flight.exception() if not flight.cancelled() else asyncio.CancelledError()
        if error is not None:
            self._error = error
            for _, waiter in self._waiting:
                if not waiter.done():
                    waiter.set_exception(error)
            self._waiting.clear()
            return
        ready = [w for at, w in self._waiting if at <= position]
        self._waiting = [(at, w) for at, w in self._waiting if at > position]
        for waiter in ready:
            if not waiter.done():
                waiter.set_result(None)
        if self._asked > position:
            self._start()  # before the listeners: none of them can hold up what comes next
        for listener in self.on_released:
            listener(position)
