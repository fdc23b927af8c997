"""The supervisor's rule over the cluster's Kafka group (pure), and the names members go by."""

from __future__ import annotations

import pytest

from epochal.log.membership import (
    GroupState,
    GroupView,
    LoopPulse,
    MemberName,
    MemberWatch,
    Role,
)

W0 = MemberName("abc123", Role.WORKER, 0, 2)
W1 = MemberName("abc123", Role.WORKER, 1, 2)
SEQ = MemberName("abc123", Role.SEQUENCER, 0, 1)


def _view(state: GroupState, *members: MemberName | str) -> GroupView:
    return GroupView(state, frozenset(m if isinstance(m, str) else m.client_id for m in members))


def _watch(now: float = 0.0) -> MemberWatch:
    watch = MemberWatch(startup_timeout_s=10.0)
    for name in (SEQ, W0, W1):
        watch.expect(name, now)
    return watch


@pytest.mark.parametrize("name", [W0, W1, SEQ, MemberName("r", Role.WORKER, 12, 345)])
def test_a_member_name_survives_its_client_id(name: MemberName) -> None:
    assert MemberName.parse(name.client_id) == name


@pytest.mark.parametrize(
    "client_id",
    ["rdkafka", "epochal.abc.worker.1", "epochal.abc.gardener.1.g2", "epochal.abc.worker.x.g2",
     "epochal.abc.worker.1.2", "other.abc.worker.1.g2"],
)  # fmt: skip
def test_clients_that_are_not_members_have_no_name(client_id: str) -> None:
    assert MemberName.parse(client_id) is None


def test_all_present_is_no_failure() -> None:
    watch = _watch()
    assert watch.judge(_view(GroupState.STABLE, SEQ, W0, W1), now=1.0) == []


def test_a_member_seen_then_absent_from_a_stable_group_has_failed() -> None:
    watch = _watch()
    watch.judge(_view(GroupState.STABLE, SEQ, W0, W1), now=1.0)
    lost = watch.judge(_view(GroupState.STABLE, SEQ, W0), now=2.0)
    assert [failure.name for failure in lost] == [W1]
    assert "left the group" in lost[0].reason


def test_an_empty_group_is_settled_too() -> None:
    watch = _watch()
    watch.judge(_view(GroupState.STABLE, SEQ, W0, W1), now=1.0)
    assert {f.name for f in watch.judge(_view(GroupState.EMPTY), now=2.0)} == {SEQ, W0, W1}


@pytest.mark.parametrize(
    "state", [GroupState.REBALANCING, GroupState.UNKNOWN, GroupState.UNREACHABLE]
)
def test_a_rebalance_in_progress_or_an_unknown_state_is_not_judged(state: GroupState) -> None:
    watch = _watch()
    watch.judge(_view(GroupState.STABLE, SEQ, W0, W1), now=1.0)
    assert watch.judge(_view(state, SEQ), now=2.0) == []
    assert [f.name for f in watch.judge(_view(GroupState.STABLE, SEQ, W0), now=3.0)] == [W1]


def test_a_member_that_never_joins_fails_after_the_startup_bound_only() -> None:
    watch = _watch(now=100.0)
    assert watch.judge(_view(GroupState.STABLE, SEQ, W0), now=109.0) == []
    lost = watch.judge(_view(GroupState.REBALANCING, SEQ, W0), now=111.0)
    assert [f.name for f in lost] == [W1]
    assert "never joined" in lost[0].reason


def test_members_of_another_generation_or_run_do_not_count() -> None:
    watch = _watch()
    older = MemberName("abc123", Role.WORKER, 1, 1)
    earlier_run = MemberName("zzz999", Role.WORKER, 1, 2)
    assert [
        f.name for f in watch.judge(_view(GroupState.STABLE, SEQ, W0, older, earlier_run), now=11.0)
    ] == [W1]


def test_a_new_generation_replaces_the_old_expectation() -> None:
    watch = _watch()
    watch.judge(_view(GroupState.STABLE, SEQ, W0, W1), now=1.0)
    next_w0, next_w1 = (MemberName("abc123", Role.WORKER, w, 3) for w in (0, 1))
    watch.expect(next_w0, now=2.0)
    watch.expect(next_w1, now=2.0)
    # the old generation still lingers (killed members expire later); the new one is joining
    assert watch.judge(_view(GroupState.STABLE, SEQ, W0, W1), now=3.0) == []
    assert watch.judge(_view(GroupState.STABLE, SEQ, next_w0, next_w1), now=4.0) == []
    assert [f.name for f in watch.judge(_view(GroupState.STABLE, SEQ, next_w1), now=5.0)] == [
        next_w0
    ]


def test_a_smaller_cluster_forgets_the_workers_it_no_longer_has() -> None:
    watch = _watch()
    watch.retain(Role.WORKER, 1)
    assert watch.judge(_view(GroupState.STABLE, SEQ, W0), now=11.0) == []


def test_a_loop_pulse_gives_the_startup_bound_then_the_failure_bound() -> None:
    pulse = LoopPulse(bound_s=2.0, startup_s=30.0, now=0.0)
    assert pulse.alive(29.0) and not pulse.alive(30.0)
    pulse.beat(29.5)
    assert pulse.alive(31.0) and not pulse.alive(31.6)


def test_all_seen_once_every_expected_member_has_joined_and_again_after_a_new_generation() -> None:
    watch = _watch()
    assert not MemberWatch(startup_timeout_s=1.0).all_seen()  # nothing expected yet
    watch.judge(_view(GroupState.REBALANCING, SEQ, W0), now=1.0)
    assert not watch.all_seen()
    watch.judge(_view(GroupState.STABLE, SEQ, W0, W1), now=2.0)
    assert watch.all_seen()
    watch.expect(MemberName("abc123", Role.WORKER, 1, 3), now=3.0)  # a rollback's new worker
    assert not watch.all_seen()
