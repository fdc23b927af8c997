"""Every failure is detected within the bound and rolls the cluster back (docs/concepts.md), with
real processes on the real broker: a frame a worker cannot handle, a stopped (SIGSTOP) worker
or sequencer, and ``kill -9`` of the supervisor alone (its children die with it; a new run then
applies each input once). Each run ends with the serial oracle's result. And a member whose
loop blocks leaves the cluster's group within the bound."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from epochal.actors.transport import HelloFrame
from epochal.log.client import KafkaClients
from epochal.log.membership import (
    GroupMember,
    GroupObserver,
    MemberName,
    Role,
    members_group,
    while_member,
)
from tests.integration.cluster import BOUND_MS, SLACK_S, Cluster, gone, wait_until

pytestmark = pytest.mark.integration


def _framed(value: object) -> bytes:
    payload = msgspec.msgpack.encode(value)
    return struct.pack(">I", len(payload)) + payload


def test_a_frame_a_worker_cannot_handle_rolls_the_cluster_back(cluster: Cluster) -> None:
    port_base = cluster.start(workers=2)
    cluster.produce(300, deposits=True)
    assert len(cluster.wait_for_egress()) == cluster.transfers
    generation = cluster.generation()
    # a client that says Hello as worker 1 of this generation is a peer; then an undecodable frame
    with socket.create_connection(("127.0.0.1", port_base)) as peer:
        peer.sendall(_framed(HelloFrame(generation, 1)) + b"\x00\x00\x00\x03\xc1\xc1\xc1")
        cluster.produce(300)  # worker 0 notices at its next epoch at the latest
        wait_until(lambda: cluster.generation() > generation, 15, "no rollback", log=cluster.log)
    assert "a frame from a peer could not be handled" in cluster.log()
    cluster.produce(300)
    cluster.check_against_the_oracle()
    cluster.stop()


@pytest.mark.parametrize("role", ["worker", "sequencer"])
def test_a_stopped_process_is_detected_within_the_bound_and_rolled_back(
    cluster: Cluster, role: str
) -> None:
    cluster.start(workers=2)
    cluster.produce(300, deposits=True)
    assert len(cluster.wait_for_egress()) == cluster.transfers
    time.sleep(1.0)  # idle: nothing but the group (and peer heart-beats) can tell
    generation, status = cluster.generation(), cluster.status()
    pid = int(status["workers"][1] if role == "worker" else status["sequencer"])
    stopped = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        detected = wait_until(lambda: cluster.generation() > generation, 20, "no rollback",
                         log=cluster.log)  # fmt: skip
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGCONT)  # the supervisor did not kill it: let the test end
    print(f"{role} stopped: rolled back after {detected - stopped:.2f} s (bound {BOUND_MS} ms)")
    assert detected - stopped < BOUND_MS / 1000 + SLACK_S
    assert gone(pid)
    cluster.produce(300)
    cluster.check_against_the_oracle()
    cluster.stop()


def test_kill_9_of_the_supervisor_kills_its_children_and_a_new_run_applies_each_input_once(
    cluster: Cluster,
) -> None:
    cluster.start(workers=2)
    cluster.produce(2000, deposits=True)
    time.sleep(0.5)  # mid-way
    status = cluster.status()
    children = [int(status["sequencer"]), *(int(w) for w in status["workers"])]
    os.kill(int(status["supervisor"]), signal.SIGKILL)
    cluster.processes[-1].wait(10)
    wait_until(lambda: all(gone(pid) for pid in children), 2.0, "children outlived the supervisor")

    cluster.start(workers=2)
    cluster.produce(500)
    cluster.check_against_the_oracle()
    cluster.stop()


def test_a_member_whose_loop_blocks_leaves_the_group_within_the_bound(
    kafka: KafkaClients, topic_factory: Callable[..., str]
) -> None:
    """An asyncio loop that stops turning (here: a blocking sleep) stops polling its member;
    the group loses it within the bound although the process is alive and heart-beating."""
    app_name, topic = f"hang{uuid.uuid4().hex[:8]}", topic_factory()
    name = MemberName("t", Role.WORKER, 0, 1)
    member = GroupMember(kafka, app_name, name, BOUND_MS, topic)
    observer = GroupObserver(kafka, members_group(app_name), interval_s=0.1)
    seen: dict[bool, float] = {}  # present or not -> when first observed so

    def observe() -> None:
        """Absence counts only after presence: while the member joins, a new group is briefly
        Empty (settled, with no members), as the product's own watch allows for."""
        while False not in seen:
            now = time.monotonic()
            view = observer.view(now)
            if view is not None and view.state.settled:
                present = name.client_id in view.members
                if present or True in seen:
                    seen.setdefault(present, now)
            time.sleep(0.05)

    async def work() -> float:
        while True not in seen:
            await asyncio.sleep(0.05)
        blocked = time.monotonic()
        time.sleep(BOUND_MS / 1000 + SLACK_S + 1)  # the loop blocks: no poll, no heart-beat
        return blocked

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    blocked = asyncio.run(asyncio.wait_for(while_member(member, work()), 30))
    watcher.join(5)
    print(f"blocked loop: left the group after {seen[False] - blocked:.2f} s")
    assert seen[False] - blocked < BOUND_MS / 1000 + SLACK_S


def test_a_group_watch_that_dies_or_hangs_is_replaced_and_the_cluster_carries_on(
    cluster: Cluster,
) -> None:
    """librdkafka can abort the process that describes the group (its issue #4605): that is a
    child of its own, and the supervisor replaces it without a rollback; a silent one too."""
    cluster.start(workers=1)
    cluster.produce(200, deposits=True)
    for kill, said in [(signal.SIGABRT, "exited code=-6"), (signal.SIGSTOP, "silent")]:
        watch = int(cluster.status()["watch"])
        cmdline = Path(f"/proc/{watch}/cmdline")
        wait_until(lambda c=cmdline: c.read_bytes().startswith(b"epochal: watch of "), 10, "title")
        os.kill(watch, kill)  # SIGABRT: what a failed assertion in librdkafka does
        wait_until(lambda w=watch: cluster.status()["watch"] != w, 10, "no new watch")
        assert f"group watch {said}" in cluster.log()
    cluster.produce(200)
    cluster.check_against_the_oracle()
    assert cluster.generation() == 1
    cluster.stop()


def test_a_new_supervisor_replaces_the_processes_an_earlier_run_left(cluster: Cluster) -> None:
    """A hung supervisor (SIGSTOP) keeps its children alive: a new run of the app kills them
    all and applies each input once."""
    cluster.start(workers=2)
    cluster.produce(300, deposits=True)
    earlier = cluster.status()
    pids = [earlier["supervisor"], earlier["sequencer"], earlier["watch"], *earlier["workers"]]
    os.kill(earlier["supervisor"], signal.SIGSTOP)
    cluster.start(workers=2)
    assert all(gone(pid) for pid in pids)
    assert "replaced an earlier run" in cluster.log()
    cluster.produce(200)
    cluster.check_against_the_oracle()
    cluster.stop()
