"""``epochal bench all``: a full run plans the benchmarks with flags of their own after the
workloads, with the flags their anchors need, and ``--quick`` runs none of them."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bench import cli
from bench.workloads.base import Workload

FACTS = {"cpus": 2}


def test_a_full_run_plans_each_benchmark_with_the_flags_of_its_anchor() -> None:
    assert [(name, " ".join(argv)) for name, argv in cli.measures()] == [
        ("bank", "--accounts 100000 --transfers 200000 --workers 1 2 --repeats 3"),
        ("long", "--transfers 10000000 --workers 2"),
        ("queries", ""),
        ("snapshots", ""),
        ("restart", "--parts kill --repeats 3"),
        ("recovery", "--transactions 1000000 --repeats 1"),
    ]
    assert {name for name, _ in cli.measures()} == set(cli.OWN_FLAGS)


def _stub_workloads(monkeypatch: pytest.MonkeyPatch) -> list[list[dict[str, Any]]]:
    """``all`` without draining anything: one workload report; what BENCHMARKS.md got."""

    def workloads(kinds: list[Workload], args: argparse.Namespace) -> list[dict[str, Any]]:
        return [{"title": "ycsbt", "machine": FACTS}]

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

    def sweep(points: list[Workload], field: str, args: argparse.Namespace) -> dict[str, Any]:
        return {"kind": "sweep", "title": f"{points[0].name} sweep {field}"}

    monkeypatch.setattr(cli, "run_measure", run_measure)
    monkeypatch.setattr(cli, "_sweep", sweep)
    assert cli.main(["all", "--out", str(tmp_path)]) == 0
    assert ran == [(name, argv, tmp_path) for name, argv in cli.measures()]
    (reports,) = written
    assert [r.get("kind", r.get("title")) for r in reports] == [
        "ycsbt",
        "sweep",
        "sweep",
        *(name for name, _ in cli.measures()),
    ]
    assert [r["title"] for r in reports[1:3]] == [
        "tstream-gs sweep zipf",
        "tstream-sl sweep multi_partition",
    ]


def test_a_sweep_runs_each_point_once_on_a_smaller_backlog_with_the_plain_baseline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[argparse.Namespace] = []

    def workloads(kinds: list[Workload], args: argparse.Namespace) -> list[dict[str, Any]]:
        seen.append(args)
        return [
            {
                "workload": k.name,
                "description": "",
                "parameters": k.parameters(),
                "transactions": args.transactions,
                "repeats": args.repeats,
                "machine": FACTS,
                "results": [{"workers": 1, "tps": 100.0 * (i + 1)}],
                "baselines": [],
            }
            for i, k in enumerate(kinds)
        ]

    monkeypatch.setattr(cli, "_run_workloads", workloads)
    ((points, field), _) = cli.sweep_plan()
    args = argparse.Namespace(
        transactions=200_000, repeats=3, rate="search", baselines=True, anchor_rates=True
    )
    sweep = cli._sweep(points, field, argparse.Namespace(**vars(args), out=tmp_path))
    (used,) = seen
    assert (used.transactions, used.repeats, used.rate, used.anchor_rates) == (
        50_000,
        1,
        None,
        False,
    )
    assert used.baselines and args.transactions == 200_000  # the caller's flags untouched
    assert [p["value"] for p in sweep["points"]] == [0.0, 0.3, 0.6, 0.9]
    assert [p["tps"]["epochal, 1 worker(s)"] for p in sweep["points"]] == [100, 200, 300, 400]
    assert list(tmp_path.glob("tstream-gs-sweep-zipf-*.json"))


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
