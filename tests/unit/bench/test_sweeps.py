"""A sweep puts one workload's runs side by side against the swept parameter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.sweeps import plot_lines, section, summary


def _report(zipf: float, one: float, two: float, plain: float) -> dict[str, Any]:
    return {
        "workload": "tstream-gs",
        "description": "grep and sum",
        "parameters": {"rows": 10_000, "zipf": zipf},
        "transactions": 50_000,
        "repeats": 1,
        "machine": {"cpus": 2},
        "results": [{"workers": 1, "tps": one}, {"workers": 2, "tps": two}],
        "baselines": [
            {"baseline": "plain Python", "tps": plain},
            {"baseline": "exactly-once pipe", "unit": "records", "tps": 9e9},
        ],
    }


def test_each_value_is_a_row_and_each_configuration_a_column(tmp_path: Path) -> None:
    sweep = summary(
        [_report(0.0, 30_000, 20_000, 90_000), _report(0.9, 10_000, 5_000, 80_000)], "zipf"
    )
    assert sweep["fixed"] == {"rows": 10_000} and [p["value"] for p in sweep["points"]] == [0, 0.9]
    text = "\n".join(section(sweep, plotted=True))
    assert "| zipf | epochal, 1 worker(s) | epochal, 2 worker(s) | plain Python |" in text
    assert "| 0.0 | 30,000 | 20,000 | 90,000 |" in text
    assert "| 0.9 | 10,000 | 5,000 | 80,000 |" in text
    assert "9,000,000,000" not in text  # the pipe counts records, not transactions
    assert "![tstream-gs sweep zipf](bench/plots/tstream-gs-sweep-zipf.png)" in text
    assert plot_lines(tmp_path / "sweep.png", sweep) and (tmp_path / "sweep.png").stat().st_size


def test_benchmarks_md_gives_a_sweep_its_section() -> None:
    from bench.benchmarks_md import render
    from tests.unit.bench.test_benchmarks_md import MACHINE

    sweep = {**summary([_report(0.0, 3.0, 2.0, 9.0)], "zipf"), "machine": MACHINE}
    text = render([sweep], "epochal bench all", set())
    assert "## tstream-gs: throughput against skew (Zipf theta)" in text
    assert "| 0.0 | 3 | 2 | 9 |" in text


def test_a_point_too_short_to_time_has_no_rate() -> None:
    report = _report(0.0, 825_768.0, 2.0, 9.0)
    report["results"][0] |= {"timed": False, "seconds": 0.01}
    (point,) = summary([report], "zipf")["points"]
    assert point["tps"]["epochal, 1 worker(s)"] is None
    assert "| 0.0 | - | 2 | 9 |" in "\n".join(section(summary([report], "zipf"), plotted=False))
