"""Open loop: records fed at a fixed rate whatever the system does, and their latency read back.

A feeder that slows down when the system does measures the feeder; this one does not: it sends
what is due every 10 ms by the wall clock, and the Kafka timestamp of each input record (from
its delivery report) is where its latency starts. It ends at the Kafka timestamp of the egress
record that names the input (``source.offset``), which the cluster sets when that epoch's egress
commits; the time the reader saw it is kept too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from confluent_kafka import Producer, TopicPartition

from bench.processes import BANK_OUTPUTS
from epochal.log.client import KafkaClients, arrived
from epochal.schemas.egress import EgressRecord
from examples.bank.app import app as bank_app

__all__ = ["EgressWatcher", "feed_at_rate", "percentiles"]


def feed_at_rate(
    bootstrap: str,
    topic: str,
    source: Any,
    rate: int,
    seconds: float,
    *,
    stamps: dict[int, int],
    stop: threading.Event | None = None,
) -> int:
    """Records from ``source`` (values, or events to encode as msgpack) at ``rate`` per second,
    in bursts every 10 ms, for ``seconds`` or until ``stop`` is set, however far behind the
    system is (open loop); returns how many were sent, and fills ``stamps`` with each one's
    offset and Kafka timestamp (from the delivery reports: the input topics may be trimmed
    behind the snapshots before anyone could read them back)."""

    def delivered(error: Any, message: Any) -> None:
        if error is None:
            stamps[message.offset()] = message.timestamp()[1]

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    sent, started, tick = 0, time.monotonic(), 0
    while not (stop and stop.is_set()):
        elapsed = time.monotonic() - started
        due = int(rate * min(elapsed + 0.01, seconds)) - sent
        for _ in range(due):
            item = next(source)
            value = item if isinstance(item, bytes) else msgspec.msgpack.encode(item)
            producer.produce(topic, value, on_delivery=delivered)
        sent += max(0, due)
        producer.poll(0)
        if elapsed + 0.01 >= seconds:  # the last burst is sent, however late this pass came
            break
        tick += 1
        time.sleep(max(0.0, started + tick * 0.01 - time.monotonic()))
    assert producer.flush(60) == 0
    return sent


class EgressWatcher(threading.Thread):
    """Reads the egress of app ``name`` as it comes (``read_committed``): per input offset,
    the egress record's timestamp and when it was seen (both ms since the epoch). ``read``
    decodes a record in the app's egress format (the bank's by default).

    Its fetches wait up to 100 ms for data: the broker answers one as soon as a commit makes
    records readable, so a shorter wait saw nothing sooner, and its empty answers (5 ms: 200
    a second) were a sixth of the broker's CPU at 100 transfers/s."""

    def __init__(
        self,
        clients: KafkaClients,
        name: str,
        outputs: Sequence[str] = BANK_OUTPUTS,
        read: Callable[[bytes], EgressRecord] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.consumer = clients.consumer(
            **{
                "isolation.level": "read_committed",
                "group.id": f"{name}.bench",
                "fetch.wait.max.ms": 100,
            }
        )
        topics = [f"{name}.out.{t}" for t in outputs]
        self.consumer.assign([TopicPartition(t, 0, 0) for t in topics])
        self.read = read or bank_app.egress_codec.read_record
        self.out: dict[int, tuple[int, float]] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        read = self.read
        while not self.stopping.is_set():
            for message in arrived(self.consumer, 10_000, 0.05):
                if message.error() is not None:
                    continue
                seen = time.time() * 1000
                record = read(message.value() or b"")
                if record.source is not None:
                    self.out[record.source.offset] = (message.timestamp()[1], seen)
        self.consumer.close()


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p99, p99.9 and max of ``values`` (NaN when there are none)."""
    ordered = sorted(values)
    if not ordered:
        return dict.fromkeys(("p50", "p99", "p99.9", "max"), float("nan"))
    last = len(ordered) - 1
    return {
        "p50": ordered[int(0.50 * len(ordered))],
        "p99": ordered[min(last, int(0.99 * len(ordered)))],
        "p99.9": ordered[min(last, int(0.999 * len(ordered)))],
        "max": ordered[-1],
    }
