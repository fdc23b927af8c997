"""The broker's absences as the supervisor sees them: one change when it goes, one when it is
back, whatever the views say in between."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time

from epochal.config import KafkaConfig
from epochal.log.membership import GroupState
from epochal.watch import EXIT_ASK_AFRESH, BrokerOutage, OutageChange, _watch_main
from tests.conftest import free_ports

AWAY, STABLE, REBALANCING = GroupState.UNREACHABLE, GroupState.STABLE, GroupState.REBALANCING


def test_one_change_when_the_broker_goes_and_one_when_it_is_back() -> None:
    outage = BrokerOutage()
    views = [(0, STABLE), (1, AWAY), (2, AWAY), (3, AWAY), (4, REBALANCING), (5, STABLE)]
    views += [(6, AWAY), (6.5, STABLE)]
    seen = [(now, outage.observe(state, now)) for now, state in views]
    assert [(now, change) for now, change in seen if change is not None] == [
        (1, OutageChange(reachable=False)),
        (4, OutageChange(reachable=True, away_s=3.0)),
        (6, OutageChange(reachable=False)),
        (6.5, OutageChange(reachable=True, away_s=0.5)),
    ]
    assert not outage.away


def test_the_outage_lasts_from_the_first_view_that_says_so() -> None:
    outage = BrokerOutage()
    outage.observe(AWAY, now=10.0)
    assert outage.away and outage.since == 10.0
    outage.observe(AWAY, now=12.0)
    assert outage.since == 10.0


def test_a_watch_the_broker_leaves_unanswered_makes_way_for_a_fresh_one() -> None:
    """Nothing listens at the bootstrap: the watch says so in its views, then exits with the
    code that has the supervisor start a fresh one (not a crash's), once the broker has been
    silent for the bound since the first view said so, not before."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    nobody = f"127.0.0.1:{free_ports(1)}"
    kafka = KafkaConfig(nobody, {"socket.connection.setup.timeout.ms": "1000"})
    watch = context.Process(
        target=_watch_main, args=(kafka, "unheard", 0.2, sender, os.getpid()),
        kwargs={"afresh_after_s": 2.0},
    )  # fmt: skip
    watch.start()
    sender.close()
    views: list[tuple[float, GroupState]] = []
    deadline = time.monotonic() + 60
    with contextlib.suppress(EOFError):
        while watch.exitcode is None and time.monotonic() < deadline:
            if receiver.poll(0.05):
                views.append((time.monotonic(), receiver.recv().state))
    ended = time.monotonic()
    if watch.exitcode is None:
        watch.kill()
    watch.join()
    assert watch.exitcode == EXIT_ASK_AFRESH
    assert views and {state for _, state in views} == {AWAY}
    assert ended - views[0][0] >= 1.9, "it left before the broker was silent for the bound"
