"""S-Store's voting benchmark: validated votes, live leaderboards, and a periodic removal.

Run it with ``epochal run examples.leaderboard.app:app``; votes arrive on
``leaderboard.in.votes`` as ``{"phone": "6175550123", "candidate": 4}``.

The rules (``reference.py`` implements the same rules in plain Python; the tests compare them):

* Candidates are ``1..candidates``. A vote is *valid* if its candidate exists, has not been
  removed, and its phone has not voted yet, or voted for a candidate that was removed since.
  An invalid vote aborts with the reason (it changes nothing).
* A valid vote counts for its candidate, enters the window of the last 100 valid votes, and
  bumps the count of valid votes. When that count reaches a multiple of ``removal_every``, the
  active candidate with the fewest votes (ties: the lowest id) is removed, unless it is the last.
  A removed candidate keeps its final count but leaves every leaderboard.
* The leaderboards, recomputed by every valid vote: *top* = the 3 active candidates with the
  most votes (ties: lowest id first), *bottom* = the 3 with the fewest (ties: lowest id first),
  *trending* = the 3 active candidates with the most votes in the window (at least one; ties:
  lowest id first). Votes in the window for a removed candidate are ignored.

Why this design: every vote declares exactly two keys, its ``Voter`` and the single ``Board``.
The removal needs nothing else: its voters are *not* cleared eagerly (that would need the keys of
thousands of voters, or an interior transaction per voter in the next epoch, which would let
those voters be refused in between). A ``Voter`` is cleared lazily instead: its record names a
candidate, and the ``Board`` says whether that candidate is still in the race. So a removal and
the right to vote again take effect together, in the same transaction, in timestamp order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Annotated

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context
from epochal.actors.windows import CountWindow
from examples.leaderboard.reference import Standings

__all__ = [
    "BOARD",
    "CANDIDATES",
    "REMOVAL_EVERY",
    "TRENDING_WINDOW",
    "Board",
    "InvalidVote",
    "Removal",
    "Vote",
    "VoteStandings",
    "Voter",
    "app",
    "make_app",
    "standings",
]

CANDIDATES = 9
REMOVAL_EVERY = 20_000
TRENDING_WINDOW = 100
BOARD = "board"  # the key of the one Board actor

# Schema-level validation (a malformed phone goes to the dead-letter topic, never runs).
Phone = Annotated[str, msgspec.Meta(pattern=r"^\d{10}$")]


class Vote(msgspec.Struct, frozen=True):
    """One phone's vote for one candidate."""

    phone: Phone
    candidate: int


class Voter(msgspec.Struct):
    """What a phone voted for; 0 = not yet (candidate ids start at 1)."""

    candidate: int = 0


class Board(msgspec.Struct):
    """Everything the vote transaction needs beyond its voter, in one actor."""

    votes: dict[int, int] = msgspec.field(default_factory=dict)  # removed ones keep their count
    removed: list[int] = msgspec.field(default_factory=list)  # in order of removal
    valid: int = 0  # valid votes so far, re-votes included
    revotes: int = 0  # valid votes of phones whose earlier candidate was removed
    recent: CountWindow[int] = msgspec.field(
        default_factory=lambda: CountWindow(size=TRENDING_WINDOW)
    )
    top: list[int] = msgspec.field(default_factory=list)
    bottom: list[int] = msgspec.field(default_factory=list)
    trending: list[int] = msgspec.field(default_factory=list)


class Removal(msgspec.Struct, frozen=True):
    """What ``leaderboard.out.removals`` says when a candidate leaves the race."""

    candidate: int
    votes: int
    after_valid_votes: int


class VoteStandings(msgspec.Struct, frozen=True):
    """What a valid vote writes to ``standings_to``: the leaderboards it left, and the removal it
    made, if any, in one record (a benchmark times each vote by its one output record)."""

    phone: str
    candidate: int
    valid: int
    top: list[int]
    bottom: list[int]
    trending: list[int]
    removal: Removal | None = None


class InvalidVote(ValueError):
    """A vote the rules refuse; the transaction aborts with this reason."""


def make_app(
    candidates: int = CANDIDATES,
    removal_every: int = REMOVAL_EVERY,
    name: str = "leaderboard",
    standings_to: str | None = None,
    client_votes: bool = False,
) -> App:
    """An app with its own thresholds (tests use small ones to see many removals).

    ``standings_to``: an egress that every valid vote writes one :class:`VoteStandings` to, its
    removal included (then nothing goes to ``removals``), so that each vote has exactly one
    output record, its standings or its rejection: what ``bench.workloads.leaderboard`` needs.
    ``client_votes``: a client may also send a vote itself and wait for its outcome
    (``Client(app, ...).submit("vote", Vote(...))``, through the requests topic), as S-Store's
    H-Store baseline does; votes on the topic run as before.
    """
    if candidates < 1 or removal_every < 1:
        raise ValueError("candidates and removal_every must be positive")
    app = App(name)
    # phones are 10 digits: sample the first two, so Voter ranges split evenly
    app.actor(key=str, key_sample=[f"{i:02d}00000000" for i in range(100)])(Voter)
    app.actor(key=str, key_sample=[BOARD])(Board)

    @app.transaction(
        topic="votes",
        event=Vote,
        keys=lambda e: {Voter: [e.phone], Board: [BOARD]},
        aborts_to="rejected",
        client=client_votes,
    )
    def vote(ctx: Context, e: Vote) -> None:
        """Validate, count, maybe remove the weakest candidate, refresh the leaderboards."""
        board, voter = ctx.get(Board, BOARD), ctx.get(Voter, e.phone)
        removed = set(board.removed)
        if not 1 <= e.candidate <= candidates:
            raise InvalidVote(f"no candidate {e.candidate}")
        if e.candidate in removed:
            raise InvalidVote(f"candidate {e.candidate} was removed")
        if voter.candidate and voter.candidate not in removed:
            raise InvalidVote(f"phone {e.phone} already voted for {voter.candidate}")
        if voter.candidate:  # its candidate was removed: the phone votes again
            board.revotes += 1
        voter.candidate = e.candidate
        board.votes[e.candidate] = board.votes.get(e.candidate, 0) + 1
        board.valid += 1
        board.recent.add(e.candidate)
        active = [c for c in range(1, candidates + 1) if c not in removed]
        removal: Removal | None = None
        if board.valid % removal_every == 0 and len(active) > 1:
            loser = min(active, key=lambda c: (board.votes.get(c, 0), c))
            board.removed.append(loser)
            active.remove(loser)
            removal = Removal(loser, board.votes.get(loser, 0), board.valid)
        _rank(board, active)
        if standings_to is not None:
            ctx.egress(
                standings_to,
                VoteStandings(
                    e.phone,
                    e.candidate,
                    board.valid,
                    board.top,
                    board.bottom,
                    board.trending,
                    removal,
                ),
            )
        elif removal is not None:
            ctx.egress("removals", removal)
        ctx.put(e.phone, voter)
        ctx.put(BOARD, board)

    return app


def _rank(board: Board, active: list[int]) -> None:
    """Refresh the three leaderboards of ``board`` over the ``active`` candidates."""
    by_votes = sorted(active, key=lambda c: (board.votes.get(c, 0), c))
    board.bottom = by_votes[:3]
    board.top = sorted(active, key=lambda c: (-board.votes.get(c, 0), c))[:3]
    window = Counter(c for c in board.recent.items if c in active)
    board.trending = sorted(window, key=lambda c: (-window[c], c))[:3]


app = make_app()


def standings(items: Iterable[tuple[object, msgspec.Struct]], candidates: int) -> Standings:
    """The results held by the ``Board`` among an engine's ``items()``."""
    board = next((value for _, value in items if isinstance(value, Board)), Board())
    return Standings(
        top=board.top,
        bottom=board.bottom,
        trending=board.trending,
        votes={c: board.votes.get(c, 0) for c in range(1, candidates + 1)},
        removed=board.removed,
        valid=board.valid,
        revotes=board.revotes,
    )
