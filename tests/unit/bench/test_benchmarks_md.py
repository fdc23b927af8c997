"""BENCHMARKS.md says what each run measured, beside its baselines and its anchor, per core."""

from __future__ import annotations

from typing import Any

from bench.benchmarks_md import render

MACHINE = {
    "cpu_model": "Some CPU",
    "usable_cpus": 2,
    "memory_gb": 24.0,
    "kernel": "6.1",
    "versions": {"python": "3.11.7"},
    "commit": "0123456789abcdef",
    "date": "2026-11-26T16:00:00+00:00",
}


def _report(workload: str, tps: float, per_core: float | None) -> dict[str, Any]:
    return {
        "workload": workload,
        "title": workload,
        "parameters": {"zipf": 0.99},
        "description": f"what {workload} does",
        "anchor": f"{workload}'s paper: a figure",
        "anchor_per_core": per_core,
        "transactions": 1_000,
        "repeats": 3,
        "machine": MACHINE,
        "results": [
            {
                "workers": 1,
                "tps": tps,
                "cpu_us_per_tx": {"worker0": 20.0},
                "ratio_to": {"plain Python": 0.25},
            },
        ],
        "baselines": [
            {"baseline": "plain Python", "tps": 4 * tps, "cpu_us_per_tx": {"baseline": 3.0}},
            {
                "baseline": "exactly-once pipe",
                "unit": "records",
                "tps": 9 * tps,
                "cpu_us_per_tx": {"baseline": 2.0},
            },
        ],
        "search": [{"workers": 1, "sustainable_tps": 3_000, "unloaded_p99_ms": 40.0, "phases": []}],
    }


def test_each_workload_has_its_section_with_baselines_anchor_and_per_core_figure() -> None:
    text = render(
        [_report("ycsbt", 10_000.0, 7_758.5), _report("tstream-gs", 5_000.0, None)],
        "epochal bench all",
        {"ycsbt"},
    )
    ycsbt, gs = text.split("## ycsbt")[1].split("## tstream-gs")
    assert "commit `0123456789ab`" in text and "Some CPU, 2 usable cores" in text
    assert "| epochal, 1 worker(s), default cluster | 10,000 | 5,000 | 0.25x | - |" in ycsbt
    assert "| exactly-once pipe | 90,000 records/s | 45,000 |" in ycsbt
    assert "**Anchor:** ycsbt's paper: a figure" in ycsbt
    assert "against the anchor's 7,758: 0.64x" in ycsbt  # 10,000 / 2 cores / 7,758.5
    assert "Sustainable throughput, 1 worker(s): **3,000 tx/s**" in ycsbt
    assert "![ycsbt](bench/plots/ycsbt.png)" in ycsbt
    assert "Per core: epochal" not in gs and "bench/plots" not in gs
