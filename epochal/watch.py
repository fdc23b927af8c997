"""The supervisor's view of the cluster's Kafka group, described in a child process, and of the
broker's absences.

Describing a group goes through librdkafka's admin client, and librdkafka can abort the whole
process after describe requests time out (its issue #4605: ``rd_kafka_enq_once_del_source_return:
Assertion 'eonce->refcnt > 0' failed``), as they do whenever the broker is away. The supervisor
must outlive that, so it never describes the group itself: :class:`GroupWatch` runs the
:class:`~epochal.log.membership.GroupObserver` in a child process (``epochal: watch of <app>``)
that sends each view over a pipe, and starts another when it dies.

A view in state UNREACHABLE says the broker did not answer. :class:`BrokerOutage` turns those
views into two changes per outage, one when the broker goes and one when it is back, so the
supervisor logs two lines and holds its rollbacks in between (see docs/operations.md).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext, SpawnProcess

from epochal.actors.lifecycle import child_logging, die_with_parent, set_title
from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients
from epochal.log.membership import GroupObserver, GroupState, GroupView, members_group

__all__ = ["ASK_AFRESH_AFTER_S", "EXIT_ASK_AFRESH", "BrokerOutage", "GroupWatch", "OutageChange"]

logger = logging.getLogger(__name__)
_POLL_S = 0.05
_RESTART_AFTER_S = 1.0  # a watch that dies at once is not restarted in a tight loop
_STUCK_AFTER_INTERVALS = 10  # a watch silent this many intervals (and 5 s) is stuck
ASK_AFRESH_AFTER_S = 10.0
"""A watch whose broker has not answered for this long exits, and another, with a fresh
client, asks next: see :func:`_watch_main`."""
EXIT_ASK_AFRESH = 3  # the exit code of such a watch


def _watch_main(
    kafka: KafkaConfig,
    app: str,
    interval_s: float,
    sender: Connection,
    parent: int,
    *,
    afresh_after_s: float = ASK_AFRESH_AFTER_S,
) -> None:
    """The watch process: describe the group, send each view, until the supervisor goes.

    A broker that has not answered for ``afresh_after_s`` ends it (:data:`EXIT_ASK_AFRESH`;
    the supervisor starts another at once): a long outage is when librdkafka's admin client
    goes wrong, aborting (#4605, above) or, in one CI run, never reporting the broker back
    while the cluster's other clients reached it. A fresh process starts from a fresh
    client, and exits without running the old one's destructors."""
    die_with_parent(parent)
    set_title(f"epochal: watch of {app}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor stops it
    child_logging()
    observer = GroupObserver(KafkaClients(kafka), members_group(app), interval_s)
    unanswered_since: float | None = None
    while True:
        now = time.monotonic()
        view = observer.view(now)
        if view is not None:
            try:
                sender.send(view)
            except OSError:  # the supervisor closed its end
                return
            if view.state is not GroupState.UNREACHABLE:
                unanswered_since = None
            elif unanswered_since is None:
                unanswered_since = now
            elif now - unanswered_since >= afresh_after_s:
                os._exit(EXIT_ASK_AFRESH)
        time.sleep(_POLL_S)


class GroupWatch:
    """The group's views, described by a child process that is restarted when it dies.

    >>> watch = GroupWatch(multiprocessing.get_context("spawn"), kafka, "bank", interval_s=0.5)
    >>> watch.start(); views = watch.views()  # every tick; never blocks
    """

    def __init__(self, context: SpawnContext, kafka: KafkaConfig, app: str, interval_s: float):
        self.context = context
        self.kafka = kafka
        self.app = app
        self.interval_s = interval_s
        self.process: SpawnProcess | None = None
        self._receiver: Connection | None = None
        self._started = self._heard = 0.0

    def start(self) -> None:
        receiver, sender = self.context.Pipe(duplex=False)
        self.process = self.context.Process(
            target=_watch_main,
            args=(self.kafka, self.app, self.interval_s, sender, os.getpid()),
            name="epochal-watch",
        )
        self.process.start()
        sender.close()  # the child holds the only writing end: its death reads as EOF
        self._receiver = receiver
        self._started = self._heard = time.monotonic()  # a start counts as heard of

    def views(self) -> list[GroupView]:
        """The views sent since the last call. A watch that died is replaced (a second after it
        started, at the soonest), and so is one that sent nothing for ten intervals: each of its
        requests gives a view, at most a second after it was sent."""
        assert self.process is not None and self._receiver is not None, "views before start"
        views: list[GroupView] = []
        try:
            while self._receiver.poll():
                views.append(self._receiver.recv())
        except (EOFError, OSError):
            self.process.join(1.0)
        now = time.monotonic()
        if views:
            self._heard = now
        if self.process.exitcode is not None and now - self._started > _RESTART_AFTER_S:
            code, pid = self.process.exitcode, self.pid
            if code == EXIT_ASK_AFRESH:
                logger.info("group watch pid=%s: no answer for %.0f s; a fresh one asks", pid,
                            ASK_AFRESH_AFTER_S)  # fmt: skip
            else:  # librdkafka can abort on describe requests after time-outs (see above)
                logger.warning("group watch exited code=%s pid=%s; starting another", code, pid)
            self._replace()
        elif now - self._heard > max(_STUCK_AFTER_INTERVALS * self.interval_s, 5.0):
            silent = now - self._heard
            logger.warning("group watch silent %.0f s pid=%s; starting another", silent, self.pid)
            self._replace()
        return views

    def _replace(self) -> None:
        self.stop()
        self.start()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.is_alive():
            self.process.kill()  # it holds nothing: no state, no transaction
        self.process.join()
        if self._receiver is not None:
            self._receiver.close()


@dataclass(frozen=True)
class OutageChange:
    """The broker went away (``reachable`` False) or came back after ``away_s`` seconds."""

    reachable: bool
    away_s: float = 0.0


class BrokerOutage:
    """Whether the broker answers, from the watch's views: one change when it goes, one when
    it is back, however many views say so in between.

    >>> outage = BrokerOutage()
    >>> outage.observe(GroupState.UNREACHABLE, now=10.0)
    OutageChange(reachable=False, away_s=0.0)
    >>> outage.observe(GroupState.UNREACHABLE, now=11.0) is None
    True
    >>> outage.observe(GroupState.STABLE, now=19.5)
    OutageChange(reachable=True, away_s=9.5)
    """

    def __init__(self) -> None:
        self.since: float | None = None  # when the broker was first seen unreachable

    @property
    def away(self) -> bool:
        return self.since is not None

    def observe(self, state: GroupState, now: float) -> OutageChange | None:
        reachable = state is not GroupState.UNREACHABLE
        if not reachable and self.since is None:
            self.since = now
            return OutageChange(reachable=False)
        if reachable and self.since is not None:
            away_s, self.since = now - self.since, None
            return OutageChange(reachable=True, away_s=away_s)
        return None
