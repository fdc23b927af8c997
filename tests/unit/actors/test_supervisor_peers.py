"""Workers fail themselves when a peer is lost: a closed connection, a frame they cannot handle,
a peer silent for longer than the bound. A connection that never said Hello is not a peer."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import msgspec
import pytest

from epochal.actors.transport import DoneFrame, HelloFrame, Peers, ReadsFrame, TransportError
from tests.conftest import free_port_pair

BOUND_S = 0.4
GENERATION = 3


def _framed(value: object) -> bytes:
    payload = msgspec.msgpack.encode(value)
    return struct.pack(">I", len(payload)) + payload


@asynccontextmanager
async def _worker_0(on_frame: Callable[[ReadsFrame | DoneFrame], None]) -> AsyncIterator[Peers]:
    """Worker 0's peers; the test plays worker 1 with raw sockets (its server only accepts)."""
    base = free_port_pair()
    accepted: list[asyncio.StreamWriter] = []
    fake = await asyncio.start_server(lambda r, w: accepted.append(w), "127.0.0.1", base + 1)
    peers = Peers(0, [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"], GENERATION, on_frame,
                  failure_timeout_s=BOUND_S)  # fmt: skip
    await peers.start()
    try:
        yield peers
    finally:
        await peers.close()
        for writer in accepted:
            writer.close()
        fake.close()
        await fake.wait_closed()


async def _connect(
    peers: Peers, *chunks: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(*peers.addresses[0].split(":"))
    for chunk in chunks:
        writer.write(chunk)
    await writer.drain()
    return reader, writer


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 10))


def test_garbage_from_a_connection_that_never_said_hello_only_closes_it() -> None:
    async def test() -> None:
        async with _worker_0(lambda frame: None) as peers:
            for garbage in (b"\x00\x00\x00\x03\xc1\xc1\xc1", b"\xff\xff\xff\xff" + b"x" * 64,
                            _framed(ReadsFrame(GENERATION, 0, []))):  # fmt: skip
                reader, writer = await _connect(peers, garbage)
                assert await asyncio.wait_for(reader.read(), 2) == b""  # closed by worker 0
                writer.close()
            hello = _framed(HelloFrame(GENERATION - 1, 1))
            reader, writer = await _connect(peers, hello, b"\x00\x00\x00\x01\xc1")
            assert await asyncio.wait_for(reader.read(), 2) == b""
            writer.close()
            assert not peers.failed.done()

    _run(test)


@pytest.mark.parametrize(
    "frame",
    [b"\x00\x00\x00\x03\xc1\xc1\xc1", _framed(["z", GENERATION]),
     _framed(DoneFrame(GENERATION, 0, 1, []))],
    ids=["undecodable", "unknown-frame", "handler-raises"],
)  # fmt: skip
def test_a_frame_from_a_peer_that_cannot_be_handled_fails_the_worker(frame: bytes) -> None:
    def on_frame(frame: ReadsFrame | DoneFrame) -> None:
        raise KeyError("no such partition")

    async def test() -> None:
        async with _worker_0(on_frame) as peers:
            _, writer = await _connect(peers, _framed(HelloFrame(GENERATION, 1)), frame)
            with pytest.raises(TransportError, match="could not be handled") as caught:
                await asyncio.wait_for(asyncio.shield(peers.failed), 2)
            assert caught.value.context["peer"] == 1
            writer.close()

    _run(test)


def test_a_peer_silent_for_longer_than_the_bound_fails_the_worker() -> None:
    async def test() -> None:
        async with _worker_0(lambda frame: None) as peers:
            _, writer = await _connect(peers, _framed(HelloFrame(GENERATION, 1)))  # then silent
            started = asyncio.get_running_loop().time()
            with pytest.raises(TransportError, match="silent"):
                await asyncio.wait_for(asyncio.shield(peers.failed), 2)
            assert asyncio.get_running_loop().time() - started < BOUND_S + 0.3
            writer.close()

    _run(test)


def test_a_peer_that_never_says_hello_fails_the_worker_after_the_bound() -> None:
    async def test() -> None:
        async with _worker_0(lambda frame: None) as peers:
            with pytest.raises(TransportError, match="silent"):
                await asyncio.wait_for(asyncio.shield(peers.failed), 2)

    _run(test)


def test_idle_peers_keep_each_other_alive_and_close_without_leftover_tasks() -> None:
    async def test() -> None:
        base = free_port_pair()
        addresses = [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
        before = asyncio.all_tasks()
        pair = [Peers(w, addresses, GENERATION, failure_timeout_s=BOUND_S) for w in (0, 1)]
        await asyncio.gather(*(p.start() for p in pair))
        await asyncio.sleep(4 * BOUND_S)  # idle: only heart-beats flow
        assert not any(p.failed.done() for p in pair)
        for p in pair:
            await p.close()
        # nothing is left for the loop's end to cancel (a cancelled stream handler logs a
        # CancelledError traceback on Python 3.11.7)
        assert asyncio.all_tasks() - before == set()

    _run(test)
