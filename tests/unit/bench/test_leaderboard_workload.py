"""The leaderboard workload: its app on a 4-partition engine writes, vote by vote, what its plain
rules (the example's independent reference) write, exactly one record per vote, and ends with
their standings; its backlog has the shape its fields ask for."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from bench.workloads import WORKLOADS
from bench.workloads.base import Backlog, encode
from bench.workloads.leaderboard import CANDIDATES, Leaderboard, PlainLeaderboard
from epochal.actors.api import App
from epochal.testing import AppTest
from examples.leaderboard.app import Vote, Voter, VoteStandings, make_app, standings

VOTES = 3_000
SMALL_INTERVAL = 100  # valid votes between removals: many of them in 3,000 votes
SMALL = make_app(
    CANDIDATES, SMALL_INTERVAL, name="leaderboard_bench_small", standings_to="standings"
)


def _drive(app: App, backlog: Backlog, per_epoch: int = 1_000) -> AppTest:
    """The backlog on one input partition, in order, ``per_epoch`` votes an epoch."""
    test = AppTest(app, partitions=4)
    records = backlog.records
    for start in range(0, len(records), per_epoch):
        for record in records[start : start + per_epoch]:
            test.send(record.topic, record.value, key=record.key)
        test.run()
    return test


@pytest.mark.parametrize(
    ("small", "workload"),
    [(False, Leaderboard(phones=20_000)), (True, Leaderboard(phones=2_500, invalid=0.05))],
    ids=["bench-app", "removal-every-100"],
)
def test_the_app_writes_what_the_plain_rules_write_one_record_per_vote(
    small: bool, workload: Leaderboard
) -> None:
    app = SMALL if small else workload.load_app()
    backlog = workload.backlog(VOTES, partitions=4, seed=7)
    plain = PlainLeaderboard(CANDIDATES, SMALL_INTERVAL) if small else workload.plain()
    expected = [plain(record.topic, record.value) for record in backlog.records]
    assert backlog.measured == len(expected) == VOTES and None not in expected

    test = _drive(app, backlog)
    got: dict[int, tuple[str, bytes]] = {}  # input offset -> what its vote wrote
    for name in workload.outputs:
        for record in test.egress_records(name):
            assert record.source is not None and record.source.offset not in got
            got[record.source.offset] = (
                name,
                record.value if record.committed else encode(record.reason),
            )
    assert sorted(got) == list(range(VOTES))  # every vote wrote exactly one record
    assert [got[offset] for offset in range(VOTES)] == expected
    outputs = Counter(name for name, _ in got.values())
    assert outputs == Counter(out[0] for out in expected if out is not None)
    assert test.egress_records("removals") == []  # removals ride in the vote's one record

    assert {phone: v.candidate for phone, v in test.state(Voter).items()} == plain.state
    final = plain.standings()
    assert standings(test.engine.items(), CANDIDATES) == final
    assert outputs["rejected"] > 0 and len(final.top) == len(final.trending) == 3
    if small:
        removals = [
            r.removal for r in test.egress("standings", VoteStandings) if r.removal is not None
        ]
        assert len(removals) == len(final.removed) >= 10 and final.revotes > 50
        assert [r.after_valid_votes for r in removals] == [
            SMALL_INTERVAL * (i + 1) for i in range(len(removals))
        ]
    else:
        assert final.removed == [] and final.valid > 0.9 * VOTES
    test.check_determinism(partitions=(3,))


def test_the_backlog_is_votes_keyed_by_phone_as_the_fields_ask() -> None:
    workload = Leaderboard(phones=500, invalid=0.2)
    backlog = workload.backlog(2_000, partitions=4, seed=3)
    assert backlog.measured == len(backlog.records) == 2_000 and backlog.topics == ["votes"]
    decoder = msgspec.msgpack.Decoder(Vote)
    cast = [decoder.decode(record.value) for record in backlog.records]
    keys = [record.key for record in backlog.records]
    assert keys == [vote.phone.encode() for vote in cast]
    assert len({vote.phone for vote in cast}) <= 500
    invalid = sum(not 1 <= vote.candidate <= CANDIDATES for vote in cast)
    assert 0.15 < invalid / len(cast) < 0.25
    assert workload.backlog(2_000, partitions=1, seed=3) == backlog  # per seed, not per layout
    assert Leaderboard.topic == "votes"


def test_the_workload_is_registered_with_the_apps_fixed_rules_in_its_parameters() -> None:
    assert WORKLOADS["leaderboard"] is Leaderboard
    parameters = Leaderboard().parameters()
    assert parameters["candidates"] == 25 and parameters["removal_every"] == 20_000
    assert parameters["window"] == 100 and parameters["phones"] == 1_000_000
    with pytest.raises(ValueError, match="share"):
        Leaderboard(invalid=1.5)
    with pytest.raises(ValueError, match="phones"):
        Leaderboard(phones=0)
