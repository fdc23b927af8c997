"""The leaderboard's votes client-ordered: one client sends each vote as its own client
transaction and waits for its outcome before sending the next.

That is the shape of H-Store in S-Store's comparison (PVLDB 2015: 210 batches/s, against
S-Store's 2,200 when the system keeps the votes in order itself): a client that needs its votes
applied in order, with no order kept for it, can have one in flight at a time. Here the client
is epochal's own (``Client.submit`` through the app's requests topic), so each vote pays a whole
round trip: its request to Kafka, the sequencer's epoch, the worker, its reply back
(``read_committed``). The backlog drain (:mod:`bench.drain`) is S-Store's shape: the order is the
log's. The ratio of the two rates is what is set against S-Store's.

The cluster is the drain's default one, on a fresh app name. The first :data:`WARMUP` votes are
not timed (the cluster's start, the client's first connections); every outcome, timed or not, is
held against the plain rules (``PlainLeaderboard``) over the same votes in the same order, and the
``Board`` read at the end (``SERIALIZABLE``) against their standings, so a wrong run is never
reported as a rate.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

from bench.drain import CheckFailed
from bench.open_loop import percentiles
from bench.processes import ClusterProcess, Setup
from bench.workloads.leaderboard import (
    CANDIDATES,
    H_STORE_CLIENT_ORDERED_TPS,
    S_STORE_TPS,
    Leaderboard,
)
from epochal.actors.api import named
from epochal.client import SERIALIZABLE, Client, Outcome
from epochal.config import KafkaConfig
from epochal.errors import QueryError
from examples.leaderboard.app import BOARD, Board, Vote, standings

__all__ = ["WARMUP", "client_ordered", "outcome_differs"]

WARMUP = 5  # votes sent, and checked, before the clock starts
VOTE = "vote"  # the app's vote transaction, as clients name it
TIMEOUT_S = 120.0  # for the first calls: the cluster is still starting


def client_ordered(
    workload: Leaderboard,
    bootstrap: str,
    setup: Setup,
    *,
    port_base: int,
    broker_pid: int | None,
    seed: int,
) -> dict[str, Any]:
    """``workload.client_votes`` votes, one at a time, through a cluster of ``setup``: votes per
    second, latency per vote (submit to outcome), CPU per vote by role; CheckFailed if an outcome
    or the final standings differ from the plain rules'."""
    if workload.client_votes < 1:
        raise ValueError("client_votes: at least one vote to time")
    name = f"leaderboardclient{setup.workers}w{uuid.uuid4().hex[:6]}"
    records = workload.backlog(WARMUP + workload.client_votes, 2 * setup.workers, seed).records
    plain = workload.plain()
    expected = [plain(r.topic, r.value) for r in records]
    ballots = [msgspec.msgpack.decode(r.value, type=Vote) for r in records]
    app = named(workload.load_app(), name)
    latencies: list[float] = []
    with (
        ClusterProcess(setup, name, bootstrap, port_base, broker_pid, app=workload.app) as cluster,
        Client(
            app, f"127.0.0.1:{port_base + 8}", kafka=KafkaConfig(bootstrap), timeout_s=TIMEOUT_S
        ) as client,
    ):
        try:
            outcomes = [client.submit(VOTE, ballot).result() for ballot in ballots[:WARMUP]]
            started = time.monotonic()
            for ballot in ballots[WARMUP:]:
                sent = time.monotonic()
                outcomes.append(client.submit(VOTE, ballot).result())
                latencies.append(time.monotonic() - sent)
            ended = time.monotonic()
            board = client.get(Board, BOARD, isolation=SERIALIZABLE)
        except QueryError as failed:
            raise SystemExit(
                f"{name}: {failed}; its log is {cluster.run_dir / 'run.log'}"
            ) from failed
        time.sleep(2 * cluster.sampler.cpu_interval_s)  # a CPU sample after the last outcome
        cpu = cluster.sampler.cpu_between(started, ended)
        facts = cluster.facts()
    for i, (outcome, wanted) in enumerate(zip(outcomes, expected, strict=True)):
        differs = outcome_differs(outcome, wanted)
        if differs:
            raise CheckFailed(f"{name}: vote {i} {ballots[i]}: {differs}")
    final = standings([(BOARD, board or Board())], CANDIDATES)
    if final != plain.standings():
        raise CheckFailed(
            f"{name}: the Board's standings {final}; the plain rules' {plain.standings()}"
        )
    votes = len(latencies)
    return {
        **facts,
        "votes": votes,
        "warmup": WARMUP,
        "seconds": ended - started,
        "votes_per_s": votes / (ended - started),
        "latency_ms": percentiles([1000 * s for s in latencies]),
        "cpu_us_per_vote": {role: 1e6 * s / votes for role, s in sorted(cpu.items())},
        "anchor_tps": {
            "S-Store": S_STORE_TPS,
            "client-ordered H-Store": H_STORE_CLIENT_ORDERED_TPS,
        },
        "checked": f"{len(outcomes)} outcomes and the final standings = the plain rules'",
    }


def outcome_differs(outcome: Outcome, expected: tuple[str, bytes] | None) -> str:
    """How a vote's outcome differs from what the plain rules wrote for it ("" if it does not):
    its standings means committed, its rejection an abort with the same reason."""
    if expected is None:
        return "the plain rules wrote nothing for it"
    output, value = expected
    want = (True, "") if output == "standings" else (False, msgspec.msgpack.decode(value, type=str))
    got = (outcome.committed, "" if outcome.committed else outcome.reason)
    if got == want:
        return ""
    return f"committed={got[0]} {got[1]!r}; the plain rules: committed={want[0]} {want[1]!r}"
