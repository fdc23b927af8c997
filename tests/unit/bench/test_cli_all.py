"""``epochal bench all``: a full run plans the benchmarks with flags of their own after the
workloads, with the flags their anchors need, and ``--quick`` runs none of them."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bench import cli, sweeps
from bench.workloads.base import Workload
from bench.workloads.tstream import GrepSum
from bench.workloads.ycsbt import YcsbT

FACTS = {"cpus": 2}


def test_a_full_run_plans_each_benchmark_with_the_flags_of_its_anchor() -> None:
    assert [(name, " ".join(argv)) for name, argv in cli.measures()] == [
        (
            "bank",
            "--accounts 10000 --transfers 200000 --workers 1 2 --repeats 3 "
            "--snapshots default off --rate half",
        ),
        ("long", "--transfers 10000000 --workers 2"),
        ("queries", ""),
        ("snapshots", ""),
        ("restart", "--parts kill --repeats 3"),
        ("recovery", "--transactions 1000000 --repeats 1"),
    ]
    assert {name for name, _ in cli.measures()} == set(cli.OWN_FLAGS)


def _stub_workloads(monkeypatch: pytest.MonkeyPatch) -> list[list[dict[str, Any]]]:
    """``all`` without draining anything: one workload report; what BENCHMARKS.md got."""

    def workloads(points: list[cli.Point], args: argparse.Namespace) -> list[dict[str, Any]]:
        results = [{"workers": w, "tps": 1_000.0 * w} for w in args.workers]
        report = {"title": "ycsbt", "transactions": 1, "repeats": 1, "machine": FACTS}
        return [{**report, "results": results, "baselines": []}]

    written: list[list[dict[str, Any]]] = []

    def write(reports: Sequence[dict[str, Any]], root: Path, command: str) -> Path:
        written.append(list(reports))
        return root / "BENCHMARKS.md"

    monkeypatch.setattr(cli, "_run_workloads", workloads)
    monkeypatch.setattr(cli.benchmarks_md, "write", write)
    return written


def test_all_runs_the_planned_benchmarks_after_the_workloads_into_benchmarks_md(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    written = _stub_workloads(monkeypatch)
    ran: list[tuple[str, list[str], Path]] = []

    def run_measure(name: str, argv: list[str], out: Path, facts: Any) -> dict[str, Any]:
        ran.append((name, argv, out))
        return {"kind": name, "exit_code": 0}

    def sweep(points: list[cli.Point], field: str, args: argparse.Namespace) -> dict[str, Any]:
        return {"kind": "sweep", "title": f"{points[0].workload.name} sweep {field}"}

    monkeypatch.setattr(cli, "run_measure", run_measure)
    monkeypatch.setattr(cli, "_sweep", sweep)
    assert cli.main(["all", "--out", str(tmp_path)]) == 0
    assert ran == [(name, argv, tmp_path) for name, argv in cli.measures()]
    (reports,) = written
    assert [r.get("kind", r.get("title")) for r in reports] == [
        "ycsbt",
        "scaling",  # of the workloads' own reports: no run of its own
        *["sweep"] * 6,
        *(name for name, _ in cli.measures()),
    ]
    assert reports[1]["rows"] == [
        {"title": "ycsbt", "tps": {"1": 1_000, "2": 2_000}, "plain": None}
    ]
    assert list(tmp_path.glob("scaling-*.json")) and Path(reports[1]["png"]).is_file()
    assert [r["title"] for r in reports[2:8]] == [
        "tstream-gs sweep zipf",
        "tstream-gs sweep read_ratio",
        "tstream-sl sweep multi_partition",
        "tstream-gs sweep multi_partition_length",
        "tstream-gs sweep epoch_records",
        "ycsbt sweep multi_partition",
    ]


def test_a_sweep_runs_each_point_once_on_a_smaller_backlog_with_the_plain_baseline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[argparse.Namespace] = []

    def workloads(points: list[cli.Point], args: argparse.Namespace) -> list[dict[str, Any]]:
        seen.append(args)
        return [
            {
                "workload": p.workload.name,
                "description": "",
                "parameters": p.parameters(),
                "transactions": args.transactions,
                "repeats": args.repeats,
                "machine": FACTS,
                "results": [{"workers": 1, "tps": 100.0 * (i + 1)}],
                "baselines": [],
            }
            for i, p in enumerate(points)
        ]

    monkeypatch.setattr(cli, "_run_workloads", workloads)
    (points, field), *_ = cli.sweep_plan()
    args = argparse.Namespace(
        transactions=200_000,
        repeats=3,
        rate="search",
        baselines=True,
        anchor_rates=True,
        anchor_search=True,
    )
    sweep = cli._sweep(points, field, argparse.Namespace(**vars(args), out=tmp_path))
    (used,) = seen
    assert (used.transactions, used.repeats, used.rate, used.anchor_rates) == (
        cli.SWEEP_TRANSACTIONS,
        1,
        None,
        False,
    )
    assert not used.anchor_search  # no curve per point either
    assert used.baselines and args.transactions == 200_000  # the caller's flags untouched
    assert [p["value"] for p in sweep["points"]] == [0.0, 0.3, 0.6, 0.9]
    assert [p["tps"]["epochal, 1 worker(s)"] for p in sweep["points"]] == [100, 200, 300, 400]
    assert list(tmp_path.glob("tstream-gs-sweep-zipf-*.json"))


def test_each_planned_sweep_varies_its_value_alone_and_says_what_it_is_in_words() -> None:
    """A sweep finds its value in each report's parameters; the multi-partition lengths stay
    within the 4 partitions of 2 workers (above, they mean nothing), and every transaction is
    multi-partition, so that the points differ."""
    plan = {
        (points[0].workload.name, field): [p.parameters() for p in points]
        for points, field in cli.sweep_plan()
    }
    assert list(plan) == [
        ("tstream-gs", "zipf"),
        ("tstream-gs", "read_ratio"),
        ("tstream-sl", "multi_partition"),
        ("tstream-gs", "multi_partition_length"),
        ("tstream-gs", "epoch_records"),
        ("ycsbt", "multi_partition"),  # Styx's 0, 25, 50 and 100 %
    ]
    for (_, field), points in plan.items():
        values = [p[field] for p in points]
        assert len(set(values)) == len(values) > 2, field
        rest = [{k: v for k, v in p.items() if k != field} for p in points]
        assert all(r == rest[0] for r in rest), field
        assert field in sweeps.SWEPT
    lengths = plan["tstream-gs", "multi_partition_length"]
    assert [p["multi_partition_length"] for p in lengths] == [2, 3, 4]
    assert {p["multi_partition"] for p in lengths} == {1.0}
    sizes = plan["tstream-gs", "epoch_records"]
    assert [p["epoch_records"] for p in sizes] == [100, 500, 2_000, 5_000]
    shares = plan["ycsbt", "multi_partition"]
    assert [p["multi_partition"] for p in shares] == [0.0, 0.25, 0.5, 1.0]
    assert "punctuation interval" in sweeps.SWEPT["epoch_records"][0]


def test_all_quick_runs_none_of_them_and_writes_no_benchmarks_md(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written = _stub_workloads(monkeypatch)

    def run_measure(*args: Any) -> dict[str, Any]:
        raise AssertionError(f"--quick ran {args[0]}")

    monkeypatch.setattr(cli, "run_measure", run_measure)
    assert cli.main(["all", "--quick"]) == 0
    assert written == []


def test_a_measure_runs_into_a_fresh_folder_and_its_json_and_png_are_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[list[str]] = []

    def snapshots(argv: list[str] | None) -> int:
        assert argv is not None
        seen.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        (out / "snapshots-1.json").write_text(json.dumps({"bench": "snapshots"}))
        (out / "snapshots-1.png").write_bytes(b"png")
        return 0

    monkeypatch.setitem(cli.OWN_FLAGS, "snapshots", snapshots)
    first = cli.run_measure("snapshots", ["--repeats", "1"], tmp_path, FACTS)
    second = cli.run_measure("snapshots", ["--repeats", "1"], tmp_path, FACTS)
    assert first["result"] == {"bench": "snapshots"} and first["exit_code"] == 0
    assert first["command"] == "epochal bench snapshots --repeats 1"
    assert first["kind"] == first["title"] == "snapshots" and first["machine"] == FACTS
    assert Path(first["png"]).parent.parent == tmp_path
    assert Path(first["png"]).parent != Path(second["png"]).parent  # a fresh folder each
    assert seen[0][:2] == ["--repeats", "1"] and seen[0][2] == "--out"


def test_a_measure_that_exits_with_a_message_is_reported_not_fatal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def queries(argv: list[str] | None) -> int:
        raise SystemExit("the queries overlapped the drain")

    monkeypatch.setitem(cli.OWN_FLAGS, "queries", queries)
    report = cli.run_measure("queries", [], tmp_path, FACTS)
    assert report["error"] == "the queries overlapped the drain" and "result" not in report


def _open_loop_args(**flags: Any) -> argparse.Namespace:
    defaults = {"rate": None, "repeats": 3, "anchor_rates": False, "anchor_search": False}
    return argparse.Namespace(**{**defaults, **flags})


def test_a_full_run_searches_the_defaults_of_a_workload_with_a_latency_anchor_once() -> None:
    full = _open_loop_args(anchor_rates=True, anchor_search=True)
    steady = [(repeat, "2000") for repeat in range(3)]  # YCSB-T's anchor: Styx at 2k TPS
    assert cli._open_loop_plan(YcsbT(), full) == [*steady, (3, "search")]
    assert cli._open_loop_plan(YcsbT(zipf=0.99), full) == steady  # not at the extremes
    assert cli._open_loop_plan(GrepSum(), full) == []  # no latency anchor
    searched = _open_loop_args(rate="search", anchor_rates=True, anchor_search=True)
    assert cli._open_loop_plan(YcsbT(), searched) == [(r, "search") for r in range(3)]
    assert cli._open_loop_plan(YcsbT(), _open_loop_args()) == []  # one workload, no --rate


def test_the_anchor_search_runs_each_worker_count_once_on_ports_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ports: list[tuple[str, int, int]] = []

    def steady_run(workload: Workload, bootstrap: str, setup: Any, **kw: Any) -> dict[str, Any]:
        ports.append(("steady", setup.workers, kw["port_base"]))
        return {"workers": setup.workers}

    def search(workload: Workload, bootstrap: str, setup: Any, **kw: Any) -> dict[str, Any]:
        ports.append(("search", setup.workers, kw["port_base"]))
        assert kw["phase_s"] == 5 and kw["max_phases"] == cli.MAX_PHASES
        return {"workers": setup.workers}

    monkeypatch.setattr(cli, "steady_run", steady_run)
    monkeypatch.setattr(cli, "search_sustainable", search)
    args = _open_loop_args(
        anchor_rates=True,
        anchor_search=True,
        repeats=2,
        workers=[1, 2],
        port_base=20_000,
        phase_seconds=5,
        seconds=30,
        warmup=3,
        seed=1,
        quick=False,
    )
    report = cli._open_loop(cli.Point(YcsbT()), args, "127.0.0.1:1")
    assert [kind for kind, *_ in ports] == ["steady"] * 4 + ["search"] * 2
    assert len({port for *_, port in ports}) == len(ports)
    assert [r["workers"] for r in report["search"]] == [1, 2]


def test_a_report_with_a_search_gets_its_latency_curve_beside_its_bars(tmp_path: Path) -> None:
    phases = [
        {"rate": rate, "latency_ms": {"p50": ms / 2, "p99": ms}, "passed": ms < 500}
        for rate, ms in ((200, 30.0), (300, 40.0), (450, 900.0))
    ]
    report = {
        "workload": "ycsbt",
        "title": "ycsbt",
        "results": [{"workers": 1, "tps": 1_000.0}],
        "baselines": [],
        "search": [{"workers": 1, "sustainable_tps": 300, "phases": phases}],
    }
    cli._save(report, tmp_path)
    assert Path(report["png"]).stat().st_size and Path(report["curve_png"]).stat().st_size
    assert report["curve_png"].endswith("-latency.png")
    saved = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert saved["curve_png"] == report["curve_png"]
