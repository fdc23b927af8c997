"""What every example producer shares: the common flags and a send loop, with plain confluent-kafka.

It does not import epochal: any Kafka client that writes msgpack (or JSON) records of the right
shape can drive an epochal app, and the producers show it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

import msgspec
from confluent_kafka import Producer

__all__ = ["common_flags", "send"]


def common_flags(parser: argparse.ArgumentParser, topic: str) -> None:
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    parser.add_argument("--count", type=int, default=10_000, help="events to send")
    parser.add_argument("--json", action="store_true", help="send JSON instead of msgpack")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the workload")
    parser.add_argument("--topic", default=topic, help="input topic (for an app run with --name)")


def send(args: argparse.Namespace, keyed_events: Iterable[tuple[str, object]]) -> int:
    """Send ``(key, event)`` pairs to ``args.topic``; the exit code says whether all arrived.

    Records are keyed (one key's records keep their order in Kafka).
    """
    encode = msgspec.json.encode if args.json else msgspec.msgpack.encode
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5})
    failed: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failed.append(str(error))

    sent = 0
    for key, event in keyed_events:
        while True:
            try:
                producer.produce(args.topic, encode(event), key.encode(), on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)
        sent += 1
    left = producer.flush(30)
    if left or failed:
        reason = failed[0] if failed else "timed out"
        print(f"{left + len(failed)} of {sent} records not delivered: {reason}", file=sys.stderr)
        return 1
    print(f"sent {sent} records to {args.topic} ({'JSON' if args.json else 'msgpack'})")
    return 0
