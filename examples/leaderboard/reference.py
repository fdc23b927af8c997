"""The voting rules in plain Python, serially, with no epochal at all: the tests' reference.

It is written independently of ``app.py`` (a deque for the window, a dict of phones) so that
agreement means something. The rules are those of the ``app.py`` docstring; in short: a vote
is valid if its candidate is in ``1..candidates`` and not removed, and its phone has not voted
or voted for a since-removed candidate; every ``removal_every``-th valid vote removes the active
candidate with the fewest votes (lowest id on ties) unless it is the last one.

Feed it the votes in the order the engine runs them, i.e. the command log's order; the app
emits no interior transactions, so epoch boundaries do not matter.

    >>> ref = Reference(candidates=3, removal_every=2)
    >>> [ref.vote(p, c) for p, c in [("1", 1), ("1", 2), ("2", 2), ("3", 1)]]
    [None, 'phone 1 already voted for 1', None, None]
    >>> ref.standings().removed, ref.standings().top
    ([3], [1, 2])
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Reference", "Standings", "run"]


@dataclass
class Standings:
    """The results: leaderboards, per-candidate counts (removed ones frozen) and totals."""

    top: list[int]
    bottom: list[int]
    trending: list[int]
    votes: dict[int, int]
    removed: list[int] = field(default_factory=list)
    valid: int = 0
    revotes: int = 0


class Reference:
    """One election, one vote at a time."""

    def __init__(self, candidates: int = 9, removal_every: int = 20_000, window: int = 100):
        self.candidates = candidates
        self.removal_every = removal_every
        self.counts = dict.fromkeys(range(1, candidates + 1), 0)
        self.removed: list[int] = []
        self.choice: dict[str, int] = {}  # phone -> the candidate it voted for
        self.recent: deque[int] = deque(maxlen=window)
        self.valid = 0
        self.revotes = 0

    def vote(self, phone: str, candidate: int) -> str | None:
        """Apply one vote; the reason it is refused, or None if it counted."""
        if candidate not in self.counts:
            return f"no candidate {candidate}"
        if candidate in self.removed:
            return f"candidate {candidate} was removed"
        earlier = self.choice.get(phone)
        if earlier is not None and earlier not in self.removed:
            return f"phone {phone} already voted for {earlier}"
        if earlier is not None:
            self.revotes += 1
        self.choice[phone] = candidate
        self.counts[candidate] += 1
        self.recent.append(candidate)
        self.valid += 1
        active = self._active()
        if self.valid % self.removal_every == 0 and len(active) > 1:
            fewest = min(self.counts[c] for c in active)
            self.removed.append(min(c for c in active if self.counts[c] == fewest))
        return None

    def _active(self) -> list[int]:
        return [c for c in self.counts if c not in self.removed]

    def standings(self) -> Standings:
        active = self._active()
        top = sorted(active, key=lambda c: self.counts[c], reverse=True)  # stable: low id first
        bottom = sorted(active, key=lambda c: self.counts[c])
        window = Counter(c for c in self.recent if c not in self.removed)
        trending = sorted(sorted(window), key=lambda c: window[c], reverse=True)
        return Standings(
            top[:3],
            bottom[:3],
            trending[:3],
            dict(self.counts),
            list(self.removed),
            self.valid,
            self.revotes,
        )


def run(
    votes: Iterable[tuple[str, int]], candidates: int = 9, removal_every: int = 20_000
) -> tuple[Standings, list[str | None]]:
    """The final standings and each vote's verdict (None = counted, else the reason)."""
    reference = Reference(candidates, removal_every)
    verdicts = [reference.vote(phone, candidate) for phone, candidate in votes]
    return reference.standings(), verdicts
