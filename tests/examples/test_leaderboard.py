"""The leaderboard example: the engine agrees with the plain-Python reference, vote by vote."""

from __future__ import annotations

import msgspec
import pytest

from epochal.actors.api import App
from epochal.actors.oracle import SerialOracle
from epochal.schemas.codec import decode
from epochal.testing import AppTest
from examples.leaderboard import producer
from examples.leaderboard.app import Removal, Vote, app, make_app, standings
from examples.leaderboard.reference import Reference, Standings, run
from tests.examples.support import summary


def _run(
    application: App,
    votes: list[Vote] | list[producer.Vote] | list[bytes],
    epoch_size: int,
    partitions: int,
    input_partitions: int = 3,
) -> AppTest:
    """The votes produced round-robin over ``input_partitions``, ``epoch_size`` an epoch."""
    t = AppTest(application, partitions)
    for start in range(0, len(votes), epoch_size):
        for i, vote in enumerate(votes[start : start + epoch_size], start):
            value = vote if isinstance(vote, bytes) else msgspec.msgpack.encode(vote)
            t.send("votes", value, partition=i % input_partitions)
        t.run()
    return t


def _check_against_reference(
    t: AppTest, candidates: int, removal_every: int
) -> tuple[Standings, AppTest]:
    """Engine vs reference on the logged order: each verdict, the removals, the standings."""
    logged = [decode(txn.event, Vote) for r in t.command_log for txn in r.txns]
    expected, verdicts = run([(v.phone, v.candidate) for v in logged], candidates, removal_every)
    done = t.outcomes
    assert len(done) == len(verdicts)
    for outcome, verdict in zip(done, verdicts, strict=True):
        assert outcome.committed == (verdict is None), (outcome.reason, verdict)
        if verdict is not None:
            assert outcome.reason == f"InvalidVote: {verdict}"
    removals = [decode(data, Removal) for o in done for _, data in o.egress]
    assert [r.candidate for r in removals] == expected.removed
    assert [r.after_valid_votes for r in removals] == [
        removal_every * (i + 1) for i in range(len(removals))
    ]
    assert standings(t.engine.items(), candidates) == expected
    return expected, t


def _agrees_with_the_oracle(t: AppTest) -> bool:
    return summary(t.results) == summary(SerialOracle(t.app).run(t.command_log))


def test_the_rules_on_a_handmade_sequence() -> None:
    small = make_app(candidates=3, removal_every=3, name="tiny")
    votes = [
        ("5550000001", 1),
        ("5550000002", 2),
        ("5550000002", 3),  # already voted
        ("5550000003", 3),  # 3rd valid vote: all tie at 1, candidate 1 (lowest id) is removed
        ("5550000001", 2),  # its voter may vote again
        ("5550000001", 3),  # ... but only once
        ("5550000004", 1),  # removed
        ("5550000005", 4),  # no such candidate
        ("5550000005", 0),  # no such candidate
    ]
    ballots = [Vote(p, c) for p, c in votes]
    t = _run(small, ballots, epoch_size=4, partitions=2, input_partitions=1)
    expected, _ = _check_against_reference(t, candidates=3, removal_every=3)
    assert expected == Standings(
        top=[2, 3], bottom=[3, 2], trending=[2, 3], votes={1: 1, 2: 2, 3: 1}, removed=[1],
        valid=4, revotes=1,
    )  # fmt: skip
    reasons = [o.reason for o in _run(small, ballots, 4, partitions=1, input_partitions=1).outcomes]
    assert reasons[2] == "InvalidVote: phone 5550000002 already voted for 2"
    assert reasons[6] == "InvalidVote: candidate 1 was removed"
    assert reasons[7] == "InvalidVote: no candidate 4"


def test_a_malformed_phone_is_a_dead_letter_and_json_is_accepted() -> None:
    values = [b'{"phone": "6175550123", "candidate": 4}', b'{"phone": "call me", "candidate": 4}']
    t = _run(app, values, epoch_size=500, partitions=1, input_partitions=1)
    logged = [decode(txn.event, Vote) for r in t.command_log for txn in r.txns]
    assert logged == [Vote("6175550123", 4)]
    assert len(t.dead_letters) == 1 and "phone" in t.dead_letters[0].reason


def test_one_removal_after_20000_valid_votes_matches_the_reference() -> None:
    votes = list(producer.votes(25_000, phones=200_000, candidates=9, seed=5))
    t = _run(app, votes, epoch_size=500, partitions=4)
    expected, t = _check_against_reference(t, candidates=9, removal_every=20_000)
    assert expected.valid > 20_000 and expected.removed == [1] and expected.revotes > 0
    assert len(expected.top) == len(expected.bottom) == len(expected.trending) == 3
    assert _agrees_with_the_oracle(t)


@pytest.mark.parametrize(("partitions", "epoch_size"), [(1, 97), (2, 500), (4, 250)])
def test_many_removals_and_revotes_match_the_reference_and_the_oracle(
    partitions: int, epoch_size: int
) -> None:
    small = make_app(removal_every=300, name="leaderboard-small")
    votes = list(producer.votes(8_000, phones=1_500, candidates=9, seed=5))
    t = _run(small, votes, epoch_size, partitions)
    expected, t = _check_against_reference(t, 9, removal_every=300)
    assert len(expected.removed) >= 5 and expected.revotes > 100
    assert _agrees_with_the_oracle(t)


def test_the_race_stops_removing_at_the_last_candidate() -> None:
    small = make_app(removal_every=150, name="leaderboard-last")
    votes = list(producer.votes(8_000, phones=1_000, candidates=9, seed=5))
    t = _run(small, votes, epoch_size=400, partitions=4)
    expected, _ = _check_against_reference(t, 9, removal_every=150)
    assert len(expected.removed) == 8 and expected.top == expected.bottom == [9]


def test_epoch_boundaries_do_not_change_the_result() -> None:
    votes = list(producer.votes(3_000, phones=800, candidates=9, seed=8))
    small = make_app(removal_every=200, name="leaderboard-epochs")
    digests = {
        _run(small, votes, size, partitions=3, input_partitions=1).digest
        for size in (50, 333, 3_000)
    }
    assert len(digests) == 1
    reference = Reference(9, 200)
    for vote in votes:
        reference.vote(vote.phone, vote.candidate)
    ordered = _run(small, votes, 3_000, partitions=2, input_partitions=1)
    assert standings(ordered.engine.items(), 9) == reference.standings()
