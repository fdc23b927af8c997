"""BENCHMARKS.md says what each run measured, beside its baselines and its anchor, per core."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.benchmarks_md import render, write

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
    # 10,000 / 2 cores / 7,758.5; each worker count its own (on one, nothing crosses workers)
    assert "against the anchor's 7,758: epochal 5,000 on 1 worker(s) (0.64x)." in ycsbt
    assert "| 1 | 1 | **3,000** | 3,000 | 40 | 0 |" in ycsbt  # the search, a row per worker count
    assert "![ycsbt](bench/plots/ycsbt.png)" in ycsbt
    assert "Per core (" not in gs and "bench/plots" not in gs


def _measure(kind: str, result: dict[str, Any]) -> dict[str, Any]:
    """A report of a benchmark with flags of its own, as ``bench.cli.run_measure`` makes it."""
    command = f"epochal bench {kind} --flags"
    return {"kind": kind, "title": kind, "command": command, "exit_code": 0, "result": result}


def _section(text: str, heading: str) -> str:
    """The part of ``text`` under ``## heading``, up to the next section."""
    return text.split(f"## {heading}")[1].split("\n## ", maxsplit=1)[0]


def _cell(level: str, keys: int, in_flight: int, qps: float, p99: float) -> dict[str, Any]:
    latency = {"p50": p99 / 4, "p99": p99, "p99.9": 2 * p99, "max": 3 * p99}
    return {
        "level": level,
        "keys": keys,
        "in_flight": in_flight,
        "qps": qps,
        "queries": qps,
        "seconds": 1.0,
        "keys_per_s": qps * keys,
        "latency_ms": latency,
        "errors": 0,
        "missing": 0,
    }


def _window(tps: float, p99: float, started_ms: float = 0.0) -> dict[str, Any]:
    return {
        "tps": tps,
        "latency_ms": {"p50": p99 / 2, "p99": p99},
        "cpu": {"workers": 0.4},
        "started_ms": started_ms,
        "ended_ms": started_ms + 1_000,
    }


BANK: dict[str, Any] = {
    "bench": "bank",
    "results": [
        {
            "workers": w,
            "tps": tps,
            "rollbacks": 0,
            "transfers": 200_000,
            "cpu_us_per_tx": {"worker0": 20.0, "sequencer": 8.0},
        }
        for w, tps in ((1, 30_000.0), (2, 25_000.0))
    ],
    "baselines": [
        {
            "baseline": "plain bank",
            "unit": "transfers",
            "tps": 150_000.0,
            "rollbacks": 0,
            "cpu_us_per_tx": {"baseline": 4.0, "broker": 2.0},
        },
        {
            "baseline": "exactly-once pipe",
            "unit": "records",
            "tps": 300_000.0,
            "rollbacks": 0,
            "cpu_us_per_tx": {"baseline": 1.3, "broker": 1.0},
        },
    ],
    "steady": [],
}
QUERIES = {
    "bench": "queries",
    "args": {"in_flight": [32, 1], "levels": ["live", "snapshot"], "keys": [1, 10]},
    "rate": 3_000,
    "peak": {"tps": 6_000.0, "query": None},
    "peak_with_queries": {
        "tps": 5_500.0,
        "query": {"level": "committed", "keys": 1, "in_flight": 32, "qps": 2_004.0},
    },
    "idle": [
        _cell("live", 1, 32, 20_761.0, 4.9),
        _cell("live", 1, 1, 5_413.0, 1.14),
        _cell("snapshot", 10, 32, 601.0, 99.0),
        _cell("snapshot", 10, 1, 412.0, 5.79),
    ],
    "load": [{**_cell("snapshot", 10, 1, 138.0, 31.62), "engine": _window(2_900.0, 640.0)}],
    "engine_without_queries": [_window(3_100.0, 466.0), _window(3_050.0, 188.0)],
}
SNAPSHOTS = {
    "bench": "snapshots",
    "repeats": 3,
    "results": [
        {
            "actors": 1_000_000,
            "changed": 0.01,
            "write_s": 0.0421,
            "commit_s": 0.318,
            "restore_s": 1.234,
            "change_bytes": 353_500,
            "state_bytes": 69_791_000,
            "base": {"write_s": 23.1, "commit_s": 5.36},
        },
    ],
}
RESTART = {
    "bench": "restart",
    "restart": [],
    "kill": {
        "rate": 5_000,
        "workers": 2,
        "rollback_s": 0.17,
        "first_output_s": 2.94,
        "fresh_input_s": 7.14,
        "recovered_s": 10.96,
        "replayed_records": 190,
        "runs": [
            {
                "rollback_s": 0.17,
                "first_output_s": 2.94,
                "fresh_input_s": None,
                "recovered_s": 10.96,
            }
        ],
    },
}
RECOVERY = {
    "bench": "recover",
    "args": {"transactions": 1_000_000, "accounts": 100_000, "branches": 1000, "per_epoch": 5000},
    "digests_agree": True,
    "results": [
        {"how": "in-engine serial", "tps": 36_523.0, "seconds": 27.4, "seconds_runs": [27.4]},
        {"how": "Spark local[2]", "tps": 7_028.0, "seconds": 142.3, "seconds_runs": [142.3]},
    ],
}


def _measures_text(*reports: dict[str, Any], plotted: set[str] | None = None) -> str:
    workload = _report("ycsbt", 10_000.0, None)
    return render([workload, *reports], "epochal bench all", plotted or set())


def test_the_bank_shows_its_slowdown_for_transactions_beside_tspoons_7x() -> None:
    text = _measures_text(_measure("bank", BANK), plotted={"bank"})
    bank = _section(text, "bank (TSpoon's transfers, on the example's 10,000 accounts)")
    assert text.index("## ycsbt") < text.index("## bank")
    assert "Run: `epochal bench bank --flags`." in bank
    assert "| epochal, 1 worker(s), default cluster | 30,000 | 15,000 | 5.0x | 0 |" in bank
    assert "| epochal, 2 worker(s), default cluster | 25,000 | 12,500 | 6.0x |" in bank
    assert "| exactly-once pipe | 300,000 records/s | 150,000 | - |" in bank
    assert "uniform, PL4 (serializable)" in bank and "about **7x**" in bank
    assert "5.0x on 1 worker(s), 6.0x on 2 worker(s), against TSpoon's 7x" in bank
    assert "![bank](bench/plots/bank.png)" in bank


def _role(after: float, end: float, slope: float | None, flat: bool | None) -> dict[str, Any]:
    growth = None if slope is None else slope * 9
    return {
        "after_warmup_mb": after,
        "end_mb": end,
        "peak_mb": max(after, end) + 5,
        "slope_mb_per_m": slope,
        "growth_mb": growth,
        "flat": flat,
    }


LONG = {
    "transfers": 10_000_000,
    "workers": 2,
    "tps": 27_777.7,
    "seconds": 360.0,
    "egress": 10_000_000,
    "rollbacks": 0,
    "generation": 1,
    "conservation": {
        "holds": True,
        "deposits": 10_000_000,
        "total": 10_000_000,
        "accounts": 10_000,
        "lowest": 0,
    },
    "warmup_transfers": 1_000_000,
    "flat_mb": 20.0,
    "memory": {
        "broker": _role(420, 610, 21.0, None),
        "sequencer": _role(110, 112, 0.2, True),
        "worker0": _role(240, 300, 6.5, False),
    },
    "flat": False,
}


def test_the_long_run_shows_rollbacks_money_and_each_process_memory_against_its_bound() -> None:
    text = _measures_text(_measure("long", LONG), plotted={"long"})
    long = _section(text, "long run (a backlog of 10 million transfers: rollbacks and memory)")
    assert "**27,778 transfers/s** over 360 s, 10,000,000 egress records" in long
    assert "Rollbacks: **0** (generation 1 at the end)" in long
    assert "for 10,000,000 deposited, lowest 0: conserved" in long
    assert "the warm-up is the first 1,000,000 transfers" in long
    assert "grows less than 20 MB (over at least 1,000,000 transfers)" in long
    assert "| broker | 420 | 610 | 615 | +21.00 | +189.0 | not judged (Kafka's JVM) |" in long
    assert "| sequencer | 110 | 112 | 117 | +0.20 | +1.8 | yes |" in long
    assert "| worker0 | 240 | 300 | 305 | +6.50 | +58.5 | **no** |" in long
    assert "Memory: **not flat**." in long and "![long](bench/plots/long.png)" in long
    lost = {**LONG, "conservation": {"holds": False, "deposits": 1, "why": "no snapshot"}}
    assert "Money: not checked: no snapshot." in _measures_text(_measure("long", lost))


def test_queries_show_each_level_and_keys_idle_and_loaded_and_the_engine_beside_anchors() -> None:
    queries = _section(_measures_text(_measure("queries", QUERIES)), "queries")
    assert "| live | 1 | 20,761 | 0.28 / 1.14 | - | - |" in queries  # q/s at 32, latency at 1
    assert "| snapshot | 10 | 601 | 1.45 / 5.79 | - | 7.91 / 31.62 |" in queries
    assert queries.index("| live |") < queries.index("| snapshot |")
    assert "| peak (backlog drain) | committed, 1 key(s), 2,004 q/s | 5,500 | - |" in queries
    assert "| fed 3,000/s, queries running | snapshot, 138 q/s | 2,900 | 320 / 640 |" in queries
    assert "**53,900 point queries/s**" in queries and "idle: 20,761 q/s (live)" in queries
    assert "**at most 8 ms**" in queries
    assert "640 ms with SNAPSHOT queries running; 466 ms before any query, 188 ms" in queries
    assert "bench/plots" not in queries


def test_snapshots_show_time_and_size_and_point_to_the_banks_cost_beside_s_query() -> None:
    snapshots = _section(_measures_text(_measure("snapshots", SNAPSHOTS)), "snapshots")
    assert "| 1,000,000 | 1% | 0.042 | 0.318 | 1.234 | 0.4 | 69.8 | 23.10 / 5.36 |" in snapshots
    assert "medians of 3" in snapshots
    assert "**5 ms**" in snapshots and "in the bank's section" in snapshots


def test_restart_shows_each_step_from_the_kill_beside_styx() -> None:
    restart = _section(_measures_text(_measure("restart", RESTART)), "restart")
    assert "while 5,000 transfers/s flow" in restart and "median of 1" in restart
    assert "| the new generation's first output | 2.94 | 2.94 |" in restart
    assert "| the first output of an input produced after the kill | 7.14 | - |" in restart
    assert "Records replayed (median, the most of any worker): 190." in restart
    assert "Styx: about **2.5 s**" in restart and "outputs again after 2.94 s" in restart


def test_recovery_shows_replay_rates_and_says_no_anchor_is_published() -> None:
    text = _measures_text(_measure("restart", RESTART), _measure("recovery", RECOVERY))
    recovery = _section(text, "recovery")
    assert text.index("## restart") < text.index("## recovery")
    assert "command log of 1,000,000 transfers" in recovery
    assert "| in-engine serial | 36,523 | 27.4 | 27.4 |" in recovery
    assert "| Spark local[2] | 7,028 | 142.3 | 142.3 |" in recovery
    assert "digests: all equal" in recovery
    assert "**Anchor:** none published for a replay rate" in recovery


def test_a_run_that_failed_or_exited_badly_says_so_in_its_section() -> None:
    failed = {
        "kind": "queries",
        "title": "queries",
        "command": "epochal bench queries",
        "error": "the queries overlapped the drain",
    }
    differ = {**_measure("recovery", {**RECOVERY, "digests_agree": False}), "exit_code": 1}
    text = _measures_text(failed, differ)
    assert "The run did not complete: the queries overlapped the drain" in _section(text, "queries")
    recovery = _section(text, "recovery")
    assert "exited with status 1" in recovery and "digests: **differ**" in recovery


def test_the_leaderboard_sets_its_drain_against_its_client_ordered_run_as_s_store_did() -> None:
    report = _report("leaderboard", 18_000.0, None)
    report["results"].append({**report["results"][0], "workers": 2, "tps": 11_000.0})
    report["client_ordered"] = {
        "workers": 1,
        "votes": 500,
        "votes_per_s": 40.0,
        "latency_ms": {"p50": 24.6, "p99": 41.2, "p99.9": 50.0, "max": 60.0},
        "anchor_tps": {"S-Store": 2_200, "client-ordered H-Store": 210},
    }
    section = render([report, _report("ycsbt", 10_000.0, None)], "epochal bench all", set())
    leaderboard, ycsbt = section.split("## leaderboard")[1].split("## ycsbt")
    assert (
        "Client-ordered, 1 worker(s): one client sends each vote as its own client transaction "
        "(`Client.submit`) and waits for its outcome: 40 votes/s over 500 votes, p50 25 ms, "
        "p99 41 ms per vote." in leaderboard
    )
    assert "The drain, 18,000 tx/s, is 450.0x that;" in leaderboard  # the 1-worker drain's
    assert "S-Store's 2,200 batches/s were 10.5x client-ordered H-Store's 210." in leaderboard
    assert leaderboard.index("Client-ordered") < leaderboard.index("**Anchor:**")
    assert "Client-ordered" not in ycsbt


def test_a_drain_too_short_to_time_shows_no_rate_ratio_or_per_core_figure() -> None:
    report = _report("ycsbt", 85_000.0, 7_758.5)
    report["results"][0] |= {"timed": False, "seconds": 0.02}
    text = render([report], "epochal bench all", set())
    assert "| epochal, 1 worker(s), default cluster | untimed (0.02 s) | - | - | - |" in text
    assert "85,000" not in text and "Per core (" not in text


def test_the_plots_are_copied_beside_it_and_only_those_copied_are_shown(tmp_path: Path) -> None:
    bars, curve = tmp_path / "ycsbt-1.png", tmp_path / "ycsbt-1-latency.png"
    bars.write_bytes(b"png")
    curve.write_bytes(b"png")
    searched = {**_report("ycsbt", 10_000.0, None), "png": str(bars), "curve_png": str(curve)}
    gone = {**_report("tstream-gs", 5_000.0, None), "png": str(tmp_path / "gone.png")}
    text = write([searched, gone], tmp_path, "epochal bench all").read_text()
    assert (tmp_path / "bench/plots/ycsbt.png").read_bytes() == b"png"
    assert (tmp_path / "bench/plots/ycsbt-latency.png").read_bytes() == b"png"
    ycsbt, gs = _section(text, "ycsbt"), _section(text, "tstream-gs")
    assert "![ycsbt: latency against offered rate](bench/plots/ycsbt-latency.png)" in ycsbt
    assert ycsbt.index("| 1 | 1 | **3,000** |") < ycsbt.index("ycsbt-latency.png")
    assert "![ycsbt](bench/plots/ycsbt.png)" in ycsbt
    assert "bench/plots" not in gs  # its PNG is not there: no broken image


def _steady(workers: int, snapshots: str, p99: float) -> dict[str, Any]:
    latency = {"p50": p99 / 4, "p99": p99, "p99.9": p99 * 2, "max": p99 * 3}
    return {
        "workers": workers,
        "snapshots": snapshots,
        "rate": 12_500,
        "seconds": 30.0,
        "latency_ms": latency,
        "p99_runs": [p99, p99 + 1],
    }


def test_the_bank_sets_snapshots_against_none_in_throughput_and_p99_beside_s_query() -> None:
    """With each worker count drained and fed steadily with snapshots on (the default) and off,
    the section says what they cost: the share of throughput and the p99 they add."""
    off = [{**r, "snapshots": "off", "tps": r["tps"] * 1.25} for r in BANK["results"]]
    steady = [_steady(1, "default", 40.0), _steady(1, "off", 31.0), _steady(2, "default", 60.0)]
    steady[0]["cpu_us_per_tx"] = {"broker": 21.25, "worker0": 19.75}
    result = {**BANK, "accounts": 10_000, "results": [*BANK["results"], *off], "steady": steady}
    text = _measures_text(_measure("bank", result))
    bank = _section(text, "bank (TSpoon's transfers, on the example's 10,000 accounts)")
    assert "200,000 transfers over 10,000 accounts" in bank
    assert "| epochal, 1 worker(s), snapshots off | 37,500 |" in bank
    assert (
        "- 1 worker(s): 30,000 transfers/s with snapshots, 37,500 without: they cost 20% " in bank
    )
    assert "- 2 worker(s): 25,000 transfers/s with snapshots, 31,250 without: they cost 20%" in bank
    assert "Steady at 12,500 transfers/s for 30 s" in bank
    assert "| epochal, 1 worker(s), snapshots off | 8 | 31 | 62 | 31, 32 | - |" in bank
    assert "| 40, 41 | broker 21.2, worker0 19.8 |" in bank  # the CPU at that rate, by role
    assert "- 1 worker(s): snapshots add +9 ms at p99 (against snapshots add **5 ms**" in bank
    assert "2 worker(s): snapshots add" not in bank  # no steady run without them to set against
    assert "5.0x on 1 worker(s), 6.0x on 2 worker(s), against TSpoon's 7x" in bank  # defaults
    faster = [{**r, "snapshots": "off", "tps": r["tps"] * 0.8} for r in BANK["results"]]
    noisy = _measures_text(_measure("bank", {**BANK, "results": [*BANK["results"], *faster]}))
    assert "30,000 transfers/s with snapshots, 24,000 without (faster with them: within" in noisy


def test_a_workload_with_an_anchor_slowdown_says_its_own_beside_it() -> None:
    """TSpoon's 7x against Flink without transactions, beside plain Python's rate / epochal's."""
    report = {**_report("tspoon-bank", 10_000.0, None), "anchor_slowdown": 7.0}
    text = render([report, _report("ycsbt", 10_000.0, None)], "epochal bench all", set())
    tspoon, ycsbt = text.split("## tspoon-bank")[1].split("## ycsbt")
    line = "Slowdown for transactions (plain Python's rate / epochal's): 4.0x on 1 worker(s), "
    assert f"{line}against the anchor's 7x." in tspoon
    assert "Slowdown" not in ycsbt
