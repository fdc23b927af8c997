from __future__ import annotations

from epochal.log.snapshot_schedule import SnapshotSchedule


def test_a_snapshot_is_due_by_time_or_by_count_and_never_when_off() -> None:
    by_time = SnapshotSchedule(interval_ms=1000)
    assert [by_time.due(t) for t in (999, 1000)] == [False, True]
    by_time.logged(1000, snapshot=True)
    assert not by_time.due(1999) and by_time.due(2000)
    by_count = SnapshotSchedule(interval_ms=0, every_epochs=3)
    due = []
    for t in range(7):
        due.append(by_count.due(t))
        by_count.logged(t, due[-1])
    assert due == [False, False, True, False, False, True, False]
    assert not any(SnapshotSchedule(0, 0).due(t) for t in (0, 10**9))


def test_an_idle_input_gets_one_snapshot_epoch_for_what_changed_and_then_none() -> None:
    schedule = SnapshotSchedule(interval_ms=1000)
    schedule.logged(1000, snapshot=True)
    assert not schedule.idle_due(5000)  # nothing logged since: nothing to snapshot
    schedule.logged(1100, snapshot=False)
    assert not schedule.idle_due(1500) and schedule.idle_due(2000)
    schedule.logged(2000, snapshot=True)
    assert not schedule.idle_due(9000)
