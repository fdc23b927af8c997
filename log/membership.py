"""Liveness as Kafka group membership: every process of a cluster is a member of ``<app>.members``.

Why a consumer group: its coordinator already detects lost members - ``session.timeout.ms``
catches a crashed, stopped or unreachable process (librdkafka heart-beats from its own thread),
``max.poll.interval.ms`` catches a process whose loop stopped calling ``poll`` - and it works the
same whether the processes share a host or not, so whoever watches the group need not be their
parent. Both are set to the failure bound. Members subscribe to the command log only to have
something to join with: they pause whatever they are assigned and never consume or commit.

Members are dynamic and named by ``client.id`` (:class:`MemberName`: run, role, index,
generation). Static membership (``group.instance.id``) was tried: a replacement would take over
a killed member's place at once instead of after its session expires, but the coordinator keeps
the replaced member's ``client.id``, so the watcher could no longer tell generations apart.

:class:`MemberWatch` is the watcher's rule, pure: once a member of the expected set has been
seen, its absence from a settled group (Stable, or Empty) is a failure - a rebalance in progress
is not judged - and a member not seen within the start-up bound has failed too.
:class:`GroupObserver` describes the group without blocking; :class:`GroupMember` is one
process's membership, polled from the loop whose liveness it stands for (:func:`while_member`
for an asyncio loop, :class:`PollingThread` for a blocking loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    ConsumerGroupState,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from epochal.config import WorkerConfig
from epochal.errors import BrokerUnavailableError, ConfigError, EpochalError
from epochal.log.client import KafkaClients, translate_kafka_error

__all__ = [
    "GroupMember",
    "GroupObserver",
    "GroupState",
    "GroupView",
    "LoopPulse",
    "Lost",
    "MemberName",
    "MemberWatch",
    "PollingThread",
    "Role",
    "members_group",
    "while_member",
    "worker_member",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")
POLL_INTERVAL_S = 0.1


def members_group(app: str) -> str:
    """The consumer group every process of ``app``'s cluster joins."""
    return f"{app}.members"


class Role(StrEnum):
    SEQUENCER = "sequencer"
    WORKER = "worker"


@dataclass(frozen=True, order=True)
class MemberName:
    """Who a member is: ``run`` tells apart two ``epochal run`` of one app (generations start
    at 1 in each), ``generation`` tells apart the processes of one role across rollbacks.

    >>> MemberName("r1a2b3", Role.WORKER, 1, 3).client_id
    'epochal.r1a2b3.worker.1.g3'
    """

    run: str
    role: Role
    index: int
    generation: int

    @property
    def client_id(self) -> str:
        return f"epochal.{self.run}.{self.role}.{self.index}.g{self.generation}"

    @classmethod
    def parse(cls, client_id: str) -> MemberName | None:
        """The name behind a ``client.id``, or None for a client that is not one of ours."""
        parts = client_id.split(".")
        if len(parts) != 5 or parts[0] != "epochal" or not parts[4].startswith("g"):
            return None
        try:
            return cls(parts[1], Role(parts[2]), int(parts[3]), int(parts[4][1:]))
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"{self.role} {self.index} (generation {self.generation})"


class GroupState(Enum):
    """What a described group says about absences: settled states list every live member."""

    STABLE = "stable"
    EMPTY = "empty"
    REBALANCING = "rebalancing"
    UNKNOWN = "unknown"  # dead (never joined, or deleted) or not known
    UNREACHABLE = "unreachable"  # the broker did not answer: nothing can be said of members

    @property
    def settled(self) -> bool:
        return self in (GroupState.STABLE, GroupState.EMPTY)


@dataclass(frozen=True)
class GroupView:
    """One description of the group: its state and its members' ``client.id``."""

    state: GroupState
    members: frozenset[str]


@dataclass(frozen=True)
class Lost:
    """A member judged failed, and why."""

    name: MemberName
    reason: str


@dataclass
class _Expected:
    name: MemberName
    since: float
    seen: bool = False


class MemberWatch:
    """Which expected members have failed, from successive views of the group.

    >>> watch = MemberWatch(startup_timeout_s=30)
    >>> watch.expect(MemberName("r", Role.WORKER, 0, 1), now=0.0)
    >>> watch.judge(GroupView(GroupState.STABLE, frozenset()), now=31.0)[0].reason
    'never joined the group within 30.0 s'
    """

    def __init__(self, startup_timeout_s: float) -> None:
        self.startup_timeout_s = startup_timeout_s
        self._expected: dict[tuple[Role, int], _Expected] = {}

    def expect(self, name: MemberName, now: float) -> None:
        """``name`` was started at ``now``; it replaces the previous member of its role."""
        self._expected[name.role, name.index] = _Expected(name, now)

    def retain(self, role: Role, count: int) -> None:
        """Forget members of ``role`` with an index from ``count`` on (a smaller cluster)."""
        for key in [k for k in self._expected if k[0] == role and k[1] >= count]:
            del self._expected[key]

    def all_seen(self) -> bool:
        """Every expected member has joined the group (a start or a rollback is done)."""
        return bool(self._expected) and all(e.seen for e in self._expected.values())

    def judge(self, view: GroupView, now: float) -> list[Lost]:
        lost = []
        for expected in self._expected.values():
            present = expected.name.client_id in view.members
            if present:
                expected.seen = True
            elif expected.seen and view.state.settled:
                lost.append(Lost(expected.name, f"left the group ({view.state.value})"))
            elif not expected.seen and now - expected.since > self.startup_timeout_s:
                reason = f"never joined the group within {self.startup_timeout_s} s"
                lost.append(Lost(expected.name, reason))
        return lost


class LoopPulse:
    """Whether a blocking loop still turns: it calls :meth:`beat` each round.

    Before the first beat the loop is starting up and gets ``startup_s``; after it, a loop that
    has not beaten for ``bound_s`` is stuck.
    """

    def __init__(self, bound_s: float, startup_s: float, now: float) -> None:
        self.bound_s = bound_s
        self.startup_s = startup_s
        self.started = now
        self.last: float | None = None

    def beat(self, now: float) -> None:
        self.last = now

    def alive(self, now: float) -> bool:
        if self.last is None:
            return now - self.started < self.startup_s
        return now - self.last < self.bound_s


_STATES = {
    ConsumerGroupState.STABLE: GroupState.STABLE,
    ConsumerGroupState.EMPTY: GroupState.EMPTY,
    ConsumerGroupState.PREPARING_REBALANCING: GroupState.REBALANCING,
    ConsumerGroupState.COMPLETING_REBALANCING: GroupState.REBALANCING,
}


class GroupObserver:
    """Describes the group at most every ``interval_s``, never blocking the caller.

    ``view(now)`` returns a view when a description has arrived since the last call, else None:
    one per request. A broker that does not answer gives a view in state UNREACHABLE (never
    settled: members drop out of the group while it is away, and that is not their failure);
    another failure to describe is logged and gives one in state UNKNOWN.
    """

    def __init__(self, clients: KafkaClients, group: str, interval_s: float) -> None:
        self.group = group
        self.interval_s = interval_s
        self._admin = clients.admin()
        self._pending: Future[Any] | None = None
        self._asked = float("-inf")

    def view(self, now: float) -> GroupView | None:
        if self._pending is None:
            if now - self._asked >= self.interval_s:
                timeout_s = max(self.interval_s, 1.0)
                futures = self._admin.describe_consumer_groups(
                    [self.group], request_timeout=timeout_s
                )
                self._pending, self._asked = futures[self.group], now
            return None
        if not self._pending.done():
            return None
        future, self._pending = self._pending, None
        try:
            described = future.result()
        except KafkaException as exc:
            error = translate_kafka_error(exc, "cannot describe the group", group=self.group)
            if isinstance(error, BrokerUnavailableError):
                return GroupView(GroupState.UNREACHABLE, frozenset())
            logger.warning("%s", error)
            return GroupView(GroupState.UNKNOWN, frozenset())
        state = _STATES.get(described.state, GroupState.UNKNOWN)
        return GroupView(state, frozenset(m.client_id for m in described.members))


class GroupMember:
    """One process's membership of its cluster's group.

    >>> member = GroupMember(clients, "bank", name, failure_timeout_ms=6000, topic="bank.cmd")
    >>> member.join(); member.poll()  # then poll every POLL_INTERVAL_S from the loop it guards
    """

    def __init__(
        self, clients: KafkaClients, app: str, name: MemberName, failure_timeout_ms: int, topic: str
    ) -> None:
        self.name = name
        self.topic = topic
        self.failure_timeout_ms = failure_timeout_ms
        self._consumer: Consumer = clients.consumer(**{
            "group.id": members_group(app),
            "client.id": name.client_id,
            "session.timeout.ms": failure_timeout_ms,
            "max.poll.interval.ms": failure_timeout_ms,
            "heartbeat.interval.ms": max(failure_timeout_ms // 10, 50),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        })  # fmt: skip

    def join(self) -> None:
        self._consumer.subscribe([self.topic], on_assign=self._pause)

    @staticmethod
    def _pause(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Take what the group assigns and read none of it: at the end, paused."""
        for tp in partitions:
            tp.offset = OFFSET_END
        consumer.assign(partitions)
        consumer.pause(partitions)

    def poll(self) -> None:
        """Serve heart-beats and rebalances; a fatal error ends the membership."""
        message = self._consumer.poll(0)
        error = message.error() if message is not None else None
        if error is None:
            return
        if error.code() == KafkaError.INVALID_SESSION_TIMEOUT:
            raise ConfigError(
                "the broker refuses this failure timeout (see its group.min.session.timeout.ms)",
                failure_timeout_ms=self.failure_timeout_ms,
            )
        if error.fatal():
            raise translate_kafka_error(
                KafkaException(error), "group membership failed", member=self.name.client_id
            )
        logger.debug("group membership member=%s: %s", self.name.client_id, error)

    def close(self) -> None:
        """Leave the group at once (a process that stops cleanly is not waited for)."""
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()


def worker_member(clients: KafkaClients, config: WorkerConfig, topic: str) -> GroupMember | None:
    """A worker's membership, if it belongs to a run (``run_id``; a bare worker joins none)."""
    if not config.run_id:
        return None
    name = MemberName(config.run_id, Role.WORKER, config.worker, config.generation)
    return GroupMember(clients, config.app, name, config.failure_timeout_ms, topic)


async def _keep_polling(member: GroupMember) -> None:
    while True:
        member.poll()
        await asyncio.sleep(POLL_INTERVAL_S)


async def while_member(member: GroupMember | None, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` while ``member`` is polled from the same loop.

    If the loop blocks for longer than the failure bound, polls stop and the member leaves
    the group; if the membership fails, ``work`` is cancelled and the error raised.
    """
    if member is None:
        return await work
    member.join()
    polling = asyncio.create_task(_keep_polling(member), name="group-membership")
    working = asyncio.ensure_future(work)
    try:
        await asyncio.wait([polling, working], return_when=asyncio.FIRST_COMPLETED)
        if not working.done():
            working.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await working
            polling.result()  # raises the membership's error
        return working.result()
    finally:
        polling.cancel()
        with contextlib.suppress(asyncio.CancelledError, EpochalError):
            await polling
        member.close()


class PollingThread:
    """Polls a member from a daemon thread for as long as ``alive()`` says a blocking loop turns
    (a :class:`LoopPulse`); once it says no, the member leaves the group. The thread owns the
    consumer: it also closes it, when :meth:`stop` asks or the loop is stuck."""

    def __init__(self, member: GroupMember, alive: Callable[[], bool]) -> None:
        self.member = member
        self.alive = alive
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="group-membership", daemon=True)

    def start(self) -> None:
        self.member.join()
        self._thread.start()

    def _poll(self) -> None:
        try:
            while not self._stopping.wait(POLL_INTERVAL_S):
                if not self.alive():
                    logger.error("loop stuck, leaving the group member=%s", self.member.name)
                    return
                self.member.poll()
        except EpochalError:
            logger.exception("group membership ended member=%s", self.member.name)
        finally:
            self.member.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        self._thread.join(timeout_s)
