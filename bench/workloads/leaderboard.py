"""S-Store's leaderboard (PVLDB 2015, its voting benchmark) on ``examples.leaderboard``'s rules.

Each vote names a phone and a candidate. It is valid if the candidate is in the race and the
phone has not voted yet, or voted for a candidate removed since; a valid vote counts, enters the
window of the last 100 valid votes, and every 20,000th valid vote removes the active candidate
with the fewest votes. The leaderboards (top 3, bottom 3, trending 3 over the window) are
recomputed by every valid vote. The rules are the example's (``examples.leaderboard.app``'s
``make_app``), built here with S-Store's 25 candidates and with ``standings_to``: a valid vote
writes its standings (and the removal it made, if any) to ``standings`` in one record, an invalid
one its abort report to ``rejected``, so every vote is one measured transaction with one output.

The app is built once, at import (``epochal run`` loads ``bench.workloads.leaderboard:app``), so
what changes its rules cannot be a flag: 25 candidates, a removal every 20,000 valid votes and a
window of 100 are constants (:data:`CANDIDATES`, :data:`REMOVAL_EVERY`, :data:`TRENDING_WINDOW`),
recorded with the fields in a result's parameters; another race needs another app from
``make_app``. ``phones`` and ``invalid`` only shape the votes, drawn by the example's producer
(``examples.leaderboard.producer.votes``: candidate ``c`` with weight ``c``): ``--phones`` is the
pool they are drawn from (a phone drawn again is refused, unless its candidate was removed), and
``--invalid`` the share naming no candidate (refused). Every vote is one record on ``votes``, keyed
by its phone; there are no load records.

All votes go through the one ``Board`` actor, as through S-Store's single partition: the app runs
serially whatever the cluster. S-Store's 2,200 batches/s are for votes the system keeps in order
itself, against 210 for H-Store, whose client sends each vote as its own transaction and waits
for its outcome before sending the next. The drain is the first shape; the second is
:mod:`bench.client_ordered`: ``--client-votes`` votes (0: none) sent one at a time by one client
with ``Client.submit``, which is why the app takes votes from clients too (``client_votes``:
that changes nothing for votes on the topic).

    epochal bench leaderboard --phones 200000 --invalid 0.05
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec

from bench.workloads.base import Backlog, Record, Workload, encode
from examples.leaderboard.app import TRENDING_WINDOW, Removal, Vote, VoteStandings, make_app
from examples.leaderboard.producer import votes
from examples.leaderboard.reference import Reference, Standings

__all__ = [
    "CANDIDATES",
    "H_STORE_CLIENT_ORDERED_TPS",
    "REMOVAL_EVERY",
    "S_STORE_TPS",
    "TRENDING_WINDOW",
    "Leaderboard",
    "PlainLeaderboard",
    "app",
]

CANDIDATES = 25  # S-Store's contestants
REMOVAL_EVERY = 20_000  # valid votes between two removals
TOPIC = "votes"
S_STORE_TPS = 2_200  # batches/s: the system keeps the votes in order
H_STORE_CLIENT_ORDERED_TPS = 210  # batches/s: the client waits for each vote's outcome

app = make_app(
    CANDIDATES, REMOVAL_EVERY, name="leaderboard_bench", standings_to="standings", client_votes=True
)


@dataclass(frozen=True)
class Leaderboard(Workload):
    """S-Store's leaderboard: votes from a pool of phones, a removal every 20,000 valid votes."""

    name: ClassVar[str] = "leaderboard"
    app: ClassVar[str] = "bench.workloads.leaderboard:app"
    outputs: ClassVar[tuple[str, ...]] = ("standings", "rejected")
    topic: ClassVar[str] = TOPIC
    summary: ClassVar[str] = (
        "S-Store's leaderboard: votes for 25 candidates from a pool of phones, one board; each "
        "valid vote refreshes the top, bottom and trending 3 (last 100 valid votes) and every "
        "20,000th removes the weakest candidate; a phone's second vote is refused."
    )
    anchor: ClassVar[str] = (
        f"S-Store (PVLDB 2015): {S_STORE_TPS:,} batches/s against {H_STORE_CLIENT_ORDERED_TPS} "
        "for H-Store, whose client sends each vote as its own transaction and waits for its "
        "outcome (S-Store's own hardware)"
    )

    phones: int = 1_000_000  # the pool votes are drawn from: the generator's only
    invalid: float = 0.01  # the share of votes for no candidate: the generator's only
    client_votes: int = 500  # sent one at a time by the client-ordered run (0: no such run)

    def __post_init__(self) -> None:
        if not 1 <= self.phones <= 10**10:
            raise ValueError("phones: 1 to 10**10 (phone numbers have 10 digits)")
        if not 0.0 <= self.invalid <= 1.0:
            raise ValueError("invalid: a share, 0 to 1")
        if self.client_votes < 0:
            raise ValueError("client_votes: a number of votes, 0 for none")

    def backlog(self, transactions: int, partitions: int, seed: int) -> Backlog:
        """``transactions`` votes, all measured (one Board: ``partitions`` changes nothing)."""
        if not transactions:  # the generator would still draw its pool of phones first
            return Backlog([], 0)
        drawn = votes(transactions, self.phones, CANDIDATES, seed, self.invalid)
        records = [
            Record(TOPIC, v.phone.encode(), encode(Vote(v.phone, v.candidate))) for v in drawn
        ]
        return Backlog(records, transactions)

    def plain(self) -> PlainLeaderboard:
        return PlainLeaderboard(CANDIDATES, REMOVAL_EVERY)

    def parameters(self) -> dict[str, Any]:
        """The fields and the app's fixed rules, so a result says which race it ran."""
        fixed = {"candidates": CANDIDATES, "removal_every": REMOVAL_EVERY}
        return {**super().parameters(), **fixed, "window": TRENDING_WINDOW}


class PlainLeaderboard:
    """The example's plain-Python reference (code independent of the app), one vote at a time,
    writing what the app writes: the vote's standings, or its rejection with the app's reason.

    ``state`` is each phone's counted vote, as the app's ``Voter`` actors hold it; the board's
    totals are :meth:`standings`."""

    def __init__(self, candidates: int, removal_every: int) -> None:
        self._reference = Reference(candidates, removal_every, TRENDING_WINDOW)
        self.state: dict[str, int] = self._reference.choice
        self._decoder = msgspec.msgpack.Decoder(Vote)

    def __call__(self, topic: str, value: bytes) -> tuple[str, bytes] | None:
        vote = self._decoder.decode(value)
        reference = self._reference
        removed = len(reference.removed)
        refused = reference.vote(vote.phone, vote.candidate)
        if refused is not None:
            return "rejected", encode(f"InvalidVote: {refused}")  # the app's abort reason
        removal: Removal | None = None
        if len(reference.removed) > removed:
            loser = reference.removed[-1]
            removal = Removal(loser, reference.counts[loser], reference.valid)
        now = reference.standings()
        return "standings", encode(
            VoteStandings(
                vote.phone, vote.candidate, now.valid, now.top, now.bottom, now.trending, removal
            )
        )

    def standings(self) -> Standings:
        """The leaderboards, counts and totals so far."""
        return self._reference.standings()
