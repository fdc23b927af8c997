"""``<app>.status``: every process of a cluster says, once a second, who and how it is.

Each process (supervisor, sequencer, worker) runs a :class:`StatusPublisher`: a daemon thread
that builds the process's record (``schemas/status.py``) and produces it, keyed by process slot,
to a compacted topic. Nothing of it runs on an epoch loop; a record that cannot be produced (the
broker away) is dropped, and the next one says the same, newer. ``epochal status`` reads the
topic (:class:`StatusReader`): the latest record per key is where each process stands, and a
slot whose latest record is older than a few seconds has stopped reporting. The topic holds
every record of the last minute or so until compaction cleans it, which is the history a
status page starts its charts from.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from epochal.errors import BrokerUnavailableError, LogError, SchemaError
from epochal.log.client import KafkaClients
from epochal.log.topics import TopicNames
from epochal.schemas.codec import decode, encode
from epochal.schemas.status import AnyStatus, ProcessState, ProcessStatus

__all__ = [
    "STATUS_INTERVAL_S",
    "STATUS_TOPIC_CONFIG",
    "ProcessIdentity",
    "Rates",
    "StatusPublisher",
    "StatusReader",
    "ensure_status_topic",
]

logger = logging.getLogger(__name__)

STATUS_INTERVAL_S = 1.0
STATUS_TOPIC_CONFIG = {
    "cleanup.policy": "compact",  # the latest record of every process, forever
    "min.cleanable.dirty.ratio": "0.5",
    "segment.ms": str(60 * 1000),  # compaction cleans closed segments: a minute of history
}
_PRODUCER = {
    "linger.ms": 0,
    "acks": "1",
    "message.timeout.ms": 5000,  # a record older than this says nothing: drop it
    "queue.buffering.max.messages": 100,
}


def ensure_status_topic(clients: KafkaClients, app: str) -> None:
    clients.create_topics([TopicNames(app).status], partitions=1, config=STATUS_TOPIC_CONFIG)


class ProcessIdentity:
    """Who writes a status record, fixed when the process starts reporting: its host and start
    time; :meth:`fields` are the fields every record (``ProcessStatus``) begins with."""

    def __init__(self) -> None:
        self.host = socket.gethostname()
        self.started_ms = int(time.time() * 1000)

    def fields(self, run_id: str, generation: int, state: ProcessState) -> dict[str, Any]:
        """The common fields of a record made now."""
        return {
            "run_id": run_id,
            "generation": generation,
            "pid": os.getpid(),
            "host": self.host,
            "time_ms": int(time.time() * 1000),
            "started_ms": self.started_ms,
            "state": state,
        }


class Rates:
    """Per-second rates of counters over the last ``window_s`` (from the oldest sample in it):
    steadier than one interval's, which an epoch landing just before or after a sample skews.

    >>> rates = Rates(window_s=5.0, clock=iter([0.0, 1.0, 2.0]).__next__)
    >>> rates.of(epochs=10), rates.of(epochs=30), rates.of(epochs=30)
    ({'epochs': 0.0}, {'epochs': 20.0}, {'epochs': 10.0})
    """

    def __init__(self, window_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._samples: deque[tuple[float, Mapping[str, float]]] = deque()

    def of(self, **counters: float) -> dict[str, float]:
        """Each counter's rate over the window (0 at the first sample; a counter that went
        down, a restart, counts from 0)."""
        now = self.clock()
        while self._samples and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        first = self._samples[0] if self._samples else None
        self._samples.append((now, counters))
        if first is None or now <= first[0]:
            return dict.fromkeys(counters, 0.0)
        seconds = now - first[0]
        return {
            name: max(0.0, value - first[1].get(name, value)) / seconds
            for name, value in counters.items()
        }


class StatusPublisher:
    """Produces ``report()`` to ``<app>.status`` every ``interval_s``, from a daemon thread.

    >>> publisher = StatusPublisher(clients, "bank", lambda: worker_status(...))
    >>> publisher.start(); ...; publisher.stop()
    """

    def __init__(
        self,
        clients: KafkaClients,
        app: str,
        report: Callable[[], ProcessStatus],
        interval_s: float = STATUS_INTERVAL_S,
    ) -> None:
        self.topic = TopicNames(app).status
        self.report = report
        self.interval_s = interval_s
        self._producer = clients.producer(**_PRODUCER)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="epochal-status", daemon=True)
        self._failed = False  # said once: a status that cannot be built must not flood the log

    def start(self) -> None:
        self._thread.start()

    def stop(self, last: ProcessStatus | None = None) -> None:
        """Stop writing; ``last`` (a STOPPED record) is written and flushed first."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(self.interval_s + 5)
        if last is not None:
            self._produce(last)
        self._producer.flush(2)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                record = self.report()
            except Exception:  # a report is never worth its process
                if not self._failed:
                    logger.warning("cannot build a status record", exc_info=True)
                self._failed = True
            else:
                self._produce(record)
            self._producer.poll(0)
            self._stopping.wait(self.interval_s)

    def _produce(self, record: ProcessStatus) -> None:
        try:
            self._producer.produce(self.topic, encode(record), record.key)
        except (BufferError, KafkaException) as exc:  # the broker away: the next one will do
            logger.debug("status record dropped: %s", exc)


class StatusReader:
    """Reads ``<app>.status`` (and counts ``<app>.dlq``) from where the last read ended.

    >>> reader = StatusReader(clients, "bank")
    >>> records = reader.read()          # every record so far, oldest first; then only new ones
    >>> reader.latest["worker:0"], reader.dead_letters
    """

    def __init__(self, clients: KafkaClients, app: str) -> None:
        self.clients = clients
        self.names = TopicNames(app)
        self.latest: dict[str, AnyStatus] = {}
        self.dead_letters = 0  # records kept on the dead-letter topic
        self._next: dict[str, int] = {}  # topic -> where the next read starts

    def read(self, timeout_s: float = 10.0) -> list[AnyStatus]:
        """The status records written since the last read (none for an app that never ran
        with status records), and :attr:`dead_letters` brought up to date."""
        records: list[AnyStatus] = []
        for message in self._new(self.names.status, committed=False, timeout_s=timeout_s):
            record = _status_of(message)
            if record is not None:
                records.append(record)
                self.latest[record.key.decode()] = record
        self.dead_letters += sum(
            1 for _ in self._new(self.names.dead_letters, committed=True, timeout_s=timeout_s)
        )
        return records

    def _new(self, topic: str, committed: bool, timeout_s: float) -> list[Message]:
        """The records of partition 0 of ``topic`` from the last read's end to its end now."""
        try:
            low, high = self.clients.watermarks(topic, timeout_s=timeout_s, committed=committed)
        except BrokerUnavailableError:
            raise
        except LogError as exc:
            if _unknown_topic(exc):
                return []
            raise
        start = max(low, self._next.get(topic, 0))
        self._next[topic] = high
        if start >= high:
            return []
        what = f"reading {topic}"
        return list(self.clients.read_range(topic, {0: (start, high)}, what, committed, timeout_s))


def _status_of(message: Message) -> AnyStatus | None:
    """A status record, or None for one this version cannot read (a newer epochal's)."""
    try:
        record: AnyStatus = decode(message.value() or b"", AnyStatus)  # type: ignore[arg-type]
    except SchemaError:
        return None
    return record


def _unknown_topic(error: LogError) -> bool:
    cause = error.__cause__
    if not isinstance(cause, KafkaException) or not cause.args:
        return False
    code = cause.args[0].code()
    return bool(code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION))
