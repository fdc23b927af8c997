"""Status rates: per second over a window, steady across a restart of the counters."""

from __future__ import annotations

from epochal.log.status import Rates


def _clock(times: list[float]) -> Rates:
    return Rates(window_s=5.0, clock=iter(times).__next__)


def test_the_first_sample_has_no_rate() -> None:
    assert _clock([0.0]).of(epochs=100) == {"epochs": 0.0}


def test_a_rate_is_over_the_whole_window() -> None:
    rates = _clock([0.0, 1.0, 2.0, 3.0])
    rates.of(epochs=0)
    rates.of(epochs=50)
    rates.of(epochs=50)
    assert rates.of(epochs=60) == {"epochs": 20.0}  # 60 in 3 s


def test_samples_older_than_the_window_are_dropped() -> None:
    rates = _clock([0.0, 1.0, 7.0, 8.0])
    rates.of(epochs=0)
    rates.of(epochs=1000)
    assert rates.of(epochs=1000) == {"epochs": 0.0}  # alone in its window again
    assert rates.of(epochs=1010) == {"epochs": 10.0}


def test_a_counter_that_went_down_counts_no_negative_rate() -> None:
    rates = _clock([0.0, 1.0])
    rates.of(transactions=500)
    assert rates.of(transactions=3) == {"transactions": 0.0}
