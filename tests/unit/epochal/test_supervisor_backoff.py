"""Rollbacks back off when failures follow each other quickly, and recover at once otherwise."""

from __future__ import annotations

import pytest

from epochal.supervisor import RollbackBackoff


def _backoff() -> RollbackBackoff:
    return RollbackBackoff(initial_s=0.5, max_s=30.0, reset_after_s=60.0)


def test_a_first_failure_rolls_back_at_once() -> None:
    assert _backoff().delay(now=1000.0) == 0.0


def test_failures_in_a_row_double_the_wait_up_to_the_maximum() -> None:
    backoff, now, waits = _backoff(), 0.0, []
    for _ in range(10):
        wait = backoff.delay(now)
        waits.append(wait)
        now += wait + 1.0  # the cluster fails again one second after each rollback
    assert waits == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert backoff.streak == 9


def test_a_quiet_period_after_the_rollback_resets_the_streak() -> None:
    backoff = _backoff()
    assert [backoff.delay(t) for t in (0.0, 1.0, 2.0)] == [0.0, 0.5, 1.0]
    # the last rollback happened at 3.0 (2.0 + its wait); 60 s later the cluster was stable
    assert backoff.delay(3.0 + 60.0) == 0.0
    assert backoff.delay(3.0 + 61.0) == 0.5


@pytest.mark.parametrize("gap_s", [59.0, 59.9])
def test_the_quiet_period_counts_from_the_rollback_not_from_the_failure(gap_s: float) -> None:
    backoff = _backoff()
    backoff.delay(0.0)
    assert backoff.delay(1.0) == 0.5  # rolled back at 1.5
    assert backoff.delay(1.5 + gap_s) == 1.0
