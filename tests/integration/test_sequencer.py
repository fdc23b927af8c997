"""A real :class:`Sequencer` on the real broker: bad records never stop it, the command log (not
the consumer group) holds its positions, it resumes from the log's tail only, it fences before it
reads, truncated logs are errors that say what is missing, client retries are sequenced once
across restarts, and an idle app logs nothing.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource

from epochal.config import KafkaConfig, SequencerConfig
from epochal.errors import LogError, LogTruncatedError
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog, LoggedEpoch, chunk_epoch
from epochal.log.ordering import Routed
from epochal.log.sequencer import Sequencer
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import ClientRequest, CommandTxn, DeadLetter, EpochRecord, Origin
from epochal.schemas.snapshots import Manifest
from tests.unit.log.fuzz_app import Blob, Poke, app

pytestmark = pytest.mark.integration

WAIT_S = 30.0


class _Renamed:
    """The fuzz app's router under a test's own app name (its topics are unique per test)."""

    def __init__(self, name: str) -> None:
        self.prefix = f"{name}.in."

    def route(self, topic: str, value: bytes) -> Routed:
        return app.route(f"fuzz.in.{topic.removeprefix(self.prefix)}", value)

    def route_request(self, handler: str, event: bytes) -> Routed:
        return app.route_request(handler, event)


def _sequencer(
    kafka: KafkaClients, name: str, snapshot: Manifest | None = None, **settings: Any
) -> Sequencer:
    settings.setdefault("snapshot_interval_ms", 0)  # epochs counted here are the input's only
    config = SequencerConfig(name, epoch_ms=50, **settings)
    return Sequencer(
        config,
        kafka,
        _Renamed(name),
        [f"{name}.in.things"],
        "code",
        latest_snapshot=lambda: snapshot,
    )


@pytest.fixture
def name() -> str:
    return f"seq{uuid.uuid4().hex[:10]}"


@pytest.fixture
def sequencer(kafka: KafkaClients, name: str) -> Sequencer:
    made = _sequencer(kafka, name)
    made.ensure_topics(input_partitions=2)
    return made


class Running:
    """A sequencer running in a thread; ``stop`` joins it and raises what it raised."""

    def __init__(self, sequencer: Sequencer) -> None:
        self.sequencer = sequencer
        self.stopping = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-sequencer")
        self.thread.start()

    def _run(self) -> None:
        try:
            self.sequencer.run(lambda: self.stopping)
        except BaseException as exc:  # handed to the test's thread by stop()
            self.error = exc

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        self.stopping = True
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the sequencer did not stop"
        if self.error is not None:
            raise self.error


@contextmanager
def running(sequencer: Sequencer) -> Iterator[Running]:
    run = Running(sequencer)
    try:
        yield run
    finally:
        run.stop()


def _produce(
    kafka: KafkaClients, topic: str, values: list[bytes], keys: list[bytes | None] | None = None,
    partition: int = 0,
) -> None:  # fmt: skip
    producer = kafka.producer(**{"message.max.bytes": 1_000_000})
    for value, key in zip(values, keys or [None] * len(values), strict=True):
        producer.produce(topic, value, key=key, partition=partition)
    assert producer.flush(WAIT_S) == 0


def _read(kafka: KafkaClients, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, value, key) of every committed record of partition 0."""
    end, out = kafka.end_offset(topic), []
    if end == 0:
        return out
    consumer = kafka.assigned_consumer(topic, {0: 0}, **{"isolation.level": "read_committed"})
    try:
        while consumer.position([TopicPartition(topic, 0)])[0].offset < end:
            for m in consumer.consume(1000, 0.5):
                assert m.error() is None, m.error()
                out.append((m.offset() or 0, m.value() or b"", m.key()))
    finally:
        consumer.close()
    return out


def _epochs(kafka: KafkaClients, name: str) -> list[EpochRecord]:
    return [e.record for e in KafkaCommandLog(kafka, f"{name}.cmd").epochs(to_end=True)]


def _txns(kafka: KafkaClients, name: str) -> list[CommandTxn]:
    return [t for record in _epochs(kafka, name) for t in record.txns]


def _wait_for(condition: Callable[[], bool], what: str, run: Running | None = None) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if run is not None and not run.alive():
            run.stop()  # raises what the sequencer raised
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _blob(key: str) -> bytes:
    return encode(Blob(key, payload=[1, 2.5, {"a": None}]))


def _deep_json(depth: int) -> bytes:
    return b'{"type": "Blob", "key": "k", "payload": ' + b"[" * depth + b"]" * depth + b"}"


def _deep_msgpack(depth: int) -> bytes:
    head = msgspec.msgpack.encode({"type": "Blob", "key": "k"})
    return bytes([head[0] + 1]) + head[1:] + b"\xa7payload" + b"\x91" * depth + b"\xc0"


def test_bad_records_go_to_the_dlq_with_reason_and_coordinates_and_the_sequencer_stays_up(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    topic = f"{name}.in.things"
    huge_value, huge_key = b"\xc1" * 900_000, b"K" * 90_000  # ~1 MB, as the broker allows
    bad = [
        _deep_json(1_000),  # ~2 KB nested 1,000 deep into an Any field
        _deep_msgpack(1_000),
        b'{"type": "Blob", "key": "k", "payload": 123456789012345678901234567890}',
        b'{"type": "Odd", "key": "recurse"}',  # its key function raises RecursionError
        b'{"type": "Odd", "key": "wide", "n": 1}',  # its key is wider than 64 bits
        huge_value,
    ]
    values = [_blob("a"), *bad, _blob("b")]
    keys: list[bytes | None] = [None] * (len(values) - 2) + [huge_key, b"k"]
    requests = [
        encode(ClientRequest("req-1", "poke", encode(Poke("p")))),
        b"[" * 5_000 + b"]" * 5_000,
        encode(ClientRequest("req-2", "poke", b"{" + b'"a":[' * 1_000)),
    ]

    with running(sequencer) as run:
        _produce(kafka, topic, values, keys)
        _produce(kafka, f"{name}.requests", requests)
        _wait_for(lambda: len(_read(kafka, f"{name}.dlq")) == len(bad) + 2, "dead letters", run)
        _produce(kafka, topic, [_blob("after")])  # still up: later records are sequenced
        _wait_for(lambda: len(_txns(kafka, name)) == 4, "valid transactions", run)

    txns = _txns(kafka, name)
    assert sorted((t.source.topic, t.source.offset) for t in txns if t.source) == sorted([
        (f"{name}.requests", 0), (topic, 0), (topic, len(values) - 1), (topic, len(values)),
    ])  # fmt: skip
    dead = {}
    for _, value, key in _read(kafka, f"{name}.dlq"):
        letter = decode(value, DeadLetter)
        assert key == letter.key
        dead[(letter.topic, letter.partition, letter.offset)] = letter
    assert set(dead) == {(topic, 0, i) for i in range(1, len(bad) + 1)} | {
        (f"{name}.requests", 0, 1), (f"{name}.requests", 0, 2),
    }  # fmt: skip
    assert all(d.reason for d in dead.values())
    reasons = [dead[(topic, 0, i)].reason for i in range(1, len(bad))]
    assert "RecursionError" in reasons[3] or "recursion" in reasons[3]
    assert "key" in reasons[4]
    letter = dead[(topic, 0, len(bad))]
    assert (letter.truncated, letter.size) == (True, len(huge_value))
    assert huge_value.startswith(letter.value) and huge_key.startswith(letter.key or b"")
    assert len(encode(letter)) <= sequencer.config.dead_letter_max_bytes


def test_a_restart_after_the_group_offsets_were_deleted_sequences_nothing_twice(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    topic = f"{name}.in.things"
    with running(sequencer) as run:
        for partition in (0, 1):
            _produce(
                kafka, topic, [_blob(f"{partition}-{i}") for i in range(10)], partition=partition
            )
        _wait_for(lambda: len(_txns(kafka, name)) == 20, "the first 20 transactions", run)
    group = f"{name}.sequencer"
    assert _group_offsets(kafka, group)  # committed once a second, for monitoring tools
    admin = kafka.admin()
    for future in admin.delete_consumer_groups([group], request_timeout=WAIT_S).values():
        future.result(WAIT_S)
    del admin
    assert not _group_offsets(kafka, group)

    _produce(kafka, topic, [_blob(f"late-{i}") for i in range(5)], partition=1)
    with running(_sequencer(kafka, name)) as run:
        _wait_for(lambda: len(_txns(kafka, name)) >= 25, "the 5 later transactions", run)
        time.sleep(1.0)  # time enough to sequence anything twice
    with running(_sequencer(kafka, name)):  # the last epoch read partition 1 only
        time.sleep(1.5)

    epochs = _epochs(kafka, name)
    assert [e.epoch for e in epochs] == list(range(len(epochs)))
    now = [e.now_ms for e in epochs]
    assert now == sorted(now)
    sources = [(t.source.partition, t.source.offset) for e in epochs for t in e.txns if t.source]
    assert len(sources) == len(set(sources)) == 25


def _group_offsets(kafka: KafkaClients, group: str) -> list[TopicPartition]:
    consumer = kafka.consumer(**{"group.id": group})
    try:
        metadata = consumer.list_topics(timeout=10)
        partitions = [
            TopicPartition(topic, p) for topic, meta in metadata.topics.items()
            if topic.startswith(group.removesuffix(".sequencer") + ".") for p in meta.partitions
        ]  # fmt: skip
        return [tp for tp in consumer.committed(partitions, timeout=10) if tp.offset >= 0]
    finally:
        consumer.close()


def _write_log(
    kafka: KafkaClients, name: str, records: list[EpochRecord], chunk_bytes: int
) -> None:
    """Epochs appended as a sequencer would, 500 to a Kafka transaction; returns once a
    committed reader sees them all (the commit returns before the broker has written the
    transaction's markers, and until then the log's stable end is still before it)."""
    topic = f"{name}.cmd"
    end = kafka.end_offset(topic)
    producer = kafka.producer(**{"transactional.id": f"{name}.writer"})
    producer.init_transactions(WAIT_S)
    for start in range(0, len(records), 500):
        producer.begin_transaction()
        for record in records[start : start + 500]:
            for chunk in chunk_epoch(record, chunk_bytes):
                producer.produce(topic, chunk)
                end += 1
        producer.commit_transaction(WAIT_S)
        end += 1  # the commit marker
    _wait_for(lambda: kafka.end_offset(topic) == end, "the log's markers")


def test_resume_reads_only_the_tail_of_a_long_command_log_and_keeps_now_monotonic(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    topic = f"{name}.in.things"
    _produce(kafka, topic, [_blob(str(i)) for i in range(3)])
    future_ms = int(time.time() * 1000) + 3_600_000  # the last epoch's clock is ahead of ours
    records = [EpochRecord(e, 1_000 + e, e, "code", (), {f"{topic}:0": 3}) for e in range(5_000)]
    records[-1] = EpochRecord(4_999, future_ms, 1, "code", (), {f"{topic}:0": 3})
    _write_log(kafka, name, records, chunk_bytes=1024)
    log_length = kafka.end_offset(f"{name}.cmd")

    _produce(kafka, topic, [_blob("new")])
    with running(sequencer) as run:
        _wait_for(lambda: kafka.end_offset(f"{name}.cmd") > log_length, "a new epoch", run)

    assert 0 < sequencer.metrics.get("epochal_resume_records") <= 16  # of 5,000+ records
    last = KafkaCommandLog(kafka, f"{name}.cmd").last_epoch()
    assert last is not None
    assert (last.record.epoch, last.record.now_ms) == (5_000, future_ms)
    assert [(t.source.offset) for t in last.record.txns if t.source] == [3]


def test_the_last_epoch_is_found_whatever_the_number_of_its_chunks(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    log = KafkaCommandLog(kafka, f"{name}.cmd")
    assert log.last_epoch() is None  # a new app
    body = tuple(CommandTxn(i, "blob", b"x" * 100, ()) for i in range(300))
    _write_log(kafka, name, [EpochRecord(e, e, e, "code", body) for e in range(4)], chunk_bytes=200)
    chunks = len(chunk_epoch(EpochRecord(3, 3, 3, "code", body), 200))
    assert chunks > 100  # far more than the first window
    last = log.last_epoch()
    assert last is not None and last.record == EpochRecord(3, 3, 3, "code", body)
    assert chunks <= log.tail_records_read < 4 * chunks


class _RacedByOldSequencer(Sequencer):
    """A sequencer whose start an old one races: it commits its open epoch right after the new
    one read the log's tail (the orphan of the chaos run that logged epochs 465-488 twice)."""

    old: Producer
    old_committed: bool | None = None

    def _resume(self) -> Any:
        state = super()._resume()
        try:
            self.old.commit_transaction(10)
            self.old_committed = True
        except KafkaException:  # fenced
            self.old_committed = False
        return state


def test_a_new_sequencer_fences_the_old_one_before_it_reads_the_tail(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    topic = f"{name}.in.things"
    with running(sequencer) as run:
        _produce(kafka, topic, [_blob("one")])
        _wait_for(lambda: len(_epochs(kafka, name)) == 1, "epoch 0", run)
    old = kafka.producer(**{"transactional.id": f"{name}.sequencer"})
    old.init_transactions(WAIT_S)
    old.begin_transaction()  # an old sequencer, half-way through logging epoch 1
    for chunk in chunk_epoch(EpochRecord(1, 0, 0, "old", (), {f"{topic}:0": 1})):
        old.produce(f"{name}.cmd", chunk)
    old.flush(WAIT_S)

    new = _RacedByOldSequencer(sequencer.config, kafka, _Renamed(name), sequencer.inputs, "code")
    new.old = old
    with running(new) as run:
        _produce(kafka, topic, [_blob("two")])
        _wait_for(lambda: len(_epochs(kafka, name)) >= 2, "epoch 1", run)
        time.sleep(0.5)

    assert new.old_committed is False  # fenced: its epoch 1 never became visible
    epochs = _epochs(kafka, name)
    assert [(e.epoch, e.code_hash) for e in epochs] == [(0, "code"), (1, "code")]
    assert [t.source.offset for e in epochs for t in e.txns if t.source] == [0, 1]


def test_a_truncated_input_partition_is_a_log_truncated_error_naming_the_missing_offsets(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    topic = f"{name}.in.things"
    with running(sequencer) as run:
        _produce(kafka, topic, [_blob(str(i)) for i in range(10)], partition=1)
        _wait_for(lambda: len(_txns(kafka, name)) == 10, "10 transactions", run)
    _produce(kafka, topic, [_blob(str(i)) for i in range(10, 20)], partition=1)
    _delete_records(kafka, topic, 1, before=15)

    with pytest.raises(LogTruncatedError) as raised:
        _sequencer(kafka, name).run(_after(WAIT_S))
    assert raised.value.context == {"topic": topic, "partition": 1, "missing": "10..14"}


def _delete_records(kafka: KafkaClients, topic: str, partition: int, before: int) -> None:
    admin = kafka.admin()
    for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
        future.result(WAIT_S)
    del admin


def _after(seconds: float) -> Callable[[], bool]:
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() > deadline


def test_records_deleted_while_the_sequencer_runs_are_a_log_truncated_error(
    kafka_config: KafkaConfig, kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    """The process is stopped (SIGSTOP) so that it cannot fetch what is produced, then deleted."""
    topic = f"{name}.in.things"
    errors: multiprocessing.Queue[tuple[str, dict[str, Any]]] = multiprocessing.get_context(
        "spawn"
    ).Queue()
    child = multiprocessing.get_context("spawn").Process(
        target=_run_in_child, args=(kafka_config, name, errors)
    )
    child.start()
    try:
        _produce(kafka, topic, [_blob(str(i)) for i in range(5)])
        _wait_for(lambda: len(_txns(kafka, name)) == 5, "5 transactions")
        assert child.pid is not None
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(1.5)  # the fetch in flight (fetch.wait.max.ms 500) comes back empty
        _produce(kafka, topic, [_blob(str(i)) for i in range(5, 15)])
        _delete_records(kafka, topic, 0, before=12)
        os.kill(child.pid, signal.SIGCONT)
        kind, context = errors.get(timeout=WAIT_S)
    finally:
        if child.pid is not None:
            os.kill(child.pid, signal.SIGCONT)
        child.join(WAIT_S)
        if child.is_alive():
            child.kill()
            child.join()
    assert kind == "LogTruncatedError"
    assert context == {"topic": topic, "partition": 0, "missing": "5..11"}


def _run_in_child(
    kafka_config: KafkaConfig, name: str, errors: multiprocessing.Queue[tuple[str, dict[str, Any]]]
) -> None:
    sequencer = _sequencer(KafkaClients(kafka_config), name)
    try:
        sequencer.run(_after(WAIT_S * 2))
    except Exception as exc:
        errors.put((type(exc).__name__, dict(getattr(exc, "context", {}))))
        return
    errors.put(("nothing", {}))


def test_a_worker_reading_a_truncated_command_log_gets_log_truncated_error(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    topic = f"{name}.in.things"
    with running(sequencer) as run:
        for i in range(4):
            _produce(kafka, topic, [_blob(str(i))])
            _wait_for(lambda i=i: len(_epochs(kafka, name)) == i + 1, f"epoch {i}", run)
    command_log = f"{name}.cmd"
    _delete_records(kafka, command_log, 0, before=2)

    with pytest.raises(LogTruncatedError) as raised:
        list(KafkaCommandLog(kafka, command_log).epochs(start=0, to_end=True))
    assert raised.value.context == {"topic": command_log, "partition": 0, "missing": "0..1"}
    poller = KafkaCommandLog(kafka, command_log).poller(start=0)
    try:
        with pytest.raises(LogTruncatedError, match=r"missing=0\.\.1"):
            for _ in range(50):
                poller.poll(0.2)
    finally:
        poller.close()

    _delete_records(kafka, command_log, 0, before=kafka.end_offset(command_log))
    end = kafka.end_offset(command_log)
    with pytest.raises(LogTruncatedError) as raised:  # no epoch left to resume from
        _sequencer(kafka, name).run(_after(WAIT_S))
    assert raised.value.context == {
        "topic": command_log,
        "partition": 0,
        "missing": f"0..{end - 1}",
    }


def test_a_log_trimmed_back_to_a_snapshot_at_its_end_goes_on_from_the_snapshot(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    """Retention trims the log back to the oldest snapshot kept; when that one ends at the log's
    end no epoch is left, and the sequencer goes on from the latest snapshot's row: the next
    epoch, a monotonic clock, each input once. Trimmed past that snapshot, it stops."""
    topic, command_log = f"{name}.in.things", f"{name}.cmd"
    with running(sequencer) as run:
        for i in range(2):
            _produce(kafka, topic, [_blob(str(i))])
            _wait_for(lambda i=i: len(_epochs(kafka, name)) == i + 1, f"epoch {i}", run)
    first, last = KafkaCommandLog(kafka, command_log).epochs(to_end=True)
    racing = _TrimmedOnce(kafka.config, command_log, before=first.position + 1)
    tail = KafkaCommandLog(racing, command_log).tail(lambda: None)  # trimmed while read
    assert tail is not None and tail.epoch == last.record.epoch
    _delete_records(kafka, command_log, 0, before=last.position + 1)  # retention, keep=1
    assert list(KafkaCommandLog(kafka, command_log).epochs(last.position + 1, to_end=True)) == []
    _produce(kafka, topic, [_blob("2")])

    older = _manifest(first)  # the records after it are gone: no going on from there
    with pytest.raises(LogTruncatedError) as raised:
        _sequencer(kafka, name, older).run(_after(WAIT_S))
    missing = f"{first.position + 1}..{last.position}"
    assert raised.value.context == {"topic": command_log, "partition": 0, "missing": missing}

    end = kafka.end_offset(command_log)
    with running(_sequencer(kafka, name, _manifest(last))) as run:
        _wait_for(lambda: kafka.end_offset(command_log) > end, "an epoch after the snapshot", run)
    (logged,) = KafkaCommandLog(kafka, command_log).epochs(last.position + 1, to_end=True)
    assert logged.record.epoch == last.record.epoch + 1
    assert logged.record.now_ms >= last.record.now_ms
    assert [t.source.offset for t in logged.record.txns if t.source] == [2]


class _TrimmedOnce(KafkaClients):
    """Retention trims ``topic`` right after a reader learnt where it starts: worker 0 committing
    a snapshot while a restarted sequencer reads the log's tail."""

    def __init__(self, config: KafkaConfig, topic: str, before: int) -> None:
        super().__init__(config)
        self.trim: tuple[str, int] | None = (topic, before)

    def watermarks(self, topic: str, *args: Any, **kwargs: Any) -> tuple[int, int]:
        bounds = super().watermarks(topic, *args, **kwargs)
        if self.trim is not None and self.trim[0] == topic:
            _delete_records(self, topic, 0, before=self.trim[1])
            self.trim = None
        return bounds


def _manifest(logged: LoggedEpoch) -> Manifest:
    """The row of a snapshot taken at ``logged``: where the log stood after it."""
    record = logged.record
    positions = dict(record.next_offsets)
    at = (record.epoch, record.epoch, record.now_ms, logged.position + 1, positions)
    return Manifest(*at, {}, {}, {}, "0", b"", 1, "code")


def test_a_client_retry_is_sequenced_once_across_a_sequencer_restart(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    requests = f"{name}.requests"
    request = encode(ClientRequest("req-A", "poke", encode(Poke("a"))))
    with running(sequencer) as run:
        _produce(kafka, requests, [request])
        _wait_for(lambda: len(_txns(kafka, name)) == 1, "req-A", run)
    restarted = _sequencer(kafka, name)
    with running(restarted) as run:
        later = encode(ClientRequest("req-B", "poke", encode(Poke("b"))))
        _produce(kafka, requests, [request, later, request])  # req-A retried, twice
        _wait_for(lambda: any(t.request_id == "req-B" for t in _txns(kafka, name)), "req-B", run)
        time.sleep(0.5)

    ids = [t.request_id for t in _txns(kafka, name) if t.origin == Origin.CLIENT]
    assert ids == ["req-A", "req-B"]
    assert restarted.metrics.get("epochal_request_ids") == 2


def test_an_idle_sequencer_logs_nothing_and_a_tick_makes_exactly_one_epoch(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    with running(sequencer) as run:
        time.sleep(2.0)
        assert kafka.end_offset(f"{name}.cmd") == 0
        _produce(kafka, f"{name}.requests", [encode(ClientRequest.tick(0))])
        _wait_for(lambda: len(_epochs(kafka, name)) == 1, "the tick's epoch", run)
        time.sleep(1.0)
        assert run.alive()

    (epoch,) = _epochs(kafka, name)
    assert (epoch.epoch, epoch.txns) == (0, ())
    assert epoch.next_offsets == {f"{name}.requests:0": 1}
    assert _read(kafka, f"{name}.dlq") == []


def test_topics_keep_what_recovery_needs_and_a_lower_retention_is_raised(
    kafka: KafkaClients, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"{name}.in.things"
    kafka.create_topics([topic], config={"retention.ms": "60000"})
    with caplog.at_level(logging.WARNING, logger="epochal.log.client"):
        _sequencer(kafka, name, input_retention_ms=-1).ensure_topics()
    assert f"raising retention.ms of topic {topic} from 60000 to -1" in caplog.text
    for checked in (topic, f"{name}.requests", f"{name}.cmd"):
        assert _retention(kafka, checked) == ("-1", "-1")

    week = 7 * 24 * 3600 * 1000
    other = f"{name}x"
    _sequencer(kafka, other, input_retention_ms=week).ensure_topics()
    assert _retention(kafka, f"{other}.in.things") == (str(week), "-1")
    assert _retention(kafka, f"{other}.cmd") == ("-1", "-1")


def _retention(kafka: KafkaClients, topic: str) -> tuple[str, str]:
    admin = kafka.admin()
    (future,) = admin.describe_configs([ConfigResource("TOPIC", topic)]).values()
    entries = future.result(WAIT_S)
    del admin
    return entries["retention.ms"].value, entries["retention.bytes"].value


def test_a_fenced_sequencer_stops_with_our_error_not_a_dead_letter(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    topic = f"{name}.in.things"
    run = Running(sequencer)
    try:
        _produce(kafka, topic, [_blob("one")])
        _wait_for(lambda: len(_epochs(kafka, name)) == 1, "epoch 0", run)
        newer = kafka.producer(**{"transactional.id": f"{name}.sequencer"})
        newer.init_transactions(WAIT_S)  # a newer sequencer fences this one
        _produce(kafka, topic, [_blob("two")])
        run.thread.join(WAIT_S)
        assert not run.alive()
    finally:
        run.stopping = True
    with pytest.raises(LogError, match="cannot log the epoch") as raised:
        run.stop()
    assert raised.value.context == {"epoch": 1}
    assert _read(kafka, f"{name}.dlq") == []


def test_records_on_a_topic_no_transaction_reads_are_dead_letters_with_their_coordinates(
    kafka: KafkaClients, name: str, sequencer: Sequencer
) -> None:
    """A producer's misspelt topic (``<app>.in.thigns``, auto-created by the broker) is read
    like an input and its records go to the DLQ, whether it existed at the start or appeared
    while the sequencer ran; restarting sequences none of them twice."""
    early, late = f"{name}.in.thigns", f"{name}.in.late"
    kafka.create_topics([early])
    _produce(kafka, early, [_blob("a"), b"not even a record"])
    with running(sequencer) as run:
        _wait_for(lambda: len(_read(kafka, f"{name}.dlq")) == 2, "the early topic's letters", run)
        kafka.create_topics([late], partitions=2)
        _produce(kafka, late, [_blob("b")], partition=1)
        _produce(kafka, f"{name}.in.things", [_blob("c")])
        _wait_for(lambda: len(_read(kafka, f"{name}.dlq")) == 3, "the late topic's letter", run)
    with running(_sequencer(kafka, name)) as run:  # a restart resumes every topic's position
        _produce(kafka, early, [_blob("d")])
        _wait_for(lambda: len(_read(kafka, f"{name}.dlq")) == 4, "a letter after the restart", run)

    letters = [decode(value, DeadLetter) for _, value, _ in _read(kafka, f"{name}.dlq")]
    expected = [(late, 1, 0), (early, 0, 0), (early, 0, 1), (early, 0, 2)]
    assert sorted((d.topic, d.partition, d.offset) for d in letters) == sorted(expected)
    assert all("no transaction reads this topic" in d.reason for d in letters)
    assert [t.source.topic for t in _txns(kafka, name) if t.source] == [f"{name}.in.things"]
