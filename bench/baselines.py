"""Plain-Python baselines for ``bench.bank``: the same exactly-once Kafka batches, no epochal.

What is epochal's throughput worth? These give the bar to hold it against, on the same broker,
the same backlog and the same two cores: one Python process with a confluent-kafka consumer
(``read_committed``, no auto-commit) and a transactional producer, that per consumed batch (up
to ``--batch`` records) produces its outputs, adds the batch's next offsets to the transaction
(``send_offsets_to_transaction``) and commits it: consumed input and produced output are one
atomic step, exactly once, as in any Kafka Streams-like pipeline.

``bank``: the bank of ``examples.bank.app`` as a dict of balances. A deposit credits an account;
a transfer from an account to itself, or of more than the source holds, aborts (neither account
changes) and reports to ``--errors``; any other one moves the money and writes a receipt (the
app's ``Receipt``, msgpack) to ``--output``: one output record per transfer, like the app's
egress. Records that fail the app's schema (bad key, amount <= 0) are skipped and counted: the
app would send them to its dead letters.

``workload``: a benchmark workload's rules in plain Python (``bench.workloads``, ``--workload``):
each input record's egress, if it has one, goes to ``--output`` + its egress name.

``pipe``: the stateless exactly-once pipe: every input record, deposits included, goes to
``--output`` unchanged (value and key). Its unit is the record, not the transfer: a backlog of
D deposits and T transfers comes out as D + T records, and ``bench.bank`` counts all of them.

Neither recovers state: the balances live in the process only, so a baseline restarted on a
consumer group with committed offsets would resume with empty accounts. The benchmark gives
every run fresh topics, a fresh group and a fresh ``transactional.id``, and stops the process
(SIGTERM, between batches) once everything is out. Input partitions are all assigned to the one
process (no group membership, so no rebalance wait); on a one-partition topic (``bench.bank``'s)
the bank applies the records in log order, as a serial oracle would.

    python -m bench.baselines bank --bootstrap 127.0.0.1:9092 --input bank.in.transfers \\
        --output bank.out.receipts --errors bank.out.errors
    python -m bench.baselines pipe --bootstrap 127.0.0.1:9092 --input bank.in.transfers \\
        --output pipe.out
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

# the app's own schema: records are checked on decode as the app's sequencer checks them
from bench.workloads import WORKLOADS
from bench.workloads.base import Plain
from examples.bank.app import Deposit, Receipt, Transfer

__all__ = [
    "Aborted",
    "Deposit",
    "PlainBank",
    "Receipt",
    "Transfer",
    "exactly_once",
    "main",
    "plain_bank",
    "plain_workload",
    "stateless_pipe",
]

logger = logging.getLogger("bench.baselines")

BATCH = 10_000


class Aborted(msgspec.Struct, frozen=True):
    """An aborted transfer's report: the transfer and why (the app's reasons, in short)."""

    source: str
    target: str
    amount: int
    reason: str


Emit = Callable[[str, bytes, bytes | None], None]  # (topic, value, key): into the open transaction
Handler = Callable[[list[Message], Emit], None]  # one batch of input records


def exactly_once(
    bootstrap: str,
    input_topic: str,
    handle: Handler,
    *,
    transactional_id: str,
    group: str,
    stop: threading.Event,
    batch: int = BATCH,
) -> int:
    """Consume ``input_topic`` (every partition, from the group's committed offsets, else the
    start) in batches of up to ``batch`` records, each handled and committed in one Kafka
    transaction with its offsets, until ``stop`` is set; returns the records consumed.

    A failure aborts the open transaction and raises: there is no recovery here."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        },
        logger=logger,
    )
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5},
        logger=logger,
    )
    consumed = 0
    try:
        partitions = consumer.list_topics(input_topic, timeout=10).topics[input_topic].partitions
        if not partitions:
            raise SystemExit(f"no topic {input_topic}")
        consumer.assign(_committed(consumer, input_topic, sorted(partitions)))
        producer.init_transactions(30)
        group_metadata = consumer.consumer_group_metadata()

        def emit(topic: str, value: bytes, key: bytes | None) -> None:
            while True:
                try:
                    producer.produce(topic, value, key)
                    return
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.05)

        while not stop.is_set():
            messages = []
            for message in consumer.consume(num_messages=batch, timeout=0.2):
                error = message.error()
                if error is None:
                    messages.append(message)
                elif error.fatal():
                    raise KafkaException(error)
                else:  # librdkafka retries (a fresh broker's offsets coordinator, say)
                    logger.warning("consumer: %s", error)
            if not messages:
                continue
            next_offsets: dict[int, int] = {}
            for message in messages:
                next_offsets[message.partition() or 0] = (message.offset() or 0) + 1
            producer.begin_transaction()
            try:
                handle(messages, emit)
                producer.send_offsets_to_transaction(
                    [TopicPartition(input_topic, p, o) for p, o in next_offsets.items()],
                    group_metadata,
                    30,
                )
                producer.commit_transaction(60)
            except BaseException:
                producer.abort_transaction(30)
                raise
            consumed += len(messages)
    finally:
        producer.flush(5)
        consumer.close()
    return consumed


def _committed(consumer: Consumer, topic: str, partitions: list[int]) -> list[TopicPartition]:
    """The group's committed offset of each partition (its start when none), asked until the
    broker answers: on a fresh broker the offsets coordinator is still loading at first, and a
    consumer assigned without offsets then never starts fetching."""
    wanted = [TopicPartition(topic, p) for p in partitions]
    deadline = time.monotonic() + 60
    while True:
        try:
            committed = consumer.committed(wanted, timeout=10)
            break
        except KafkaException as exc:
            if time.monotonic() > deadline:
                raise
            logger.warning("committed offsets of %s: %s; retrying", topic, exc)
            time.sleep(0.2)
    return [
        TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
        for tp in committed
    ]


class PlainBank:
    """The bank's rules on a dict of balances (cents), one batch of input records at a time."""

    def __init__(self, output: str, errors: str) -> None:
        self.output = output
        self.errors = errors
        self.balances: dict[str, int] = {}
        self.invalid = 0  # records the app's schema refuses: no output, as for the app's egress
        self._decoder = msgspec.msgpack.Decoder(Deposit | Transfer)
        self._encoder = msgspec.msgpack.Encoder()

    def __call__(self, messages: list[Message], emit: Emit) -> None:
        now_ms = int(time.time() * 1000)
        balances, encode = self.balances, self._encoder.encode
        for message in messages:
            try:
                event = self._decoder.decode(message.value() or b"")
            except msgspec.DecodeError:  # ValidationError included
                self.invalid += 1
                continue
            if isinstance(event, Deposit):
                balances[event.account] = balances.get(event.account, 0) + event.amount
                continue
            source, target, amount = event.source, event.target, event.amount
            key = source.encode()
            if source == target:
                report = Aborted(source, target, amount, f"transfer from {source} to itself")
                emit(self.errors, encode(report), key)
            elif balances.get(source, 0) < amount:
                report = Aborted(source, target, amount, "'balance >= 0' violated")
                emit(self.errors, encode(report), key)
            else:
                balances[source] = left = balances.get(source, 0) - amount
                balances[target] = right = balances.get(target, 0) + amount
                emit(self.output, encode(Receipt(source, target, amount, left, right, now_ms)), key)


def plain_bank(
    bootstrap: str,
    input_topic: str,
    output: str,
    errors: str,
    *,
    transactional_id: str,
    group: str,
    stop: threading.Event,
    batch: int = BATCH,
) -> PlainBank:
    """Run the plain bank until ``stop`` is set; returns it, with its final balances."""
    bank = PlainBank(output, errors)
    exactly_once(
        bootstrap,
        input_topic,
        bank,
        transactional_id=transactional_id,
        group=group,
        stop=stop,
        batch=batch,
    )
    return bank


def stateless_pipe(
    bootstrap: str,
    input_topic: str,
    output: str,
    *,
    transactional_id: str,
    group: str,
    stop: threading.Event,
    batch: int = BATCH,
) -> int:
    """Copy every input record to ``output``, exactly once, until ``stop`` is set; returns the
    records copied."""

    def copy(messages: list[Message], emit: Emit) -> None:
        for message in messages:
            emit(output, message.value() or b"", message.key())

    return exactly_once(
        bootstrap,
        input_topic,
        copy,
        transactional_id=transactional_id,
        group=group,
        stop=stop,
        batch=batch,
    )


def plain_workload(
    bootstrap: str,
    input_topic: str,
    plain: Plain,
    prefix: str,
    *,
    transactional_id: str,
    group: str,
    stop: threading.Event,
    batch: int = BATCH,
) -> Plain:
    """Run a workload's plain rules (``bench.workloads``) until ``stop`` is set: each record's
    egress goes to ``<prefix><egress name>``, keyed as its input; returns the rules, with their
    final state."""
    topic = input_topic.rpartition(".in.")[2]

    def apply(messages: list[Message], emit: Emit) -> None:
        for message in messages:
            out = plain(topic, message.value() or b"")
            if out is not None:
                emit(prefix + out[0], out[1], message.key())

    exactly_once(
        bootstrap,
        input_topic,
        apply,
        transactional_id=transactional_id,
        group=group,
        stop=stop,
        batch=batch,
    )
    return plain


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["bank", "pipe", "workload"])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), help="its rules (kind workload)")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True, help="input topic (Deposit/Transfer msgpack)")
    parser.add_argument("--output", required=True, help="receipts (bank), copies (pipe), or the "
                        "prefix of the workload's egress topics (<app>.out.)")  # fmt: skip
    parser.add_argument("--errors", help="the bank's abort reports (default: --output)")
    parser.add_argument("--transactional-id", help="default: <input>.plain-<kind>")
    parser.add_argument("--group", help="consumer group for the offsets (default: as above)")
    parser.add_argument("--batch", type=int, default=BATCH, help="records per transaction")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()

    def stopping(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    name = args.transactional_id or f"{args.input}.plain-{args.kind}"
    common: dict[str, Any] = {
        "transactional_id": name,
        "group": args.group or name,
        "stop": stop,
        "batch": args.batch,
    }
    started = time.monotonic()
    if args.kind == "bank":
        bank = plain_bank(
            args.bootstrap, args.input, args.output, args.errors or args.output, **common
        )
        done = f"{len(bank.balances)} accounts, {bank.invalid} invalid records skipped"
    elif args.kind == "workload":
        plain = WORKLOADS[args.workload]().plain()
        plain_workload(args.bootstrap, args.input, plain, args.output, **common)
        done = f"{len(plain.state)} keys"
    else:
        done = f"{stateless_pipe(args.bootstrap, args.input, args.output, **common)} records"
    print(f"{args.kind}: {done} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
