"""Peers on loopback: a flush to a peer that went away is a TransportError, never a crash; a
worker does not wait to reach a peer once the generation is over for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import msgspec
import pytest
import uvloop

from epochal.actors.framing import framed
from epochal.actors.transport import HeartbeatFrame, HelloFrame, Peers, TransportError
from tests.conftest import free_ports


def test_a_flush_after_a_peer_went_away_says_so() -> None:
    async def scenario() -> None:
        base = free_ports(2)
        addresses = [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
        one, two = Peers(0, addresses, 1), Peers(1, addresses, 1)
        await asyncio.gather(one.start(), two.start())
        await two.close()
        try:
            deadline = time.monotonic() + 5
            while not one._writers[1].is_closing():  # the loss reaches the outbound connection
                assert time.monotonic() < deadline, "the connection to the gone peer stays open"
                await asyncio.sleep(0.01)
            one.send(1, HeartbeatFrame(1))
            with pytest.raises(TransportError, match="a peer went away"):
                await one.flush()
        finally:
            await one.close()

    uvloop.run(scenario())  # the workers' loop: it raises RuntimeError writing to a lost peer


async def _peer_says_hello_and_goes(port: int, stop: asyncio.Event) -> None:
    """Worker 0 connected, said Hello and went (stopped early, or crashed)."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(framed(msgspec.msgpack.encode(HelloFrame(1, 0))))
    await writer.drain()
    writer.close()


async def _worker_is_told_to_stop(port: int, stop: asyncio.Event) -> None:
    stop.set()


@pytest.mark.parametrize(
    ("end", "said"),
    [
        (_peer_says_hello_and_goes, "a peer went away"),
        (_worker_is_told_to_stop, "stopped before a peer was reached"),
    ],
)
def test_a_worker_stops_waiting_for_a_peer_once_its_generation_is_over(
    end: Callable[[int, asyncio.Event], Awaitable[None]], said: str
) -> None:
    """Worker 1 retries worker 0's port (nothing listens there) until the connect timeout, or
    at once when a peer was lost meanwhile or it is told to stop."""

    async def scenario() -> None:
        base = free_ports(2)
        addresses = [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
        stop = asyncio.Event()
        two = Peers(1, addresses, 1, connect_timeout_s=20, stopping=stop.is_set)
        starting = asyncio.ensure_future(two.start())
        try:
            await _until_listening(base + 1)
            await end(base + 1, stop)
            began = time.monotonic()
            with pytest.raises(TransportError, match=said):
                await asyncio.wait_for(starting, 10)
            assert time.monotonic() - began < 2
        finally:
            await two.close()

    uvloop.run(scenario())


async def _until_listening(port: int) -> None:
    deadline = time.monotonic() + 5
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            await asyncio.sleep(0.01)
            continue
        writer.close()  # not a peer: it never says Hello
        return
