"""Scaling puts each workload's drain on 1 and 2 workers side by side, from the reports a run
already has, beside its plain baseline; a drain too short to time has no rate there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.benchmarks_md import render
from bench.scaling import plot, section, summary
from tests.unit.bench.test_benchmarks_md import MACHINE
from tests.unit.bench.test_benchmarks_md import _report as workload_report


def _report(title: str, one: float, two: float, plain: float) -> dict[str, Any]:
    return {
        "workload": title.split(maxsplit=1)[0],
        "title": title,
        "transactions": 200_000,
        "repeats": 3,
        "machine": MACHINE,
        "results": [{"workers": 1, "tps": one}, {"workers": 2, "tps": two}],
        "baselines": [
            {"baseline": "plain Python", "tps": plain},
            {"baseline": "exactly-once pipe", "unit": "records", "tps": 9e9},
        ],
    }


REPORTS = [
    _report("ycsbt", 49_209.0, 57_210.0, 159_148.0),
    _report("tstream-gs", 24_327.0, 9_406.0, 126_635.0),
    _report("ycsbt zipf=0.99", 55_308.0, 56_032.0, 159_052.0),
]


def test_each_workload_is_a_row_with_its_rate_per_worker_count_and_their_ratio() -> None:
    scaling = summary([*REPORTS, {"kind": "sweep", "title": "tstream-gs sweep zipf"}])
    assert scaling["workers"] == [1, 2]
    assert [row["title"] for row in scaling["rows"]] == ["ycsbt", "tstream-gs", "ycsbt zipf=0.99"]
    text = "\n".join(section(scaling, plotted=True))
    assert text.startswith("## Scaling: 1 → 2 workers")
    assert "| workload | 1 worker(s), tx/s | 2 worker(s), tx/s | 2w/1w | plain Python |" in text
    assert "| ycsbt | 49,209 | 57,210 | 1.16x | 159,148 |" in text
    assert "| tstream-gs | 24,327 | 9,406 | 0.39x | 126,635 |" in text
    assert "9,000,000,000" not in text  # the pipe is no transactions' rate
    assert "![scaling](bench/plots/scaling.png)" in text


def test_a_drain_too_short_to_time_has_no_rate_or_ratio_and_is_not_plotted(
    tmp_path: Path,
) -> None:
    untimed = _report("tstream-tp", 825_768.0, 40_000.0, 110_000.0)
    untimed["results"][0] |= {"timed": False, "seconds": 0.01}
    scaling = summary([*REPORTS, untimed])
    assert scaling["rows"][-1]["tps"] == {"1": None, "2": 40_000.0}
    assert "| tstream-tp | - | 40,000 | - | 110,000 |" in "\n".join(section(scaling, False))
    assert plot(tmp_path / "scaling.png", scaling)
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_benchmarks_md_gives_scaling_its_section_after_the_workloads() -> None:
    ycsbt = workload_report("ycsbt", 10_000.0, None)
    ycsbt["results"].append({**ycsbt["results"][0], "workers": 2, "tps": 12_000.0})
    text = render([ycsbt, summary([ycsbt])], "epochal bench all", {"scaling"})
    assert text.index("## ycsbt") < text.index("## Scaling: 1 → 2 workers")
    assert "| ycsbt | 10,000 | 12,000 | 1.20x | 40,000 |" in text
    assert "![scaling](bench/plots/scaling.png)" in text
