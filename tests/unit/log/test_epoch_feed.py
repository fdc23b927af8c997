"""Weak mode's epoch feed over real sockets: the sequencer learns where the workers resumed,
every worker gets every epoch in order with its dead letters, and either end going away is an
error the other sees (a clean stop aside)."""

from __future__ import annotations

import threading
import time

import pytest

from epochal.errors import LogError
from epochal.log.command_log import LoggedEpoch
from epochal.log.epoch_feed import EpochFeed, EpochFeedServer, FeedClosed, FeedHello
from epochal.schemas.commands import CommandTxn, DeadLetter, EpochRecord, KeyRef
from tests.conftest import free_ports


def _hello(worker: int, ssid: int = 7, generation: int = 2) -> FeedHello:
    return FeedHello(generation, worker, ssid, ssid + 1, 1_000, {"app.in.x:0": 42})


def _connect(address: str, hellos: list[FeedHello]) -> list[EpochFeed]:
    """Workers connecting: the listener's backlog takes them before the server accepts."""
    return [EpochFeed(address, hello, 10.0) for hello in hellos]


def _record(epoch: int, txns: int) -> EpochRecord:
    return EpochRecord(
        epoch, 1_000 + epoch, epoch, "code",
        tuple(CommandTxn(i, "h", b"\x90" * 300, (KeyRef("A", i),)) for i in range(txns)),
    )  # fmt: skip


def _dead(epoch: int) -> tuple[DeadLetter, ...]:
    """Every third epoch has dead letters (a keyed one among them)."""
    return tuple(
        DeadLetter("malformed", "app.in.x", 0, epoch * 10 + i, b"\xc1", b"k" if i else None)
        for i in range(2 if epoch % 3 == 0 else 0)
    )


def test_every_worker_gets_every_epoch_in_order_after_saying_where_it_resumed() -> None:
    address = f"127.0.0.1:{free_ports(1)}"
    server = EpochFeedServer(address, workers=2, generation=2)
    stale = _connect(address, [_hello(0, generation=1)])  # a zombie of the last generation
    feeds = _connect(address, [_hello(1), _hello(0)])
    hello = server.accept(10.0)
    assert hello is not None
    assert (hello.worker, hello.ssid, hello.next_epoch, hello.positions) == (
        0, 7, 8, {"app.in.x:0": 42},
    )  # fmt: skip
    records = [_record(8 + i, txns=i * 50) for i in range(40)]  # some frames span many reads
    sending = threading.Thread(target=lambda: [server.send(r, _dead(r.epoch)) for r in records])
    sending.start()  # a worker that does not read holds the sender up: backpressure
    got: list[list[LoggedEpoch]] = [[] for _ in feeds]
    while any(len(g) < len(records) for g in got):  # workers read side by side
        for feed, epochs in zip(feeds, got, strict=True):
            epochs.extend(feed.poll(0.05, max_epochs=7))
    for epochs in got:
        assert [e.record for e in epochs] == records
        assert [e.dead for e in epochs] == [_dead(r.epoch) for r in records]  # to hold them
        assert [e.position for e in epochs] == [r.epoch for r in records]
    sending.join(10)
    server.close()
    for feed in feeds:
        with pytest.raises(FeedClosed):
            feed.poll(1.0)
        feed.close()
    for feed in stale:
        feed.close()


def test_workers_that_resumed_from_different_snapshots_are_refused() -> None:
    address = f"127.0.0.1:{free_ports(1)}"
    server = EpochFeedServer(address, workers=2, generation=2)
    feeds = _connect(address, [_hello(0, ssid=7), _hello(1, ssid=9)])
    with pytest.raises(LogError, match="different snapshots"):
        server.accept(10.0)
    server.close()
    for feed in feeds:
        feed.close()


def test_a_worker_that_never_connects_and_one_that_leaves_are_errors() -> None:
    address = f"127.0.0.1:{free_ports(1)}"
    server = EpochFeedServer(address, workers=2, generation=2)
    (only,) = _connect(address, [_hello(0)])
    with pytest.raises(LogError, match="did not connect"):
        server.accept(0.5)
    server.close()

    server = EpochFeedServer(address, workers=1, generation=2)
    (feed,) = _connect(address, [_hello(0)])
    server.accept(5.0)
    feed.close()
    with pytest.raises(FeedClosed, match="left"):
        for epoch in range(1000):  # the broken connection shows on a send
            server.send(_record(epoch, txns=50))
    server.close()
    only.close()


def test_a_stop_while_waiting_for_workers_ends_the_wait_at_once() -> None:
    """A worker that failed to start never connects: the sequencer's stop must not wait out
    the feed timeout."""
    address = f"127.0.0.1:{free_ports(1)}"
    server = EpochFeedServer(address, workers=2, generation=2)
    (only,) = _connect(address, [_hello(0)])
    told = time.monotonic() + 0.3
    started = time.monotonic()
    assert server.accept(30.0, stopping=lambda: time.monotonic() > told) is None
    assert time.monotonic() - started < 5.0, "the stop waited for the timeout"
    server.close()
    only.close()


def test_a_send_to_a_busy_worker_waits_beating_and_gives_up_only_when_stopping() -> None:
    address = f"127.0.0.1:{free_ports(1)}"
    server = EpochFeedServer(address, workers=1, generation=2)
    (feed,) = _connect(address, [_hello(0)])  # connected, but reads nothing: busy
    server.accept(5.0)
    beats: list[float] = []

    def waiting() -> bool:
        beats.append(time.monotonic())
        return len(beats) >= 5  # told to stop after a few beats

    sent = 0
    while server.send(_record(sent, txns=200), waiting=waiting):
        sent += 1
    assert sent > 0 and len(beats) == 5, "it waited, beating, then gave up as told"
    server.close()
    feed.close()
