"""Open-loop runs read as one row per configuration: medians over the repeats beside each run's
p99, not a line per run; the search's phases drawn as latency against the offered rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.latency import plot_curve, search_table, steady_rows, steady_table


def _steady(workers: int, p99: float, rollbacks: int = 0) -> dict[str, Any]:
    latency = {"p50": p99 / 4, "p99": p99, "p99.9": 2 * p99, "max": 3 * p99}
    return {
        "workers": workers,
        "rate": 2_000,
        "seconds": 30,
        "warmup": 3,
        "sent": 60_000,
        "missing": 0,
        "counted": 54_000,
        "rollbacks": rollbacks,
        "latency_ms": latency,
    }


def _phase(rate: int, p99: float, passed: bool = True) -> dict[str, Any]:
    latency = {"p50": p99 / 2, "p99": p99, "p99.9": p99, "max": p99}
    return {
        "rate": rate,
        "sent": 5 * rate,
        "behind_at_end": 0,
        "latency_ms": latency,
        "passed": passed,
    }


def _search(workers: int, sustainable: int, phases: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "workers": workers,
        "sustainable_tps": sustainable,
        "unloaded_p99_ms": 30.0,
        "phase_seconds": 5,
        "phases": phases,
    }


# three repeats of 1 and 2 workers, interleaved as the runs are
STEADY = [_steady(1, 109), _steady(2, 95), _steady(1, 47, 1), _steady(2, 70), _steady(1, 67)]


def test_the_repeats_of_a_configuration_are_one_row_of_medians_beside_each_runs_p99() -> None:
    one, two = steady_rows(STEADY)
    assert (one["workers"], one["runs"], two["workers"], two["runs"]) == (1, 3, 2, 2)
    assert one["latency_ms"] == {"p50": 67 / 4, "p99": 67, "p99.9": 134}
    assert one["p99_runs"] == [109, 47, 67]  # in the order they ran
    assert (one["counted"], one["rollbacks"]) == (3 * 54_000, 1)
    text = "\n".join(steady_table(STEADY))
    assert "the first 3 s of each run left out" in text
    assert "| 1 | 2,000 tx/s | 30 | 3 | 17 | 67 | 134 | 109, 47, 67 |" in text
    assert "| 2 | 2,000 tx/s | 30 | 2 | 21 | 82 | 165 | 95, 70 |" in text  # an even count
    assert text.count("| 1 | 2,000 tx/s") == 1


def test_results_of_before_the_warm_up_was_recorded_still_say_it_was_left_out() -> None:
    old = [{k: v for k, v in run.items() if k != "warmup"} for run in STEADY]
    assert "each run's warm-up left out" in "\n".join(steady_table(old))
    assert steady_table([]) == []


def test_the_searches_are_a_row_per_worker_count() -> None:
    runs = [_search(1, 1_012, []), _search(2, 675, []), _search(1, 1_518, [])]
    text = "\n".join(search_table(runs))
    assert "the rate grows by half each phase of 5 s" in text
    assert "| 1 | 2 | **1,265** | 1,012, 1,518 | 30 | 0 |" in text
    assert "| 2 | 1 | **675** | 675 | 30 | 0 |" in text
    assert search_table([]) == []


def test_the_search_phases_are_drawn_as_latency_against_the_offered_rate(tmp_path: Path) -> None:
    phases = [_phase(200, 30.0), _phase(300, 32.0), _phase(450, 900.0, passed=False)]
    runs = [_search(1, 300, phases), _search(2, 200, phases[:1])]
    assert plot_curve(tmp_path / "curve.png", runs, "ycsbt")
    assert (tmp_path / "curve.png").stat().st_size > 0
    assert not plot_curve(tmp_path / "none.png", [_search(1, 0, [])], "ycsbt")
    assert not (tmp_path / "none.png").exists()
