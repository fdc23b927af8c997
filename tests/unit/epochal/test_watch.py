"""The broker's absences as the supervisor sees them: one change when it goes, one when it is
back, whatever the views say in between."""

from __future__ import annotations

from epochal.log.membership import GroupState
from epochal.watch import BrokerOutage, OutageChange

AWAY, STABLE, REBALANCING = GroupState.UNREACHABLE, GroupState.STABLE, GroupState.REBALANCING


def test_one_change_when_the_broker_goes_and_one_when_it_is_back() -> None:
    outage = BrokerOutage()
    views = [(0, STABLE), (1, AWAY), (2, AWAY), (3, AWAY), (4, REBALANCING), (5, STABLE)]
    views += [(6, AWAY), (6.5, STABLE)]
    seen = [(now, outage.observe(state, now)) for now, state in views]
    assert [(now, change) for now, change in seen if change is not None] == [
        (1, OutageChange(reachable=False)),
        (4, OutageChange(reachable=True, away_s=3.0)),
        (6, OutageChange(reachable=False)),
        (6.5, OutageChange(reachable=True, away_s=0.5)),
    ]
    assert not outage.away


def test_the_outage_lasts_from_the_first_view_that_says_so() -> None:
    outage = BrokerOutage()
    outage.observe(AWAY, now=10.0)
    assert outage.away and outage.since == 10.0
    outage.observe(AWAY, now=12.0)
    assert outage.since == 10.0
