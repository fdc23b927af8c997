"""The leaderboard's client-ordered run: votes a client submits run as the same votes on the
topic do, the run's check tells a right outcome from a wrong one, and ``epochal bench
leaderboard`` runs it beside the drain, never with ``--quick``."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec
import pytest

from bench import cli
from bench.client_ordered import outcome_differs
from bench.processes import Setup
from bench.workloads.leaderboard import Leaderboard
from bench.workloads.ycsbt import YcsbT
from epochal.client import Outcome
from epochal.testing import AppTest
from examples.leaderboard.app import Board, Vote, make_app, standings

BALLOTS = [  # candidates 1..3, a removal every 3rd valid vote
    Vote("5550000001", 1),
    Vote("5550000002", 2),
    Vote("5550000002", 3),  # already voted
    Vote("5550000003", 3),  # 3rd valid: candidate 1 is removed
    Vote("5550000001", 2),  # its voter votes again
    Vote("5550000004", 1),  # removed
    Vote("5550000005", 4),  # no such candidate
    Vote("5550000006", 2),
]


def _on_the_topic(client_votes: bool) -> AppTest:
    t = AppTest(make_app(3, 3, name="tiny", client_votes=client_votes), partitions=2)
    for ballot in BALLOTS:
        t.send("votes", ballot)
        t.run()
    return t


def test_client_votes_keeps_the_topic_path_and_runs_submitted_votes_the_same() -> None:
    before, after = _on_the_topic(False), _on_the_topic(True)
    verdicts = [(o.committed, o.reason) for o in before.outcomes]
    assert [(o.committed, o.reason) for o in after.outcomes] == verdicts
    assert after.digest == before.digest
    assert sum(committed for committed, _ in verdicts) == 5

    submitted = AppTest(make_app(3, 3, name="tiny", client_votes=True), partitions=2)
    ids = []
    for ballot in BALLOTS:  # one at a time, as the client-ordered run sends them
        ids.append(submitted.request("vote", ballot))
        submitted.run()
    replies = submitted.replies
    assert [(replies[i].committed, replies[i].reason) for i in ids] == verdicts
    board = submitted.get(Board, "board")
    assert board is not None and board.removed == [1]
    assert standings(submitted.engine.items(), 3) == standings(before.engine.items(), 3)

    refused = AppTest(make_app(3, 3, name="tiny"), partitions=2)  # without the option
    refused.request("vote", BALLOTS[0])
    refused.run()
    assert refused.replies == {} and len(refused.dead_letters) == 1


def test_each_submitted_vote_of_the_bench_app_matches_the_plain_rules() -> None:
    workload = Leaderboard(phones=40, invalid=0.2)  # many second votes, many for no candidate
    records = workload.backlog(120, partitions=2, seed=5).records
    plain = workload.plain()
    expected = [plain(r.topic, r.value) for r in records]
    t = AppTest(workload.load_app(), partitions=2)
    ids = []
    for record in records:
        ids.append(t.request("vote", msgspec.msgpack.decode(record.value, type=Vote)))
        t.run()
    outcomes = [t.replies[i] for i in ids]
    assert {o.committed for o in outcomes} == {True, False}
    assert [outcome_differs(o, e) for o, e in zip(outcomes, expected, strict=True)] == [""] * 120

    refused = next(i for i, o in enumerate(outcomes) if not o.committed)
    accepted = next(i for i, o in enumerate(outcomes) if o.committed)
    assert "committed=True" in outcome_differs(outcomes[accepted], expected[refused])
    assert "committed=False" in outcome_differs(outcomes[refused], expected[accepted])
    other = Outcome("x", False, 1, 0, "InvalidVote: another reason", None)
    assert "another reason" in outcome_differs(other, expected[refused])
    assert "wrote nothing" in outcome_differs(outcomes[accepted], None)


def _args(quick: bool, workers: list[int]) -> argparse.Namespace:
    return argparse.Namespace(quick=quick, workers=workers, port_base=20_000, seed=3)


def test_the_leaderboard_runs_client_ordered_on_the_fewest_workers_but_not_quick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[Leaderboard, Setup, int]] = []

    def run(workload: Leaderboard, bootstrap: str, setup: Setup, **kw: Any) -> dict[str, Any]:
        calls.append((workload, setup, kw["port_base"]))
        return {"votes_per_s": 40.0}

    monkeypatch.setattr(cli, "client_ordered", run)
    board = Leaderboard(client_votes=200)
    point = cli.Point(board, epoch_records=300)  # its clusters' settings go to the run too
    assert cli._client_ordered(point, _args(False, [2, 1]), "b:1", None) == {
        "client_ordered": {"votes_per_s": 40.0}
    }
    assert [(s.workers, s.epoch_records, port) for _, s, port in calls] == [(1, 300, 22_000)]
    assert calls[0][0] is board
    assert cli._client_ordered(point, _args(True, [1]), "b:1", None) == {}
    no_votes = cli.Point(Leaderboard(client_votes=0))
    assert cli._client_ordered(no_votes, _args(False, [1]), "b:1", None) == {}
    assert cli._client_ordered(cli.Point(YcsbT()), _args(False, [1]), "b:1", None) == {}
    assert len(calls) == 1
    with pytest.raises(ValueError, match="client_votes"):
        Leaderboard(client_votes=-1)
