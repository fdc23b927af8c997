"""TSpoon's sustainable-throughput search, phase by phase: the rate grows by half while a phase
keeps up within 20x the unloaded p99; the last rate that passed is the sustainable one."""

from __future__ import annotations

from bench.steady import GROWTH, SLOWER_BOUND, UNLOADED_RATE, Search


def _p99(ms: float) -> dict[str, float]:
    return {"p50": ms / 2, "p99": ms, "p99.9": ms, "max": ms}


def test_the_last_rate_that_passed_is_sustainable_and_the_first_phase_is_the_unloaded_one() -> None:
    search = Search()
    rates = []
    for p99 in (10.0, 12.0, 15.0, 10.0 * SLOWER_BOUND + 1):
        rates.append(search.rate)
        if not search.record(sent=search.rate, behind=0, missing=0, latency=_p99(p99)):
            break
    assert rates == [
        UNLOADED_RATE,
        int(UNLOADED_RATE * GROWTH),
        int(int(UNLOADED_RATE * GROWTH) * GROWTH),
        rates[3],
    ]
    assert search.unloaded == 10.0 and search.sustainable == rates[2]
    assert [p["passed"] for p in search.phases] == [True, True, True, False]


def test_a_phase_that_falls_behind_or_loses_a_transaction_fails_whatever_its_latency() -> None:
    behind = Search()
    assert behind.record(sent=200, behind=0, missing=0, latency=_p99(10.0))
    assert not behind.record(sent=300, behind=behind.rate + 1, missing=0, latency=_p99(10.0))
    assert behind.sustainable == UNLOADED_RATE

    lost = Search()
    assert not lost.record(sent=200, behind=0, missing=1, latency=_p99(10.0))
    assert lost.sustainable == 0 and lost.rate == UNLOADED_RATE
