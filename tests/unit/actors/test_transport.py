"""Peers on loopback: a flush to a peer that went away is a TransportError, never a crash."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop

from epochal.actors.transport import HeartbeatFrame, Peers, TransportError
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
